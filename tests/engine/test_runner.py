"""The runner on a stand-in group: every failure of any kind ends in the whole list done, the
whole rollback done, or a held group; the journal knows each step before it runs."""
import pytest

from criu_gpushare.engine.runner import ResumeFailed, Runner, StepFailed, SuspendHeld
from criu_gpushare.errors import BusyError, GroupHeld, RestoreIncomplete


class Group:
    """What the runner needs of a group: steps by name, done, times, stats, report."""

    def __init__(self, fail=None, fail_undo=None, exc=None):
        self.done, self.times, self.ran = [], {}, []
        self.undo_deadlines = []  # per step begun: whether its waits got the undo bound
        self.fail, self.fail_undo, self.exc = fail, fail_undo, exc or BusyError("drain")
        self.stats = None

    def report(self, message):
        pass

    def state(self):
        return {"done": list(self.done)}

    def drop_dead(self):
        return []

    def begin_step(self, undo=False):
        self.undo_deadlines.append(undo)

    def step(self, name):
        def run():
            self.ran.append(name)
            if name in (self.fail, self.fail_undo):
                if name == self.fail_undo:
                    self.fail_undo = None if self.fail_undo == "once" else self.fail_undo
                raise self.exc
        return run


class Journal:
    def __init__(self):
        self.saved = []

    def set(self, **fields):
        self.saved.append(fields["group"]["done"])


LIST = ("quiesce", "save", "release", "void", "lock", "freeze", "checkpoint")


def test_the_whole_list_runs_and_each_step_is_journaled_before_it_runs():
    g, j = Group(), Journal()
    Runner(g, j).run(LIST)
    assert g.ran == list(LIST) and g.done == list(LIST)
    assert j.saved[0] == ["quiesce"] and j.saved[-1] == list(LIST)


@pytest.mark.parametrize("exc", [BusyError("drain"), RuntimeError("a bug"), KeyboardInterrupt()])
def test_any_failure_rolls_back_what_was_begun_in_undo_order(exc):
    g = Group(fail="lock", exc=exc)
    with pytest.raises(StepFailed) as e:
        Runner(g, Journal()).run(LIST)
    assert e.value.step == "lock"
    # lock was begun: its undo runs too; freeze and checkpoint were not begun
    assert g.ran == ["quiesce", "save", "release", "void", "lock", "unlock", "recreate", "load",
                     "attach", "reopen"]
    assert g.done == []
    if isinstance(exc, BusyError):
        assert e.value.exit_code == BusyError.exit_code  # the cause's code: rolled back
    # every step got a deadline of its own: --timeout's for the list, the undo bound for the rollback
    assert g.undo_deadlines == [False] * 5 + [True] * 5


def test_a_failed_rollback_leaves_the_group_held():
    g = Group(fail="checkpoint", fail_undo="recreate")
    with pytest.raises(SuspendHeld) as e:
        Runner(g, Journal()).run(LIST)
    assert isinstance(e.value, GroupHeld) and e.value.exit_code == GroupHeld.exit_code
    assert "the group stays held" in str(e.value)
    assert "checkpoint" in g.done  # kept for the resume that finishes the rollback


def test_a_failed_undo_can_be_retried_and_redoes_every_undo_step():
    g = Group(fail_undo="load")
    g.done = list(LIST)
    with pytest.raises(ResumeFailed) as e:
        Runner(g, Journal()).undo()
    assert isinstance(e.value, RestoreIncomplete) and e.value.step == "load"
    g.fail_undo, g.ran = None, []
    Runner(g, Journal()).undo()
    assert g.ran == ["restore", "unlock", "thaw", "recreate", "load", "attach", "reopen"]
    assert g.done == []
