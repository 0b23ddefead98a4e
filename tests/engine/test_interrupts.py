"""Ctrl-C on `suspend` and `resume` (engine/cancel.py): a suspend is cancelled and rolled back
(exit 17); a resume goes on, in the holder that does it (the command says so and exits 18) or in
the command itself."""
import os

from interrupts import interrupt, paused_env, wait_until
from lctest import assert_shared, resume, shim_state, share, suspend, values, write


def pair(lc, workload, tmp_path):
    a, b = workload(), workload()
    share(a, b, tmp_path)
    write(a, "buf", 42)
    return a, b


def no_state_files(lc):
    return not [f for f in os.listdir(lc.run_dir) if f.startswith(("pid-", "journal-"))]


def assert_running_as_before(lc, a, b):
    assert values(b, "buf") == [42] * 4 and values(a, "buf") == [42] * 4
    assert shim_state(lc, a.pid) == "running" and shim_state(lc, b.pid) == "running"
    assert no_state_files(lc)
    assert_shared(a, b, value=42)  # live, and left at 42


def test_ctrl_c_on_suspend_cancels_and_rolls_back(lc, workload, tmp_path):
    a, b = pair(lc, workload, tmp_path)
    pause = tmp_path / "pause"
    r = interrupt(["suspend", a.pid, b.pid], paused_env(lc.tool, "save", pause), pause)
    assert r.returncode == 17, r.stderr + lc.holder_log()
    assert "suspend cancelled by an interrupt at step unkeep" in r.stderr, r.stderr
    assert "rolled back, the workload runs as before" in r.stderr
    assert "Traceback" not in r.stderr and "Aborted" not in r.stderr
    assert_running_as_before(lc, a, b)
    suspend(lc, a.pid, b.pid)  # nothing was left behind: the same group suspends and resumes
    resume(lc, a.pid)
    assert_running_as_before(lc, a, b)


def test_a_second_ctrl_c_on_suspend_leaves_the_rollback_to_the_holder(lc, workload, tmp_path):
    a, b = pair(lc, workload, tmp_path)
    pause = tmp_path / "pause"
    r = interrupt(["suspend", a.pid, b.pid], paused_env(lc.tool, "save", pause), pause, signals=2)
    assert r.returncode == 18, r.stderr
    assert "not waiting any more: the holder goes on" in r.stderr and "criu-gpushare status" in r.stderr
    wait_until(lambda: no_state_files(lc), "the holder's rollback")
    assert_running_as_before(lc, a, b)


def test_ctrl_c_on_resume_leaves_the_resume_to_its_holder(lc, workload, tmp_path):
    a, b = pair(lc, workload, tmp_path)
    pause = tmp_path / "pause"
    suspend(lc, a.pid, b.pid, env=paused_env(lc.tool, "load", pause))  # the holder pauses at load
    r = interrupt(["resume", a.pid], lc.tool, pause)
    assert r.returncode == 18, r.stderr
    assert "the resume goes on in the holder" in r.stderr and "criu-gpushare status" in r.stderr, r.stderr
    wait_until(lambda: no_state_files(lc), "the holder's resume")
    assert_running_as_before(lc, a, b)


def test_ctrl_c_on_a_resume_from_the_journal_lets_it_finish(lc, workload, tmp_path):
    a, b = pair(lc, workload, tmp_path)
    suspend(lc, a.pid, b.pid)
    lc.kill_holders()  # resume then works from the journal, in its own process
    pause = tmp_path / "pause"
    r = interrupt(["resume", a.pid], paused_env(lc.tool, "load", pause), pause)
    assert r.returncode == 0, r.stderr
    assert "interrupt: the resume goes on" in r.stderr
    assert_running_as_before(lc, a, b)
