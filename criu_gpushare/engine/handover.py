"""The CPU threads of a group's CUDA processes while their GPU state is checkpointed: frozen in
place around the driver checkpoint, checked free of GPU device files and handed over stopped to
CRIU, taken back before the driver restore (engine/freezer.py does the ptrace work on one
process; this is the group's side of it).

Each process's driver restore thread is spared every time. It is found at the freeze and kept
(`restore_tids`, in the journal): a stopped process cannot be asked for it (the query needs that
very thread), and CRIU restores thread ids as the process sees them, so it is kept as a tid in the
process's own namespace.
"""
from .. import waits
from ..errors import Error, ProcessError
from ..gpu import checkpoint_api as ck
from .freezer import Freezer, ns_tid, tid_of_ns_tid


class HandOver:
    def __init__(self, restore_tids=None):
        self.freezer = Freezer()
        self.restore_tids = dict(restore_tids or {})  # pid -> its restore thread, in its namespace

    def freeze(self, pids, deadline):
        """Every thread of pids stopped but the restore thread and the shim's (before the
        checkpoint unmaps memory those threads could touch)."""
        for pid in pids:
            tid = ck.restore_thread_id(pid, deadline.left())
            self.restore_tids[pid] = ns_tid(pid, tid) or tid
            self.freezer.freeze(pid, {tid}, deadline.left())

    def hand_over(self, pids, deadline):
        """The frozen processes left stopped, for CRIU to seize (freezer.py says why)."""
        for pid in pids:
            self.freezer.hand_over(pid, deadline.left())

    def restore_tid(self, pid, deadline):
        """pid's driver restore thread: the one recorded at the freeze (found again by its tid in
        the process's namespace), else asked of the driver (the process must be running)."""
        if pid in self.restore_tids:
            tid = tid_of_ns_tid(pid, self.restore_tids[pid])
            if tid is None:
                raise ProcessError(pid, f"its driver restore thread ({self.restore_tids[pid]} in "
                                   "its namespace) is gone: its GPU state cannot come back")
            return tid
        return ck.restore_thread_id(pid, deadline.left())

    def take_back(self, pids, deadline):
        """Processes handed over stopped (CRIU's dump, its restore, a tree it left running): every
        thread frozen but the restore thread and the shim's, then continued."""
        for pid in pids:
            self.freezer.take_back(pid, {self.restore_tid(pid, deadline)}, deadline.left())

    def refreeze(self, checkpointed, deadline):
        """Threads that run while their GPU state is checkpointed (a group whose holder died) are
        frozen again before the driver restore, as in place; thaw follows the unlock."""
        for pid in checkpointed:
            if not self.freezer.frozen_threads(pid):
                self.freezer.freeze(pid, {self.restore_tid(pid, deadline)}, deadline.left())

    def hand_back(self, pids, report):
        """A failed driver restore after CRIU: the tool exits, and its freeze with it, so the
        processes of pids still checkpointed are left stopped again (never running on missing
        memory)."""
        for pid in pids:
            if not _still_checkpointed(pid):
                continue
            try:
                self.freezer.hand_over(pid)
            except Error as e:
                report(f"warning: stopping pid {pid} again: {e}")

    def thaw(self):
        self.freezer.thaw()


def check_vacated(pids, cuda_pids, deadline):
    """Before the hand-over: no process of the group may still hold a /dev/nvidia* file (CRIU
    cannot dump one, and the image would hold GPU state it cannot restore). Naming what is left,
    and where, here beats CRIU's "Can't handle non-regular mapping" later."""
    from ..shimctl.processes import gpu_device_fds, gpu_device_mappings
    for pid in pids:
        left = gpu_device_mappings(pid) + [f"fd {fd} {t}" for fd, t in gpu_device_fds(pid).items()]
        if left:
            state = ck.state_if_initialized(pid, deadline.left()) if pid in cuda_pids else None
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:120]
            raise ProcessError(pid, f"({cmd}) still holds {len(left)} GPU device file(s) after "
                               f"the driver checkpoint (driver state: "
                               f"{state.value if state else 'no CUDA state'}): "
                               f"{'; '.join(left[:4])}; CRIU could not dump it")


def _still_checkpointed(pid):
    try:
        return ck.state(pid, waits.UNDO_WAIT_S) is not ck.State.RUNNING
    except Error:
        return True  # unknown: stopping it is the safe side
