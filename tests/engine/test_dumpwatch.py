"""engine/dumpwatch.py: the stand-in of a `criu-gpushare dump` that dies. It does nothing when the
command stands it down; when the command's end comes without that, it waits for CRIU to end and
then resumes the tree only if a journal still holds it. (The whole path, the wrapper SIGKILLed mid
dump under CRIU: tests/hook/test_criu_faults.py.)"""
import contextlib
import os
import subprocess
import sys
import time

import pytest

from criu_gpushare.engine import dumpwatch


@pytest.fixture
def run_dir(tmp_path, monkeypatch):
    d = tmp_path / "run"
    d.mkdir(mode=0o700)
    monkeypatch.setenv("CRIU_GPUSHARE_RUN_DIR", str(d))
    return d


def log_of(key):
    with open(dumpwatch.log_path(key)) as f:
        return f.read()


def test_stood_down_it_ends_at_once_and_says_nothing(run_dir):
    watch = dumpwatch.DumpWatch.start(424242)
    proc = watch._proc
    watch.criu_started(os.getpid())
    watch.stand_down()
    assert proc.wait(10) == 0
    assert not os.path.exists(dumpwatch.log_path(424242)), "an empty log is not left behind"


COMMAND = """
import os, sys, time
from criu_gpushare.engine import dumpwatch
key, started, criu, hold = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
watch = dumpwatch.DumpWatch.start(key)
if criu:
    watch.criu_started(criu)
os.close(watch._fd)  # the pipe ends as a dying command's files close...
open(started, "w").close()
deadline = time.monotonic() + 60
while os.path.exists(hold) and time.monotonic() < deadline:
    time.sleep(0.02)  # ...and the rest of its exit (its GPU context going) lasts while hold exists
"""


@contextlib.contextmanager
def dying_command(tmp_path, key, criu=0, lingering=False):
    """A `criu-gpushare dump` stand-in that starts its watch, tells it CRIU's pid (criu), and dies
    without a word. Inside the `with`, it has closed its pipe and, lingering, is still exiting;
    after it, it has exited."""
    started, hold = tmp_path / f"started-{key}", tmp_path / f"hold-{key}"
    if lingering:
        hold.touch()
    command = subprocess.Popen([sys.executable, "-c", COMMAND, str(key), str(started), str(criu),
                                str(hold)])
    try:
        deadline = time.monotonic() + 30
        while not started.exists():
            assert time.monotonic() < deadline and command.poll() is None, "the command did not start"
            time.sleep(0.02)
        yield
    finally:
        hold.unlink(missing_ok=True)
        command.wait(30)


def wait_for_log(key, text, timeout=20):
    deadline = time.monotonic() + timeout
    while not os.path.exists(dumpwatch.log_path(key)) or text not in log_of(key):
        assert time.monotonic() < deadline, f"{text!r} not in the watch's log"
        time.sleep(0.05)
    return log_of(key)


def test_a_command_gone_without_a_word_and_no_journal_gives_nothing_back(run_dir, tmp_path):
    with dying_command(tmp_path, 424243):
        pass
    log = wait_for_log(424243, "nothing to give back")
    assert "its command died" in log, log
    assert "running: criu-gpushare resume" not in log


def test_it_waits_for_criu_to_end_before_acting(run_dir, tmp_path):
    criu = subprocess.Popen(["sleep", "60"])
    try:
        with dying_command(tmp_path, 424244, criu=criu.pid):
            pass
        wait_for_log(424244, "its command died")
        time.sleep(1.0)
        assert "nothing to give back" not in log_of(424244), "acted while CRIU still ran (it holds the tasks)"
    finally:
        criu.kill()
        criu.wait()
    log = wait_for_log(424244, "nothing to give back")
    assert "its CRIU has ended" in log, log


def test_it_waits_for_the_dead_commands_exit_to_complete_before_acting(run_dir, tmp_path):
    """The pipe's end comes as the command's files close, before its GPU context has gone: the
    watch acts only once the command has exited."""
    with dying_command(tmp_path, 424246, lingering=True):
        time.sleep(0.5)
        assert not os.path.exists(dumpwatch.log_path(424246)) or \
            "nothing to give back" not in log_of(424246), "acted while the command was exiting"
    log = wait_for_log(424246, "nothing to give back")
    assert log.index("its command has exited") < log.index("nothing to give back"), log


def test_a_watch_that_cannot_start_says_so_and_the_dump_goes_on(run_dir, monkeypatch):
    def no_process(*args, **kwargs):
        raise OSError(11, "Resource temporarily unavailable")
    monkeypatch.setattr(dumpwatch.subprocess, "Popen", no_process)
    said = []
    watch = dumpwatch.DumpWatch.start(424245, report=said.append)
    watch.criu_started(os.getpid())
    watch.stand_down()
    assert len(said) == 1 and "criu-gpushare resume 424245" in said[0], said

