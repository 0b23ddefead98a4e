"""criu_gpushare/engine/suspension.py on its own: what the recovery of a journal does when the holder
is gone, and what the holder's suspend refuses, without a workload (a resume asked while another
process works on the group: test_resuming.py). The cycles themselves are test_cycles.py; a holder
killed at every phase, test_recovery.py."""
import os

import pytest

from criu_gpushare.engine import journal as jn, suspension
from criu_gpushare.engine.steps import Options
from criu_gpushare.errors import ProcessError


def test_a_journal_from_before_the_plan_means_nothing_changed(run_dir, sleeper):
    journal = jn.Journal.create("suspend", [sleeper.pid], jn.SUSPENDING, store="s", ref="r")
    result = suspension.recover(journal)
    assert result["state"] == "resumed" and result["note"] == "nothing had been changed"
    assert jn.owner_of(sleeper.pid) is None and os.listdir(run_dir) == []  # free again


def test_a_group_that_exited_while_suspended_loses_its_journal(run_dir, sleeper):
    journal = jn.Journal.create("suspend", [sleeper.pid], jn.SUSPENDED, store="s", ref="r",
                                group={"pids": [sleeper.pid]})
    sleeper.kill()
    sleeper.wait()
    with pytest.raises(ProcessError, match="exited while suspended; its journal is removed .the "
                                           "store keeps its checkpoint until `store rm`."):
        suspension.recover(journal)
    assert os.listdir(run_dir) == []


def test_a_process_without_cuda_state_has_nothing_to_suspend(run_dir, sleeper):
    journal = jn.Journal.create("suspend", [sleeper.pid], jn.SUSPENDING, store="s", ref="r")
    work = suspension.SuspendWork(journal, Options(store=str(run_dir.parent / "store"), ref="r"))
    with pytest.raises(suspension.NothingToSuspend, match="has no CUDA state: nothing to suspend "
                                                          r"\(nothing was changed\)") as e:
        work.begin(print)
    assert e.value.exit_code == 5
    assert jn.owner_of(sleeper.pid) is None  # claims and journal gone


def test_the_holder_answers_resume_and_nothing_else(run_dir, sleeper):
    journal = jn.Journal.create("suspend", [sleeper.pid], jn.SUSPENDED, store="s", ref="r")
    work = suspension.SuspendWork(journal, Options(store=str(run_dir.parent / "store"), ref="r"))
    with pytest.raises(ProcessError, match="unknown holder command 'status'"):
        work.handle("status", {}, print)


def test_a_resume_that_fails_stops_what_it_loaded_ahead_and_stays_resumable(run_dir, sleeper, monkeypatch):
    """resume_group: whatever a step raises, the load ahead it was given (or started) is closed,
    so its GPU memory is freed before the failure is reported, and the journal says the group is
    still suspended (a later `resume` retries)."""
    from criu_gpushare.engine.steps import Group
    from criu_gpushare.errors import DriverError

    class LoadingAhead:
        closed = 0

        def close(self):
            self.closed += 1

    def failing_undo(runner, verb):
        assert group.loading_ahead is given, "the steps see it"
        raise DriverError("the recreate step failed")

    monkeypatch.setattr(suspension.Runner, "undo", failing_undo)
    journal = jn.Journal.create("suspend", [sleeper.pid], jn.SUSPENDED, store="s", ref="r")
    group = Group([sleeper.pid], Options(store=str(run_dir.parent / "store"), ref="r"))
    given = LoadingAhead()
    with pytest.raises(DriverError, match="the recreate step failed"):
        suspension.resume_group(group, journal, checked=True, loading_ahead=given)
    assert given.closed == 1 and group.loading_ahead is None
    assert jn.owner_of(sleeper.pid).state == jn.SUSPENDED
    journal.close()
