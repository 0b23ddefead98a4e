"""criu dump/restore with `--action-script criu-gpushare-hook`, on processes without a GPU."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

HOOK = shutil.which("criu-gpushare-hook")


def daemon(tmp_path, code):
    """A session leader with no tty (CRIU dumps it without --shell-job), our child: once CRIU has
    dumped and killed it we reap it, so its pid is free for the restore (an init that does not
    reap orphans would keep it taken)."""
    ready = tmp_path / "ready"
    proc = subprocess.Popen([sys.executable, "-c", f"open({str(ready)!r}, 'w').close(); {code}"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    for _ in range(200):
        if ready.exists():
            return proc
        time.sleep(0.05)
    pytest.fail("daemon did not start")


def alive(pid):
    """Running (a zombie nobody reaps, e.g. under a container's init, counts as dead)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.fixture
def cleanup():
    pids = []
    yield pids
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.skipif(HOOK is None, reason="criu-gpushare-hook is not on PATH (package not installed)")
def test_dump_and_restore_of_a_process_without_cuda_pass_through_the_hook(criu, tmp_path, cleanup):
    proc = daemon(tmp_path, "import time\nwhile True: time.sleep(0.1)")
    pid = proc.pid
    cleanup.append(pid)
    images = tmp_path / "images"
    images.mkdir()
    dump = subprocess.run([criu, "dump", "-t", str(pid), "-D", str(images), "--action-script", HOOK,
                           "-o", "dump.log", "-v4"], capture_output=True, text=True, timeout=120)
    assert dump.returncode == 0, (images / "dump.log").read_text()[-3000:]
    proc.wait(10)  # CRIU killed it after the dump: reap it, freeing its pid
    restore = subprocess.run([criu, "restore", "-D", str(images), "-d", "--action-script", HOOK,
                              "-o", "restore.log", "-v4"], capture_output=True, text=True, timeout=120)
    assert restore.returncode == 0, (images / "restore.log").read_text()[-3000:]
    assert alive(pid)


@pytest.mark.skipif(HOOK is None, reason="criu-gpushare-hook is not on PATH (package not installed)")
def test_a_process_with_libcuda_loaded_but_no_gpu_state_dumps_and_restores(criu, tmp_path, cleanup, fake_env):
    """libcuda loaded, cuInit never called: nothing on the GPU, so CRIU dumps it as it is; the
    record says so, and the restore needs nothing of the store."""
    lib = os.path.join(fake_env["LD_LIBRARY_PATH"].split(os.pathsep)[0], "libcuda.so.1")
    proc = daemon(tmp_path, f"import ctypes, time; ctypes.CDLL({lib!r})\nwhile True: time.sleep(0.1)")
    pid = proc.pid
    cleanup.append(pid)
    env = dict(fake_env, CRIU_GPUSHARE_RUN_DIR=str(tmp_path / "run"), CRIU_GPUSHARE_STORE=str(tmp_path / "store"))
    images = tmp_path / "images"
    images.mkdir()
    dump = subprocess.run([criu, "dump", "-t", str(pid), "-D", str(images), "--action-script", HOOK,
                           "-o", "dump.log", "-v4"], capture_output=True, text=True, timeout=120, env=env)
    assert dump.returncode == 0, (images / "dump.log").read_text()[-3000:]
    assert json.load(open(images / "criu-gpushare.json"))["gpu_state"] is False
    proc.wait(10)
    restore = subprocess.run([criu, "restore", "-D", str(images), "-d", "--action-script", HOOK,
                              "-o", "restore.log", "-v4"], capture_output=True, text=True, timeout=120, env=env)
    assert restore.returncode == 0, (images / "restore.log").read_text()[-3000:]
    assert alive(pid)
    run = tmp_path / "run"  # no GPU state: pre-restore starts no holder
    assert not [n for n in (os.listdir(run) if run.exists() else []) if n.startswith("holder-restore-")]
