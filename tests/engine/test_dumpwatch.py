"""engine/dumpwatch.py: the stand-in of a `criu-gpushare dump` that dies. It does nothing when the
command stands it down; when the command's end comes without that, it waits for CRIU to end and
then resumes the tree only if a journal still holds it. (The whole path, the wrapper SIGKILLed mid
dump under CRIU: tests/hook/test_criu_faults.py.)"""
import os
import subprocess
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


def test_a_command_gone_without_a_word_and_no_journal_gives_nothing_back(run_dir):
    watch = dumpwatch.DumpWatch.start(424243)
    os.close(watch._fd)  # what the command's death does to the pipe
    assert watch._proc.wait(20) == 0
    log = log_of(424243)
    assert "its command died" in log and "nothing to give back" in log, log
    assert "running: criu-gpushare resume" not in log


def test_it_waits_for_criu_to_end_before_acting(run_dir):
    criu = subprocess.Popen(["sleep", "60"])
    try:
        watch = dumpwatch.DumpWatch.start(424244)
        watch.criu_started(criu.pid)
        os.close(watch._fd)
        time.sleep(1.0)
        assert watch._proc.poll() is None, "acted while CRIU still ran (it holds the tasks)"
        assert "nothing to give back" not in log_of(424244)
    finally:
        criu.kill()
        criu.wait()
    assert watch._proc.wait(20) == 0
    assert "nothing to give back" in log_of(424244)


def test_a_watch_that_cannot_start_says_so_and_the_dump_goes_on(run_dir, monkeypatch):
    def no_process(*args, **kwargs):
        raise OSError(11, "Resource temporarily unavailable")
    monkeypatch.setattr(dumpwatch.subprocess, "Popen", no_process)
    said = []
    watch = dumpwatch.DumpWatch.start(424245, report=said.append)
    watch.criu_started(os.getpid())
    watch.stand_down()
    assert len(said) == 1 and "criu-gpushare resume 424245" in said[0], said
