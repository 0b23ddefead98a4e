"""Every wait is bounded (README, "Timeouts"): a member stopped with SIGSTOP before or during a
suspend, or one whose shim never answers, ends the suspend in time, names the pid, and leaves the
workload whole once it runs again."""
import os
import signal
import subprocess
import sys
import time

import pytest

from criu_gpushare import waits
from criu_gpushare.engine import steps
from criu_gpushare.engine.freezer import SHIM_THREAD_NAME, Freezer, thread_ids, thread_name
from criu_gpushare.engine.plan import Member
from criu_gpushare.errors import GroupHeld, NoAnswer, ProcessNoAnswer
from interrupts import paused_env, wait_until
from lctest import assert_runs_as_before, pair

TIMEOUT = 5
BOUND_S = 30  # --timeout 5 and the tool's start: generous, never a timing race


def timed_suspend(lc, *pids, env=None):
    """`suspend --timeout 5 PIDS` -> (CompletedProcess, seconds); 90 s at most (a hang fails)."""
    t0 = time.monotonic()
    r = lc.cli("suspend", "--timeout", TIMEOUT, *pids, env=env, timeout=90)
    return r, time.monotonic() - t0


def stop(pid):
    os.kill(pid, signal.SIGSTOP)
    wait_until(lambda: waits.stopped(pid), f"pid {pid} to stop")


def no_state_files(lc):
    return not [f for f in os.listdir(lc.run_dir) if f.startswith(("pid-", "journal-"))]


def test_a_stopped_member_is_refused_before_anything_changes(lc, workload, tmp_path):
    a, b = pair(lc, workload, tmp_path)
    stop(b.pid)
    try:
        r, took = timed_suspend(lc, a.pid, b.pid)
    finally:
        os.kill(b.pid, signal.SIGCONT)
    assert took < BOUND_S, took
    assert r.returncode == NoAnswer.exit_code, r.stderr + lc.holder_log()
    assert f"process {b.pid}: is stopped (SIGSTOP)" in r.stderr and "nothing was changed" in r.stderr
    assert "Traceback" not in r.stderr
    assert no_state_files(lc)
    assert_runs_as_before(lc, a, b)


@pytest.mark.parametrize("point", ["quiesce", "lock"])
def test_a_member_stopped_mid_suspend_ends_it_and_the_rollback_finishes_once_it_runs(
        lc, workload, tmp_path, point):
    """b is stopped while the suspend waits after its step `point` (its gates closed; or the
    driver holding the group locked): the next request to b's shim, or driver call on b (the
    driver reaches a process through a thread of its own), fails at once naming it; what the
    rollback can do without b is done, and the holder finishes the rest once b gets SIGCONT."""
    a, b = pair(lc, workload, tmp_path)
    pause = tmp_path / "pause"
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "criu_gpushare.cli", "suspend", "--timeout",
                             str(TIMEOUT), str(a.pid), str(b.pid)], env=paused_env(lc.tool, point, pause),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: pause.exists() or proc.poll() is not None, f"the pause after {point}")
        stop(b.pid)
        pause.unlink()
        _, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.kill(b.pid, signal.SIGCONT)
    assert time.monotonic() - t0 < BOUND_S
    assert proc.returncode == GroupHeld.exit_code, err + lc.holder_log()
    assert f"process {b.pid}: is stopped (SIGSTOP)" in err, err
    assert "the rollback finishes by itself" in err, err
    assert "Traceback" not in err
    wait_until(lambda: no_state_files(lc), "the holder's rollback after SIGCONT", timeout=30)
    assert_runs_as_before(lc, a, b)


def test_a_shim_that_never_answers_ends_the_suspend_within_the_timeout(lc, workload, tmp_path):
    """b runs, but its shim's threads are held (traced and stopped by this test): no answer comes."""
    a, b = pair(lc, workload, tmp_path)
    held = Freezer()
    shim_tids = [t for t in thread_ids(b.pid) if thread_name(b.pid, t) == SHIM_THREAD_NAME]
    assert shim_tids
    for tid in shim_tids:
        held._stop(b.pid, tid, waits.Deadline(10))
    try:
        r, took = timed_suspend(lc, a.pid, b.pid)
    finally:
        held.thaw(b.pid)
    assert took < BOUND_S, took
    assert r.returncode == NoAnswer.exit_code, r.stderr + lc.holder_log()
    assert f"process {b.pid}: no reply to 'status' within" in r.stderr, r.stderr
    assert no_state_files(lc)
    assert_runs_as_before(lc, a, b)


def test_the_waits_of_a_step_share_its_deadline_and_a_rollback_step_has_its_own(monkeypatch):
    """Shim requests get what is left of the step's deadline: --timeout for a suspend step, the
    undo bound (never the 600 s of old) for a rollback step; a rollback's reopen still reaches
    every shim when one of them cannot answer."""
    seen = []

    def request(pid, cmd, fds=(), timeout=None, **fields):
        seen.append((pid, cmd, timeout))
        if pid == 1 and cmd == "resume":
            raise ProcessNoAnswer(1, "is stopped (SIGSTOP)")
        return {"ok": True}, []

    monkeypatch.setattr(steps.control, "request", request)
    g = steps.Group([1, 2], steps.Options(store="unused", timeout_s=TIMEOUT))
    g.members = [Member(1, False, True, {}), Member(2, False, True, {})]
    g.begin_step()
    g.step("void")()
    assert [c for _, c, _ in seen] == ["void-exports"] * 2
    assert all(0 < t <= TIMEOUT for _, _, t in seen), seen
    seen.clear()
    g.begin_step(undo=True)
    g.step("recreate")()
    with pytest.raises(ProcessNoAnswer):
        g.step("reopen")()
    assert [(p, c) for p, c, _ in seen] == [(1, "recreate"), (2, "recreate"), (1, "resume"), (2, "resume")]
    assert all(TIMEOUT < t <= waits.UNDO_WAIT_S for _, _, t in seen), seen
