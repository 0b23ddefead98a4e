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


def test_doctor_says_what_a_hook_user_must_add_for_link_remap(tmp_path):
    from criu_gpushare.cli.doctor import check_link_remap
    conf = tmp_path / "runc.conf"
    assert check_link_remap([str(conf)]).status == "pass"  # no file: nothing configured
    conf.write_text("action-script /usr/local/bin/criu-gpushare-hook\n")
    c = check_link_remap([str(conf)])
    assert c.status == "warn" and str(conf) in c.fix and "link-remap" in c.fix
    conf.write_text("action-script /usr/local/bin/criu-gpushare-hook\n# comment\nlink-remap\n")
    assert check_link_remap([str(conf)]).status == "pass"


def test_doctor_fails_a_configured_hook_that_criu_cannot_run(tmp_path):
    """CRIU fails every dump and restore whose action script it cannot run: a path that is not
    there, or a launcher without its Python program beside it or on PATH."""
    import os
    import shutil
    from criu_gpushare.cli.doctor import check_hook_installed
    conf = tmp_path / "default.conf"
    assert check_hook_installed([str(conf)]).status == "pass"  # no file: nothing configured
    conf.write_text(f"action-script {tmp_path}/bin/criu-gpushare-hook\nlink-remap\n")
    c = check_hook_installed([str(conf)])
    assert c.status == "fail" and "not an executable file" in c.detail and "command -v" in c.fix, c
    launcher = tmp_path / "bin" / "criu-gpushare-hook"
    launcher.parent.mkdir()
    shutil.copy(os.path.join(os.path.dirname(__file__), "..", "..", "hooks", "criu-gpushare-hook"), launcher)
    launcher.chmod(0o755)
    nowhere = str(tmp_path / "empty")  # a PATH without the package's own program
    c = check_hook_installed([str(conf)], search_path=nowhere)
    assert c.status == "fail" and "criu-gpushare-hook-actions" in c.detail, c
    actions = tmp_path / "bin" / "criu-gpushare-hook-actions"
    actions.write_text("#!/bin/sh\n")
    actions.chmod(0o755)
    c = check_hook_installed([str(conf)], search_path=nowhere)
    assert c.status == "pass" and str(launcher) in c.detail, c


def test_the_shipped_criu_configurations_turn_link_remap_on():
    import os
    from criu_gpushare.cli.doctor import check_link_remap
    hooks = os.path.join(os.path.dirname(__file__), "..", "..", "hooks")
    files = [os.path.join(hooks, n) for n in ("runc.conf", "default.conf")]
    c = check_link_remap(files)
    assert c.status == "pass" and "runc.conf" in c.detail and "default.conf" in c.detail


def test_doctor_reaches_an_object_store_and_says_whether_it_exists_yet(s3_env, s3_store_url, monkeypatch):
    from criu_gpushare.cli.doctor import check_store
    from criu_gpushare.store import open_store
    monkeypatch.setenv("CRIU_GPUSHARE_STORE", s3_store_url)
    c = check_store()
    assert c.status == "pass" and s3_store_url in c.detail and "created by the first dump" in c.detail, c
    open_store(s3_store_url, create=True).close()
    c = check_store()
    assert c.status == "pass" and "(reachable)" in c.detail, c


@pytest.mark.parametrize("problem", ["no bucket", "bad secret"])
def test_doctor_names_what_is_wrong_with_an_object_store(s3_env, s3_store_url, monkeypatch, problem):
    from criu_gpushare.cli.doctor import check_store
    url = s3_store_url
    if problem == "no bucket":
        url = "s3://no-such-bucket-for-doctor/ckpt"
    else:
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret")
    monkeypatch.setenv("CRIU_GPUSHARE_STORE", url)
    c = check_store()
    assert c.status == "fail", c
    assert ("no such bucket" if problem == "no bucket" else "access denied") in c.detail, c
    assert "AWS_ENDPOINT_URL" in c.fix and "wrong-secret" not in c.detail + c.fix


def _mountinfo(tmp_path, *mounts):
    """A mountinfo file with these (mount point, fs type, super options), in order."""
    lines = [f"{20 + i} 1 0:{i} / {point} rw,relatime - {fstype} {fstype} {options}"
             for i, (point, fstype, options) in enumerate(mounts)]
    path = tmp_path / "mountinfo"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def _shmem(tmp_path, chosen):
    path = tmp_path / "shmem_enabled"
    path.write_text(" ".join(f"[{w}]" if w == chosen else w
                             for w in ("always", "within_size", "advise", "never", "deny", "force")) + "\n")
    return str(path)


def test_doctor_says_when_a_tmpfs_store_has_no_huge_pages(tmp_path):
    """A store on a tmpfs of 4 KiB pages: a warning with the mount that fixes it; on huge pages
    (the mount's huge=always, or shmem_enabled's [force]) a pass; [deny] overrides the mount; a
    store anywhere else gets no such line. The mount is the deepest that holds the store, a
    later mount over the same point wins, and mountinfo's octal escapes are read."""
    from criu_gpushare.cli.doctor import check_store_pages
    store = tmp_path / "my store" / "chunks"  # created on first use: its parent is what counts
    store.parent.mkdir()
    here = str(store.parent)
    escaped = here.replace(" ", "\\040")
    never = _shmem(tmp_path, "never")
    small = _mountinfo(tmp_path, ("/", "ext4", "rw"), (escaped, "tmpfs", "rw,size=64G"))
    (c,) = check_store_pages(str(store), small, never)
    assert c.status == "warn" and "4 KiB pages" in c.detail and here in c.detail
    assert "huge=always" in c.fix and "mount -t tmpfs" in c.fix
    huge = _mountinfo(tmp_path, ("/", "ext4", "rw"), (escaped, "tmpfs", "rw,size=64G"),
                      (escaped, "tmpfs", "rw,size=64G,huge=always"))
    assert [c.status for c in check_store_pages(str(store), huge, never)] == ["pass"]
    assert [c.status for c in check_store_pages(str(store), small, _shmem(tmp_path, "force"))] == ["pass"]
    assert [c.status for c in check_store_pages(str(store), huge, _shmem(tmp_path, "deny"))] == ["warn"]
    assert check_store_pages(str(store), _mountinfo(tmp_path, ("/", "ext4", "rw")), never) == []
    nested = _mountinfo(tmp_path, ("/", "tmpfs", "rw"), (escaped, "xfs", "rw"))
    assert check_store_pages(str(store), nested, never) == []
    assert check_store_pages("s3://bucket/prefix", small, never) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_doctor_reads_this_machines_mounts_for_the_store(tmp_path):
    """Against /proc/self/mountinfo: a tmpfs mounted with huge=always passes (unless this kernel
    denies huge pages to every tmpfs), one without them is warned about (unless it forces them)."""
    from criu_gpushare.cli.doctor import check_store_pages
    from criu_gpushare.store.memfs import SHMEM_ENABLED
    try:
        chosen = open(SHMEM_ENABLED).read().split("[")[1].split("]")[0]
    except (OSError, IndexError):
        chosen = "never"
    for options, want in (("huge=always", "warn" if chosen == "deny" else "pass"),
                          ("huge=never", "pass" if chosen == "force" else "warn")):
        point = tmp_path / options
        point.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size=16m,{options}", "tmpfs", str(point)], check=True)
        try:
            assert [c.status for c in check_store_pages(str(point / "store"))] == [want], options
        finally:
            subprocess.run(["umount", str(point)], check=True)
