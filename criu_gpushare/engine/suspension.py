"""Suspend in place and resume: the job `criu-gpushare suspend` calls (suspend: the group checked, its
journal made, its holder started), the holder's work, and the resume it does on request; recover
finishes the work from the journal where no holder lives (engine/resuming.py decides which). Apart
from engine/jobs.py on purpose: a suspend imports none of CRIU's side.
Each summary carries the phases timed where the work ran ("phases": discover and the steps; the
store check, the steps and the release of the store's holds), for the command's own account."""
import dataclasses
import os
import time

from .. import waits
from ..errors import GroupHeld, ProcessError
from ..gpu.file_pages import release_later, wait_released
from ..gpu.memory import drop_faulted
from ..shimctl.processes import process_tree, uses_cuda
from . import ahead, holder, journal as jn, results
from .runner import Runner, SuspendHeld
from .steps import IN_PLACE, Group, Options, new_ref


class NothingToSuspend(ProcessError):
    """process {}: {}"""


def _no_mark(phase):
    pass


def suspend(pids, settings, tree=False, report=print, mark=_no_mark):
    """Suspend the processes pids (with tree, every descendant too) in a holder; -> its final
    object (engine/holder.py; "interrupted" when a Ctrl-C came meanwhile). mark(phase): called
    as each phase of this process ends (the command's phase clock)."""
    out = []
    for pid in pids:
        if not os.path.exists(f"/proc/{pid}"):
            raise ProcessError(pid, "no such process")
        out.extend(process_tree(pid) if tree else [pid])
    pids = sorted(set(out))
    if not any(uses_cuda(pid) for pid in pids):
        raise ProcessError(", ".join(map(str, pids)), "does not use CUDA: nothing to suspend")
    options = Options.from_settings(settings, new_ref("suspend", min(pids)))
    journal = jn.Journal.create("suspend", pids, jn.SUSPENDING, options=options)
    mark("check (pids, settings, journal)")
    return holder.start(SuspendWork(journal, options), on_progress=report, cancellable=True)


class SuspendWork(holder.Work):
    """Runs in the holder: suspend at start, then resume on request (`status` reads the journal)."""

    def __init__(self, journal, options):
        self.journal, self.options = journal, dataclasses.replace(options, pin_ahead=True)  # it loads next
        self.key, self.pids = journal.key, journal.pids
        self.group = None
        self.waiting_for = []  # stopped members a held group's rollback waits for
        self.registering = None  # gpu/file_pages.RegisteredAhead: the chunk files, while suspended

    def begin(self, report):
        self.journal.adopt()
        try:
            t = time.monotonic()
            self.group = Group(self.pids, self.options, report)
            self.group.discover()
            self.group.times["discover"] = time.monotonic() - t
            if not self.group.has_gpu_state:
                raise NothingToSuspend(", ".join(map(str, self.pids)), "has no CUDA state: nothing "
                                       "to suspend (nothing was changed)")
            # records the group before each step; a cancel from `suspend`'s Ctrl-C is asked between
            Runner(self.group, self.journal, self.cancel).run(IN_PLACE)
        except GroupHeld as e:
            drop_faulted()  # the ring's pages faulted in for a save that did not take them all
            self.waiting_for = [p for p in self.group.pids if waits.stopped(p)]
            if self.waiting_for and isinstance(e, SuspendHeld):
                e = GroupHeld(self._held_for_stopped(e))
            self.journal.set(state=jn.HELD, error=str(e))
            raise e
        except BaseException:
            self.journal.close()
            raise
        self.journal.set(state=jn.SUSPENDED)
        self.registering = _register_ahead(self.group)
        return results.summary(self.group, "suspended"), True

    def _held_for_stopped(self, held):
        listed = ", ".join(map(str, self.waiting_for))
        return (f"{held.verb} failed at step {held.step}: {held.cause}; its rollback needs "
                f"process(es) {listed} too, stopped (SIGSTOP): the group stays held until they run "
                f"again (kill -CONT {listed}), then the rollback finishes by itself "
                f"(`criu-gpushare status {self.key}` shows the group)")

    def poll_s(self):
        return 0.2 if self.waiting_for else None

    def on_tick(self, report):
        """A group held because members were stopped: its rollback, once none is stopped any more."""
        if any(waits.stopped(p) for p in self.waiting_for):
            return True
        self.group.report = report
        try:
            resume_group(self.group, self.journal, verb="rollback")
        except Exception as e:  # the holder stays, for `resume`
            print(f"the rollback failed again: {e}; `criu-gpushare resume {self.key}` retries it", flush=True)
            self.waiting_for = [p for p in self.group.pids if waits.stopped(p)]
            return True
        print("rolled back: the group runs as before", flush=True)
        return False

    def handle(self, cmd, fields, report):
        if cmd == "resume":
            self.group.report = report
            self.group.options.gpu_map = fields.get("gpu_map") or None
            if fields.get("verify") is not None:  # the resuming command's setting, not the suspend's
                self.group.options.verify = fields["verify"]
            if self.registering is None:
                return resume_group(self.group, self.journal), False
            self.group.registered.update(self.registering.take())
            summary = resume_group(self.group, self.journal)
            # undone while this holder answers (finish waits; a failed resume keeps them for the next)
            release_later(list(self.group.registered.values()), self.registering.device)
            return summary, False
        raise ProcessError(self.key, f"unknown holder command {cmd!r}")

    def finish(self):
        wait_released()  # the registrations the resume left to a thread


def _register_ahead(group):
    """engine/ahead.register, best effort: a suspend that succeeded never fails over it."""
    try:
        return ahead.register(group, group.report)
    except Exception as e:  # noqa: BLE001 - the resume reads the store as before
        print(f"the chunk files are not registered ahead of the resume: {e}", flush=True)
        return None


def resume_group(group, journal, verb="resume", checked=False, loading_ahead=None):
    """checked: this process has just checked every chunk readable (a restore's check before CRIU).
    loading_ahead: a StagedLoad a restore started while CRIU restored the processes; else one
    starts here when there is memory to load (engine/ahead.py), as the steps before the load run."""
    t = time.monotonic()
    if not checked:
        group.check_loadable()  # a store that lost a chunk changes nothing
    checked = time.monotonic() - t
    before = journal.state  # suspended, or held (a rollback that failed): what a failure leaves
    journal.set(state=jn.RESUMING)
    if loading_ahead is None and "release" in group.done:
        loading_ahead = ahead.start(group, group.report)
    group.loading_ahead = loading_ahead
    try:
        Runner(group, journal).undo(verb)
    except BaseException as e:
        journal.set(state=before if before != jn.RESUMING else jn.SUSPENDED, error=str(e))
        raise
    finally:
        if group.loading_ahead is not None:
            group.loading_ahead.close()
            group.loading_ahead = None
    t = time.monotonic()
    group.release_holds()
    group.times = {"check (store)": checked, **group.times, "release holds": time.monotonic() - t}
    journal.close()
    return results.summary(group, "resumed")


def recover(journal, gpu_map=None, report=print, verify=None, on_recovered=None):
    """Finish or undo the journal's work in this process (its worker is gone)."""
    if "group" not in journal.data:  # died before its plan was made: nothing was changed
        journal.close()
        return results.nothing_moved("resumed", journal.pids, "nothing had been changed")
    alive = journal.processes_alive()
    if not alive:
        journal.close()
        raise ProcessError(", ".join(map(str, journal.pids)), "exited while suspended; its journal "
                           "is removed (the store keeps its checkpoint until `store rm`)")
    journal.adopt()
    report(f"the process that held group {journal.key} is gone; resuming from its journal")
    override = {"gpu_map": gpu_map or None} if verify is None else {"gpu_map": gpu_map or None,
                                                                     "verify": verify}
    options = Options.from_stored(journal.data, **override)
    group = Group.from_state(journal.data["group"], options, report)
    summary = resume_group(group, journal)
    if on_recovered is not None:
        on_recovered(journal)
    return summary
