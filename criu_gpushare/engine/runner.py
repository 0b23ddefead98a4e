"""Runs a list of steps (engine/steps.py) on a group, writing each to the journal before it runs,
and undoes them on any failure.

Every failure, of any kind (the tool's errors, a bug, Ctrl-C), ends in one of:
  - the whole list done;
  - the whole rollback done: StepFailed, exit code of the cause, the workload runs as before
    (a cancel, asked between steps through engine/cancel.py, or an interrupt: Cancelled's);
  - the rollback failed too: SuspendHeld (GroupHeld's exit code), the journal keeps the group and
    `criu-gpushare resume` finishes the rollback once the cause is fixed.
Undo (resume, restore after CRIU, rollback) runs UNDO for the steps begun; a failure there is
ResumeFailed: the processes stay suspended and the undo can be retried (every undo step tolerates
running again, or after a step that did only part of its work).
"""
import time
import traceback

from ..errors import Cancelled, Error, GroupHeld, RestoreIncomplete
from ..gpu.copy_engine import CopyStats
from .faults import fault_point
from .steps import UNDO


class StepFailed(Error):
    """{} failed: {}"""

    def __init__(self, step, cause, verb="suspend"):
        super().__init__(step, cause)
        self.step, self.cause, self.verb = step, cause, verb
        self.exit_code = getattr(cause, "exit_code", Error.exit_code)

    def __str__(self):
        if isinstance(self.cause, Cancelled):
            return (f"{self.verb} cancelled by an interrupt at step {self.step or 'end'} ({self.cause}): "
                    "rolled back, the workload runs as before")
        return f"{self.verb} failed at step {self.step}: {self.cause}; rolled back, the workload runs as before"


class SuspendHeld(GroupHeld):
    """{} failed: {}"""

    def __init__(self, step, cause, rollback_error, verb="suspend"):
        super().__init__(step, cause)
        self.step, self.cause, self.rollback_error, self.verb = step, cause, rollback_error, verb

    def __str__(self):
        return (f"{self.verb} failed at step {self.step}: {self.cause}; the rollback failed too "
                f"({self.rollback_error}): the group stays held; fix the cause and run "
                "`criu-gpushare resume` to finish the rollback (`criu-gpushare status` shows each process)")


class ResumeFailed(RestoreIncomplete):
    """{} failed: {}"""

    def __init__(self, step, cause, verb="resume"):
        super().__init__(step, cause)
        self.step, self.cause, self.verb = step, cause, verb

    def __str__(self):
        return (f"{self.verb} failed at step {self.step}: {self.cause}; the processes stay suspended "
                "(their GPU work held, their GPU memory in the store): fix the cause and resume again")


def as_error(e):
    """The tool's error for any exception: a bug or an interrupt is reported, not swallowed."""
    if isinstance(e, Error):
        return e
    if isinstance(e, KeyboardInterrupt):
        return Cancelled("interrupted")
    traceback.print_exc()
    return Error(f"internal error: {e!r}")


class Runner:
    def __init__(self, group, journal=None, cancel=None):
        """cancel: an engine/cancel.Cancel that run() asks before each step and after the last."""
        self.group, self.journal, self.cancel = group, journal, cancel

    def _write_journal(self):
        if self.journal is not None:
            self.journal.set(group=self.group.state())

    def _do(self, name, begin):
        g = self.group
        g.report(f"{name}...")
        if begin:
            g.done.append(name)
            self._write_journal()
        g.begin_step(undo=not begin)  # the step's waits share one deadline (waits.py)
        t = time.monotonic()
        g.step(name)()
        g.times[name] = time.monotonic() - t
        fault_point(name)

    def run(self, steps, verb="suspend"):
        """Run steps in order; on any failure undo what was begun and raise (see the module doc)."""
        for name in (*steps, None):  # None: a cancel asked during the last step still counts
            try:
                if self.cancel is not None and self.cancel.requested():
                    raise Cancelled("before it began" if name else "after the last step")
                if name is not None:
                    self._do(name, begin=True)
            except BaseException as e:
                cause = as_error(e)
                name = getattr(e, "failed_step", name)  # work a step waited for (the checkpoint)
                self.group.report(f"rolling back ({', '.join(reversed(self.group.done))})")
                try:
                    self.undo()
                except BaseException as rollback:
                    self.group.report(f"rollback failed: {as_error(rollback)}")
                    raise SuspendHeld(name, cause, as_error(rollback), verb) from e
                raise StepFailed(name, cause, verb) from e

    def undo(self, verb="resume"):
        """Bring the group back from whatever was begun; ResumeFailed leaves it resumable."""
        g = self.group
        g.times, g.parts, g.stats = {}, {}, CopyStats()
        t0 = time.monotonic()
        g.drop_dead()
        for done_step, step in UNDO:
            if done_step in g.done:
                try:
                    self._do(step, begin=False)
                except BaseException as e:
                    raise ResumeFailed(step, as_error(e), verb) from e
        g.done.clear()  # forgotten only once everything worked: a retry redoes every undo step
        self._write_journal()
        g.times["total"] = time.monotonic() - t0
