"""criu dump/restore with `--action-script criu-gpushare-hook`, on processes without a GPU."""
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
def test_dump_of_a_process_with_cuda_loaded_is_refused_and_it_keeps_running(criu, tmp_path, cleanup):
    src, lib = tmp_path / "empty.c", tmp_path / "libcuda.so.1"
    src.write_text("int fake_cuda_marker(void) { return 1; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    proc = daemon(tmp_path, f"import ctypes, time; ctypes.CDLL({str(lib)!r})\nwhile True: time.sleep(0.1)")
    pid = proc.pid
    cleanup.append(pid)
    images = tmp_path / "images"
    images.mkdir()
    dump = subprocess.run([criu, "dump", "-t", str(pid), "-D", str(images), "--action-script", HOOK,
                           "-o", "dump.log", "-v4"], capture_output=True, text=True, timeout=120)
    log = (images / "dump.log").read_text()
    assert dump.returncode != 0
    assert "use CUDA" in log and str(pid) in log
    assert alive(pid)
