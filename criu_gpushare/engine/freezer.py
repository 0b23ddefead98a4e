"""Freezing a process's CPU threads with ptrace while its GPU state is checkpointed.

After the driver checkpoint, memory the driver owned (device mappings, its pinned host buffers) is
unmapped while the process's CPU threads still run; a thread touching it would crash the process.
So the threads are stopped with PTRACE_SEIZE + PTRACE_INTERRUPT, except:
  - the driver's restore thread (cuCheckpointProcessGetRestoreThreadId): it carries out the
    restore; stopping it makes every driver call on that pid block for ever;
  - the shim's threads, named SHIM_THREAD_NAME: they answer the tool during restore.
Signals that arrive while frozen are not lost: one caught at a signal-delivery stop is handed back
at detach; the others stay pending in the kernel (stopped threads do not take them).

ptrace ties a tracee to the tracer *thread*: every method of one Freezer must be called from the
same thread of this process, and the freeze lasts only as long as this process lives.

Across CRIU the freeze cannot last (CRIU must seize the tasks itself, and the tool may exit), so
the tool hands the process over *stopped*: `hand_over` queues SIGSTOP while every thread is still
frozen, then lets go; each thread meets the pending stop before it returns to user space, so no
application code runs between our freeze and CRIU's seize. CRIU dumps stopped tasks as stopped and
restores them stopped (also when it leaves them running after a failed or --leave-running dump).
`take_back` is the way back: freeze every thread but the spared ones, then SIGCONT, so that only
the driver's restore thread and the shim's threads run until the driver restore is done.
"""
import ctypes
import errno
import os
import signal
import time

from .. import procfs, waits
from ..errors import ProcessError, ProcessNoAnswer
from ..shimctl.client import ns_pid

SHIM_THREAD_NAME = "criu-gpushare"
FREEZE_WAIT_S = 10.0  # the default bound of one thread's stop (a thread in the kernel stops on its way out)

_PTRACE_DETACH = 17
_PTRACE_SEIZE = 0x4206
_PTRACE_INTERRUPT = 0x4207
_PTRACE_EVENT_STOP = 128
_WALL = 0x40000000

_libc = ctypes.CDLL(None, use_errno=True)
_libc.ptrace.restype = ctypes.c_long
_libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]


def _ptrace(request, tid, data=0):
    if _libc.ptrace(request, tid, None, ctypes.c_void_p(data)) == -1:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def thread_ids(pid):
    try:
        return {int(t) for t in os.listdir(f"/proc/{pid}/task")}
    except FileNotFoundError as e:
        raise ProcessError(pid, "no such process") from e


def ns_tid(pid, tid):
    """tid (a thread of pid, which is stopped) as the process sees it in its own pid namespace
    (what CRIU restores), or None when it cannot be read."""
    try:
        return ns_pid(tid)  # a thread's /proc/<tid>/status is its own
    except (ProcessError, OSError):
        return None


def tid_of_ns_tid(pid, nstid):
    """The thread of pid (as seen here) whose tid in its own namespace is nstid, or None."""
    for tid in thread_ids(pid):
        if ns_tid(pid, tid) == nstid:
            return tid
    return None


def group_stopped(pid):
    """Every thread of pid is in a group stop (SIGSTOP), none traced or running; False when pid
    is gone."""
    states = procfs.thread_states(pid)
    return bool(states) and all(s == "T" for s in states.values())


def thread_name(pid, tid):
    try:
        with open(f"/proc/{pid}/task/{tid}/comm") as f:
            return f.read().strip()
    except OSError:
        return None


class Freezer:
    """Stops and restarts the CPU threads of processes, sparing the ones that must keep running."""

    def __init__(self):
        self.frozen = {}  # tid -> signal to hand back at detach (0: none)
        self.owner = {}   # tid -> pid

    def freeze(self, pid, spare_tids=(), timeout_s=FREEZE_WAIT_S):
        """Stop every thread of pid except spare_tids and the shim's; rescans until no new thread.
        ProcessNoAnswer when a thread has not stopped within timeout_s of the freeze's start."""
        spare = set(spare_tids)
        deadline = waits.Deadline(timeout_s)
        try:
            while True:
                todo = [t for t in thread_ids(pid) if t not in self.frozen and t not in spare
                        and thread_name(pid, t) != SHIM_THREAD_NAME]
                if not todo:
                    return
                for tid in todo:
                    self._stop(pid, tid, deadline)
        except BaseException:
            self.thaw(pid)
            raise

    def _stop(self, pid, tid, deadline):
        try:
            _ptrace(_PTRACE_SEIZE, tid)
        except OSError as e:
            if e.errno == errno.ESRCH:
                return  # the thread exited meanwhile
            hint = " (needs root or CAP_SYS_PTRACE)" if e.errno == errno.EPERM else ""
            raise ProcessError(pid, f"cannot stop thread {tid}: {e.strerror}{hint}") from e
        self.frozen[tid], self.owner[tid] = 0, pid
        try:
            _ptrace(_PTRACE_INTERRUPT, tid)
        except OSError as e:
            if e.errno == errno.ESRCH:
                self._forget(tid)
                return
            raise
        delay = 0.00005
        while True:
            try:
                got, status = os.waitpid(tid, _WALL | os.WNOHANG)
            except ChildProcessError:
                self._forget(tid)
                return
            if got == 0:  # not stopped yet: a thread inside a system call stops on its way out
                if deadline.passed():
                    raise ProcessNoAnswer(pid, f"thread {tid} did not stop within "
                                          f"{deadline.seconds:g} s (state {procfs.thread_state(pid, tid)}: "
                                          "held in the kernel, e.g. a driver call that does not return)")
                time.sleep(delay)
                delay = min(delay * 2, 0.005)
                continue
            if os.WIFEXITED(status) or os.WIFSIGNALED(status):
                self._forget(tid)
                return
            if os.WIFSTOPPED(status):
                sig = os.WSTOPSIG(status)
                if status >> 16 == _PTRACE_EVENT_STOP:
                    return  # our interrupt (or a group stop): frozen
                # A signal-delivery stop: frozen as well; the signal is handed back at detach.
                self.frozen[tid] = sig
                return

    def _forget(self, tid):
        self.frozen.pop(tid, None)
        self.owner.pop(tid, None)

    def thaw(self, pid=None):
        """Restart the threads frozen for pid (all pids when None), handing back caught signals."""
        errors = []
        for tid in [t for t, p in self.owner.items() if pid is None or p == pid]:
            try:
                _ptrace(_PTRACE_DETACH, tid, self.frozen[tid])
            except OSError as e:
                if e.errno != errno.ESRCH:
                    errors.append(f"thread {tid}: {e.strerror}")
            self._forget(tid)
        if errors:
            raise ProcessError(pid if pid is not None else "?", "cannot restart " + ", ".join(errors))

    def hand_over(self, pid, timeout_s=FREEZE_WAIT_S):
        """Leave pid stopped (SIGSTOP) instead of frozen: it stays stopped once this process lets go
        or exits, and CRIU dumps and restores it stopped. Waits until every thread has stopped."""
        try:
            os.kill(pid, signal.SIGSTOP)  # pending until each frozen thread is let go below
        except ProcessLookupError:
            self.thaw(pid)
            raise ProcessError(pid, "exited while its GPU state was checkpointed") from None
        self.thaw(pid)
        deadline = waits.Deadline(timeout_s)
        while not group_stopped(pid):
            if deadline.passed():
                raise ProcessNoAnswer(pid, f"did not stop within {timeout_s:g}s of SIGSTOP")
            time.sleep(0.002)

    def take_back(self, pid, spare_tids=(), timeout_s=FREEZE_WAIT_S):
        """The way back from hand_over: freeze every thread of pid but spare_tids and the shim's,
        then SIGCONT, so that only the spared threads run. A pid that is not stopped (an image made
        before stops were used, a retry) is only frozen; SIGCONT changes nothing for it."""
        if not self.frozen_threads(pid):
            self.freeze(pid, spare_tids, timeout_s)
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            self.thaw(pid)
            raise ProcessError(pid, "no such process") from None

    def frozen_threads(self, pid):
        return sorted(t for t, p in self.owner.items() if p == pid)

