"""Suspend and resume a group of processes that share GPU memory: the steps, in order, with rollback.

Suspend (DESIGN.md section 3, steps 1-5):
  quiesce   every shim closes its launch gate, drains, closes its memory gate, drains (sequentially;
            a busy shim makes every gate reopen, and the whole quiesce is retried until the timeout)
  save      every unit of GPU memory (group.plan) is exported by its owner's shim as a POSIX fd,
            imported into this process and streamed to the chunk store; a manifest and a ref are
            committed (durable) before anything is dropped
  release   every shim drops its imports, then its own memory (VA reservations kept), unregisters
            host memory
  void      exported fds the applications still hold are pointed at /dev/null (they would pin the
            dropped memory, and CRIU cannot dump them)
  lock      cuCheckpointProcessLock of every pid at once, with a timeout
  freeze    every CPU thread stopped with ptrace, except the driver's restore thread and the shim's
            (before the checkpoint unmaps memory those threads could touch)
  checkpoint cuCheckpointProcessCheckpoint of every pid at once
Resume:
  restore   cuCheckpointProcessRestore of every CHECKPOINTED pid at once (GPU map by UUID); a failure
            leaves every pid as it is, and resume can be retried
  unlock    only once every pid is restored, so no process runs without its peers
  thaw      CPU threads restarted (nothing they touch is unmapped any more; their GPU work stays
            held at the gates until reopen); signals that arrived meanwhile are delivered
  recreate  owners re-create their memory at the same addresses (adopters re-create adopted memory)
  load      each unit's bytes come back from the store through this process
  attach    importers map the owners' memory again at their own addresses
  reopen    host memory re-registered at the same device pointers, gates opened
A failure during suspend undoes exactly what was done, in reverse order, and says which step failed.
"""
import dataclasses
import os
import time

from ..gpu import checkpoint_api as ck
from ..shimctl import client as control
from . import plan as grp
from ..gpu.copy_engine import CopyEngine, CopyStats
from ..errors import BusyError, Error, ShimError
from .freezer import Freezer
from ..gpu.memory import ImportedAllocation
from ..store.manifest import Manifest, ProcessEntry
from ..store.store import Store

QUIESCE_RETRY_S = 0.25
# Fault injection for tests (as CRIU's --fault): CRIU_GPUSHARE_FAULT=<suspend step> makes that step
# fail right after it did its work, so its undo runs exactly as after a real failure.
FAULT_ENV = "CRIU_GPUSHARE_FAULT"


class StepFailed(Error):
    """{} failed: {}"""

    def __init__(self, step, cause, rolled_back=True):
        super().__init__(step, cause)
        self.step, self.cause, self.rolled_back = step, cause, rolled_back
        self.group_held = not rolled_back  # the holder stays, for `resume` to retry the rollback
        self.exit_code = getattr(cause, "exit_code", Error.exit_code)

    def __str__(self):
        tail = ("; rolled back, the workload runs as before" if self.rolled_back
                else "; the rollback failed too: the group stays held; fix the cause and run "
                     "`criu-gpushare resume` to retry it (`criu-gpushare status` shows each process)")
        return f"suspend failed at step {self.step}: {self.cause}{tail}"


def driver_lock():
    """The node-wide lock around driver checkpoint calls (two processes calling at once hang the
    driver): ck.DEFAULT_LOCK_PATH as root, else a file in this user's state directory."""
    from .holder import state_dir
    if os.geteuid() == 0:
        return ck.DriverLock()
    return ck.DriverLock(os.path.join(state_dir(), "driver.lock"))


class ResumeFailed(Error):
    """{} failed: {}"""

    def __init__(self, step, cause):
        super().__init__(step, cause)
        self.step, self.cause = step, cause
        self.exit_code = getattr(cause, "exit_code", Error.exit_code)

    def __str__(self):
        return (f"resume failed at step {self.step}: {self.cause}; the processes stay suspended "
                "(their GPU work held, their GPU memory in the store): fix the cause and resume again")


@dataclasses.dataclass
class Options:
    store: str
    timeout_s: float = 60.0        # quiesce and lock
    ref: str = ""                  # the store ref naming this checkpoint
    gpu_map: dict = None           # {old uuid: new uuid} for resume
    verify: bool = False


class Group:
    """One suspended (or suspending) group: its plan and what has been done to it."""

    def __init__(self, pids, options, report=print):
        self.pids = sorted(set(pids))
        self.options, self.report = options, report
        self.members = []
        self.units, self.attachments = [], []
        self.manifest = None
        self.done = []            # steps completed, for rollback and status
        self.freezer = Freezer()
        self.stats = CopyStats()
        self.times = {}
        self.gpus = []

    # -- helpers -------------------------------------------------------------------------------

    @property
    def shim_pids(self):
        return [m.pid for m in self.members if m.status is not None]

    def _each_shim(self, cmd, pids=None, **fields):
        """Send cmd to each shim in turn; the first failure raises (naming the pid)."""
        for pid in self.shim_pids if pids is None else pids:
            control.request(pid, cmd, timeout=600, **fields)

    def _timed(self, step, fn, record=True):
        """Run a step. It is recorded as done before it runs: a step that fails half-way (two of
        three shims released) is undone like a finished one, and every undo tolerates that."""
        self.report(f"{step}...")
        if record:
            self.done.append(step)
        t = time.monotonic()
        fn()
        self.times[step] = time.monotonic() - t
        if record and os.environ.get(FAULT_ENV) == step:
            raise Error(f"fault injected after step {step} ({FAULT_ENV})")

    # -- suspend -------------------------------------------------------------------------------

    def suspend(self):
        self.members = grp.discover(self.pids)
        grp.check(self.members)
        self.units, self.attachments = grp.plan(self.members)
        steps = [("quiesce", self._quiesce), ("save", self._save), ("release", self._release),
                 ("void", self._void), ("lock", self._lock), ("freeze", self._freeze),
                 ("checkpoint", self._checkpoint)]
        for name, fn in steps:
            try:
                self._timed(name, fn)
            except Error as e:
                ok = self._rollback()
                raise StepFailed(name, e, rolled_back=ok) from e
        return self.summary("suspended")

    def _quiesce(self):
        deadline = time.monotonic() + self.options.timeout_s
        while True:
            try:
                for pid in self.shim_pids:
                    control.quiesce(pid, timeout_ms=2000)
                return
            except BusyError as e:
                self._reopen_gates()
                if time.monotonic() > deadline:
                    raise BusyError(f"GPU work did not drain within {self.options.timeout_s:g}s ({e})") from e
                time.sleep(QUIESCE_RETRY_S)
            except Error:
                self._reopen_gates()
                raise

    def _reopen_gates(self):
        for pid in self.shim_pids:
            try:
                control.resume(pid)
            except Error as e:
                self.report(f"warning: reopening the gates of pid {pid}: {e}")

    def _export_fd(self, unit):
        cmd = "export" if unit.kind == "allocation" else "export-import"
        reply, fds = control.request(unit.owner, cmd, id=unit.id, timeout=60)
        if len(fds) != 1:
            for fd in fds:
                os.close(fd)
            raise ShimError(f"process {unit.owner}: {cmd} {unit.id} sent {len(fds)} fds, not 1")
        return fds[0]

    def _save(self):
        with Store.open(self.options.store, create=True) as store, store.begin_write(self.options.ref) as session:
            processes = {}
            with CopyEngine(session, progress=self._progress(sum(u.size for u in self.units), "saved")) as engine:
                for unit in self.units:
                    fd = self._export_fd(unit)
                    try:
                        with ImportedAllocation(fd, unit.size, unit.device) as mem:
                            alloc, stats = engine.save(unit.key, mem.ptr, unit.size, unit.device,
                                                       meta={"kind": unit.kind, "id": unit.id,
                                                             "device": unit.device, "origin": list(unit.origin)})
                    finally:
                        os.close(fd)
                    self.stats.add(stats)
                    processes.setdefault(unit.owner, []).append(alloc)
            self.manifest = Manifest([ProcessEntry(pid, allocs) for pid, allocs in sorted(processes.items())],
                                     meta={"pids": self.pids, "gpus": self._gpu_uuids()})
            session.commit(self.options.ref, self.manifest)

    def _gpu_uuids(self):
        from ..gpu.driver import gpus
        self.gpus = [uuid for _, _, uuid in gpus()]
        return self.gpus

    def _progress(self, total, verb):
        state = {"done": 0, "next": 0.0}

        def progress(n):
            state["done"] += n
            now = time.monotonic()
            if now >= state["next"] or state["done"] >= total:
                state["next"] = now + 1.0
                self.report(f"  {verb} {_size(state['done'])} / {_size(total)}")
        return progress

    def _release(self):
        # Every importer first, then the owners: a failure half-way never leaves an import mapping
        # memory that the rollback re-creates elsewhere.
        self._each_shim("release", only="imports")
        self._each_shim("release")

    def _void(self):
        self._each_shim("void-exports")

    def _lock(self):
        with driver_lock():
            ck.raise_first(ck.lock_all(self.pids_with_cuda(), int(self.options.timeout_s * 1000)))

    def _checkpoint(self):
        with driver_lock():
            ck.raise_first(ck.checkpoint_all(self.pids_with_cuda()))

    def _freeze(self):
        # Only processes with CUDA state lose mappings at the checkpoint; the others run on.
        for pid in self.pids_with_cuda():
            self.freezer.freeze(pid, {ck.restore_thread_id(pid)})

    def pids_with_cuda(self):
        return [m.pid for m in self.members if m.cuda]

    # -- resume and rollback -------------------------------------------------------------------

    def resume(self, gpu_map=None):
        """Bring the group back; on failure its GPU work stays held and resume can be retried."""
        self.times = {}
        t0 = time.monotonic()
        undo = [("checkpoint", "restore", lambda: self._restore(gpu_map)),
                ("lock", "unlock", self._unlock),
                # Once the driver has restored its memory nothing a CPU thread touches is unmapped
                # (GPU work stays held at the gates), and a thread frozen inside the shim's state
                # lock would block every shim command below.
                ("freeze", "thaw", self.freezer.thaw),
                ("release", "recreate", self._recreate),
                ("release", "load", self._load),
                ("release", "attach", self._attach),
                ("quiesce", "reopen", lambda: self._each_shim("resume"))]
        self.load_stats = CopyStats()
        for done_step, step, fn in undo:
            if done_step in self.done:
                try:
                    self._timed(step, fn, record=False)
                except Error as e:
                    raise ResumeFailed(step, e) from e
        for done_step, _, _ in undo:  # forgotten only once everything worked: a retry redoes all
            while done_step in self.done:
                self.done.remove(done_step)
        self.done.clear()
        self.times["total"] = time.monotonic() - t0
        return self.summary("resumed", self.load_stats)

    def _restore(self, gpu_map):
        pairs = []
        checkpointed_gpus = (self.manifest.meta.get("gpus") if self.manifest else None) or self.gpus
        if checkpointed_gpus:
            from ..gpu.driver import gpus
            pairs = ck.gpu_map(checkpointed_gpus, [u for _, _, u in gpus()], gpu_map)
        todo = [p for p in self.pids_with_cuda() if ck.state(p) is ck.State.CHECKPOINTED]
        with driver_lock():
            ck.raise_first(ck.restore_all(todo, pairs))

    def _unlock(self):
        locked = [p for p in self.pids_with_cuda() if ck.state(p) is ck.State.LOCKED]
        with driver_lock():
            ck.raise_first(ck.unlock_all(locked))

    def _recreate(self):
        for pid in self.shim_pids:
            control.request(pid, "recreate", timeout=600)
        for unit in self.units:
            if unit.kind == "import":
                control.request(unit.owner, "adopt", id=unit.id, timeout=600)

    def _load(self):
        with Store.open(self.options.store) as store:
            allocs = {a.key: a for p in self.manifest.processes for a in p.allocations}
            total = sum(u.size for u in self.units)
            with CopyEngine(store, verify_loads=self.options.verify,
                            progress=self._progress(total, "loaded")) as engine:
                for unit in self.units:
                    fd = self._export_fd(unit)
                    try:
                        with ImportedAllocation(fd, unit.size, unit.device) as mem:
                            self.load_stats.add(engine.load(allocs[unit.key], mem.ptr, unit.device))
                    finally:
                        os.close(fd)

    def _attach(self):
        for a in self.attachments:
            fd = self._export_fd(a.unit)
            try:
                control.request(a.importer, "attach", fds=(fd,), id=a.import_id, timeout=600)
            finally:
                os.close(fd)

    def _rollback(self):
        """Undo the steps done so far; True when the workload runs as before."""
        try:
            self.report(f"rolling back ({', '.join(reversed(self.done))})")
            self.resume()
            return True
        except Error as e:
            self.report(f"rollback failed: {e}")
            return False

    def summary(self, what, stats=None):
        s = stats or self.stats
        return {"state": what, "pids": self.pids, "ref": self.options.ref,
                "seconds": {k: round(v, 3) for k, v in self.times.items()},
                "bytes": {"copied": s.copied, "written": s.written, "deduplicated": s.deduplicated,
                          "zero": s.zero},
                "units": len(self.units), "attachments": len(self.attachments)}


def format_summary(summary):
    """The final line: time per phase, bytes copied, written, deduplicated."""
    secs = summary["seconds"]
    b = summary["bytes"]
    phases = ", ".join(f"{k} {v:.2f}s" for k, v in secs.items())
    moved = "copied" if summary["state"] != "resumed" else "loaded"
    return (f"{summary['state']} {len(summary['pids'])} process(es): {phases}; "
            f"{_size(b['copied'])} {moved}, {_size(b['written'])} written, "
            f"{_size(b['deduplicated'])} deduplicated, {_size(b['zero'])} zero")


def _size(n):
    for unit, scale in (("GiB", 2 ** 30), ("MiB", 2 ** 20)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n / 2 ** 20:.2f} MiB" if n else "0 B"

