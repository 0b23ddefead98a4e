"""`criu-gpushare doctor`: every check reports pass/fail with a fix; JSON for scripts."""
import json
import os
import subprocess
import sys

import pytest

CLI = [sys.executable, "-m", "criu_gpushare.cli"]
CHECKS = {"driver", "checkpoint-api", "gpus", "criu", "pycriu", "shim", "store"}


def doctor(*args, env=None):
    return subprocess.run(CLI + ["doctor", *args], capture_output=True, text=True, env=env, timeout=120)


@pytest.mark.skipif(os.path.exists("/proc/driver/nvidia"), reason="this machine has an NVIDIA driver")
def test_without_a_gpu_doctor_says_so_and_fails():
    r = doctor("--json", env={**os.environ, "LD_LIBRARY_PATH": "/nonexistent"})
    assert r.returncode == 10
    report = json.loads(r.stdout)
    by_name = {c["name"]: c for c in report["checks"]}
    assert report["ok"] is False and CHECKS <= set(by_name)
    assert by_name["driver"]["status"] == "fail" and "NVIDIA driver" in by_name["driver"]["fix"]
    assert by_name["shim"]["status"] == "pass"
    for c in report["checks"]:
        assert c["status"] in ("pass", "fail", "warn")
        assert c["status"] == "pass" or c["fix"], c


def test_text_output_lists_each_check_with_its_fix():
    r = doctor()
    lines = r.stdout.splitlines()
    for name in CHECKS:
        assert any(line.split()[1:2] == [name] for line in lines if line[:4] in ("PASS", "FAIL", "WARN")), name
    if r.returncode:
        assert "fix:" in r.stdout and "check(s) failed" in r.stderr


def test_doctor_says_whether_criu_cuda_plugin_is_installed(tmp_path, monkeypatch):
    from criu_gpushare.cli.doctor import check_cuda_plugin
    monkeypatch.setenv("CRIU_LIBS_DIR", str(tmp_path))
    assert check_cuda_plugin().status == "pass"
    (tmp_path / "cuda_plugin.so").write_bytes(b"")
    c = check_cuda_plugin()
    assert c.status == "warn" and "cuda_plugin.so" in c.detail and "libdir" in c.fix
