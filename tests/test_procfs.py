"""criu_gpushare/procfs.py: the one reader of /proc/PID/stat, which every state check and every
"same process" test (pid + start time) rests on."""
import os
import subprocess
import sys
import threading
import time

from criu_gpushare import procfs


def test_a_running_process_has_its_state_and_start_time():
    state, started = procfs.state_and_start(os.getpid())
    assert state in ("R", "S") and started > 0
    assert procfs.state_and_start("self")[1] == started


def test_a_name_with_spaces_and_parentheses_does_not_shift_the_fields(tmp_path):
    odd = tmp_path / "a b) c"
    odd.symlink_to(sys.executable)
    p = subprocess.Popen([str(odd), "-c", "import time; time.sleep(30)"])
    try:
        deadline = time.monotonic() + 10
        while "a b) c" not in open(f"/proc/{p.pid}/stat").read() and time.monotonic() < deadline:
            time.sleep(0.02)
        state, started = procfs.state_and_start(p.pid)
        assert state in ("R", "S", "D") and started >= procfs.state_and_start("self")[1]
    finally:
        p.kill()
        p.wait()


def test_a_zombie_reads_z_and_a_reaped_process_is_gone():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 10
    while procfs.state_and_start(p.pid)[0] != "Z" and time.monotonic() < deadline:
        time.sleep(0.02)
    assert procfs.state_and_start(p.pid)[0] == "Z"
    p.wait()
    assert procfs.state_and_start(p.pid) is None
    assert procfs.thread_state(p.pid, p.pid) is None


def test_a_thread_has_its_own_state():
    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    try:
        deadline = time.monotonic() + 10  # running until it reaches its wait
        while procfs.thread_state(os.getpid(), t.native_id) != "S" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert procfs.thread_state(os.getpid(), t.native_id) == "S"
        assert procfs.thread_state(os.getpid(), 1 << 30) is None
    finally:
        stop.set()
        t.join()


def test_every_thread_of_a_process_has_its_state_and_a_gone_process_none():
    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    try:
        states = procfs.thread_states(os.getpid())
        assert {os.getpid(), t.native_id} <= set(states)
        assert states[os.getpid()] == "R"  # this thread, reading them
    finally:
        stop.set()
        t.join()
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    assert procfs.thread_states(p.pid) == {}
