"""`criu-gpushare-hook` as CRIU runs it: no arguments, the action in CRTOOLS_SCRIPT_ACTION."""
import os
import subprocess
import sys
import time

import pytest

HOOK = [sys.executable, "-m", "criu_gpushare.hook.main"]


def run_hook(action, **env):
    full = {"PATH": os.environ["PATH"], "CRTOOLS_SCRIPT_ACTION": action, **env}
    return subprocess.run(HOOK, env=full, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60)


@pytest.mark.parametrize("action", ["network-lock", "post-dump", "pre-restore", "setup-namespaces",
                                    "post-restore", "pre-resume", "post-resume", "status-ready",
                                    "query-ext-files", "some-future-action"])
def test_actions_it_does_not_handle_let_criu_proceed(action):
    r = run_hook(action)
    assert r.returncode == 0, r.stderr


def test_pre_dump_of_a_tree_without_cuda_proceeds():
    with subprocess.Popen(["sleep", "30"]) as p:
        try:
            r = run_hook("pre-dump", CRTOOLS_INIT_PID=str(p.pid))
        finally:
            p.kill()
    assert r.returncode == 0, r.stderr


@pytest.fixture
def process_with_libcuda(tmp_path):
    """A child (under a parent shell) that has a library named libcuda.so.1 loaded."""
    src = tmp_path / "empty.c"
    src.write_text("int fake_cuda_marker(void) { return 1; }\n")
    lib = tmp_path / "libcuda.so.1"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    code = f"import ctypes, time; ctypes.CDLL({str(lib)!r}); print('ready', flush=True); time.sleep(60)"
    parent = subprocess.Popen(["sh", "-c", f'{sys.executable} -c "{code}"; true'], stdout=subprocess.PIPE, text=True)
    assert parent.stdout.readline().strip() == "ready"
    yield parent
    parent.kill()
    subprocess.run(["pkill", "-f", str(lib)], check=False)
    parent.wait()


def test_pre_dump_refuses_a_tree_with_cuda_and_names_the_process(process_with_libcuda):
    r = run_hook("pre-dump", CRTOOLS_INIT_PID=str(process_with_libcuda.pid))
    assert r.returncode != 0
    assert "use CUDA" in r.stderr and str(process_with_libcuda.pid) in r.stderr


def test_pre_dump_of_an_unknown_pid_fails_clearly():
    gone = subprocess.Popen(["true"])
    gone.wait()
    time.sleep(0.1)
    r = run_hook("pre-dump", CRTOOLS_INIT_PID=str(gone.pid))
    assert r.returncode != 0 and "no such process" in r.stderr


def test_pre_dump_without_init_pid_fails_clearly():
    r = run_hook("pre-dump")
    assert r.returncode != 0 and "CRTOOLS_INIT_PID" in r.stderr
