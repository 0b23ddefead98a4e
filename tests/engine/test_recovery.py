"""No single point of failure: the holder SIGKILLed at each phase of suspend or resume, then
`criu-gpushare resume PID` (in a new process, from the journal and the store) brings the workload
back with its memory intact and its sharing live."""
import os
import signal

import pytest

from lctest import assert_shared, resume, shim_state, share, suspend, values, write


def pair(lc, workload, tmp_path):
    a, b = workload(), workload()
    share(a, b, tmp_path)
    write(a, "buf", 42)
    return a, b


def assert_back(lc, a, b):
    assert values(b, "buf") == [42] * 4
    assert values(a, "buf") == [42] * 4
    assert shim_state(lc, a.pid) == "running" and shim_state(lc, b.pid) == "running"
    assert not [f for f in os.listdir(lc.run_dir) if f.startswith(("pid-", "journal-"))]
    assert_shared(a, b)


@pytest.mark.parametrize("phase", ["quiesce", "release", "void", "lock", "freeze", "checkpoint",
                                   "copy", "save", "unkeep"])
def test_holder_killed_during_suspend(lc, workload, tmp_path, phase):
    a, b = pair(lc, workload, tmp_path)
    r = suspend(lc, a.pid, b.pid, ok=False, env=dict(lc.tool, CRIU_GPUSHARE_FAULT=f"{phase}:kill"))
    assert r.returncode == 14, r.stderr  # GroupHeld: the holder died, the journal holds the group
    assert "criu-gpushare resume" in r.stderr
    status = lc.cli("status", a.pid)
    assert "criu-gpushare (suspend of group" in status.stdout, status.stdout
    listing = lc.cli("status").stdout
    assert f"group {min(a.pid, b.pid)}: suspend" in listing, listing
    r = resume(lc, a.pid)
    assert "resuming from its journal" in r.stderr
    assert_back(lc, a, b)


def test_holder_killed_while_holding(lc, workload, tmp_path):
    a, b = pair(lc, workload, tmp_path)
    suspend(lc, a.pid, b.pid)
    for pid in lc.holder_pids():
        os.kill(pid, signal.SIGKILL)
    resume(lc, b.pid)
    assert_back(lc, a, b)


@pytest.mark.parametrize("phase", ["restore", "unlock", "thaw", "recreate", "load", "attach"])
def test_holder_killed_during_resume(lc, workload, tmp_path, phase):
    """The holder dies with the request: the same `resume` finishes the work from the journal (it
    told the user to wait for a process that was gone before)."""
    a, b = pair(lc, workload, tmp_path)
    suspend(lc, a.pid, b.pid, env=dict(lc.tool, CRIU_GPUSHARE_FAULT=f"{phase}:kill"))
    r = resume(lc, a.pid)
    assert f"the holder of group {min(a.pid, b.pid)} ended without an answer" in r.stderr, r.stderr
    assert "resuming from its journal" in r.stderr, r.stderr
    assert_back(lc, a, b)


def test_a_second_suspend_of_a_suspended_pid_is_refused(lc, workload, tmp_path):
    a, b = pair(lc, workload, tmp_path)
    suspend(lc, a.pid, b.pid)
    r = suspend(lc, b.pid, ok=False)
    assert r.returncode == 5 and "already being handled" in r.stderr, r.stderr
    resume(lc, a.pid)
    assert_back(lc, a, b)


def test_suspend_of_a_process_without_cuda_leaves_nothing(lc, tmp_path):
    import subprocess
    import sys
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        r = lc.cli("suspend", p.pid)
        assert r.returncode == 5 and "nothing to suspend" in r.stderr, r.stderr
        assert os.listdir(lc.run_dir) == []
    finally:
        p.kill()
        p.wait()


@pytest.mark.parametrize("value", ["nan", "inf", "1e10", "0", "-1"])
def test_bad_timeouts_are_refused_before_anything_changes(lc, workload, tmp_path, value):
    a, b = pair(lc, workload, tmp_path)
    r = suspend(lc, a.pid, b.pid, ok=False, args=("--timeout", value))
    assert r.returncode == 2 and "--timeout" in r.stderr, r.stderr
    assert_back(lc, a, b)


def test_a_bug_in_a_step_is_rolled_back(lc, workload, tmp_path):
    """Any exception, not only the tool's own errors, ends in a full rollback."""
    a, b = pair(lc, workload, tmp_path)
    env = dict(lc.tool, CRIU_GPUSHARE_FAULT="lock:bug")
    r = suspend(lc, a.pid, b.pid, ok=False, env=env)
    assert "failed at step lock" in r.stderr and "rolled back" in r.stderr, r.stderr
    assert_back(lc, a, b)


def test_a_member_that_dies_mid_suspend_is_reported_and_the_rest_come_back_free(lc, workload, tmp_path):
    """b dies after its memory is released (killed at the void step, as a crash would): the
    suspend fails, b is named, and a rolls back to running and free, never held."""
    a, b = pair(lc, workload, tmp_path)
    c = workload()
    c.do("cumem other 4194304")
    write(c, "other", 3)
    env = dict(lc.tool, CRIU_GPUSHARE_FAULT="void", CRIU_GPUSHARE_TEST_KILL_AT_FAULT=str(b.pid))
    r = suspend(lc, a.pid, b.pid, c.pid, ok=False, env=env)
    assert r.returncode != 0 and f"process(es) {b.pid}" in r.stderr and "rolled back" in r.stderr, r.stderr
    assert values(c, "other") == [3] * 4 and values(a, "buf") == [42] * 4
    assert shim_state(lc, a.pid) == "running" and shim_state(lc, c.pid) == "running"
    assert not [f for f in os.listdir(lc.run_dir) if f.startswith(("pid-", "journal-"))]
