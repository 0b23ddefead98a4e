"""The steps that take a group's GPU state out and bring it back, each one function, and the lists
they are run in (by engine/runner.py, which records them and rolls back).

Out (IN_PLACE; CRIU's pre-dump adds vacate and stop, CRIU_PRE_DUMP). The driver's checkpoint runs
beside the save: the processes drop their memory first, each owner's shim keeping an fd of it, and
this process copies it out of those fds while the driver checkpoints them (the checkpoint, about
0.4 s, no longer waits for the whole save). Were this process to die before the save is in the
store, the kept fds still hold the memory in its processes, and the way back maps it again.
  quiesce   every shim closes its launch gate, drains, closes its memory gate, drains (sequentially;
            a busy shim makes every gate reopen, and the whole quiesce is retried until the timeout);
            then the plan is made again, as the group's memory is now
  release   once every shim is seen to hold exactly the memory planned (else the suspend rolls
            back), every shim drops its imports, then its own memory (VA reservations kept),
            keeping an fd of each allocation, and unregisters host memory; this process takes an
            fd of every unit then (the save must not need a shim whose threads are frozen). Memory
            that only an importer holds (its exporter freed it) cannot be kept: a group with such
            memory, or with more units than this process may open fds, is saved here first, as
            the save step below would, and its checkpoint waits for the save as before
  void      exported fds the applications still hold are pointed at /dev/null (they would pin the
            dropped memory, and CRIU cannot dump them)
  lock      cuCheckpointProcessLock of every pid at once, with a timeout
  freeze    every CPU thread stopped with ptrace, except the driver's restore thread and the shim's
            (before the checkpoint unmaps memory those threads could touch)
  checkpoint cuCheckpointProcessCheckpoint of every pid at once, begun in a thread
  save      every unit of GPU memory (engine/plan.py), from the fds taken at release, imported into
            this process and streamed to the chunk store; a manifest and a ref are committed
            (durable); then the checkpoint is waited for (its failure is the step's)
  unkeep    every shim closes the fds it kept (drop-kept, which needs no lock an application
            thread could hold): the memory is freed, the store holds it
  vacate    (CRIU only) no process still holds a /dev/nvidia* file or mapping: CRIU could not dump it
  stop      (CRIU only) the frozen processes handed over stopped (SIGSTOP, then let go): no thread
            of theirs runs again before the driver restore, whatever CRIU does in between (it dumps
            and restores them stopped, and leaves them stopped when they run on)
Back (UNDO: each runs when the step it undoes was begun):
  restore   stopped processes taken back (every thread frozen but the driver's restore thread and
            the shim's, then SIGCONT); threads that run again (a dead holder) frozen again; then
            cuCheckpointProcessRestore of every CHECKPOINTED pid at once (GPU map by UUID); a failure
            leaves every pid as it is (after CRIU: stopped again), and resume can be retried
  unlock    only once every pid is restored, so no process runs without its peers
  thaw      CPU threads restarted (nothing they touch is unmapped any more; their GPU work stays
            waiting at the gates until reopen); signals that arrived meanwhile are delivered
  recreate  owners re-create their memory at the same addresses (adopters re-create adopted memory);
            memory still kept (a save that did not finish) comes back itself, bytes and all
  load      each unit's bytes come back from the store through this process (or from its own GPU
            memory, where engine/ahead.py read them ahead while the steps above ran); units that
            came back intact are not loaded
  attach    importers map the owners' memory again at their own addresses
  reopen    host memory re-registered at the same device pointers, gates opened
"""
import contextlib
import dataclasses
import functools
import os
import resource
import threading
import time

from .. import waits
from ..errors import BusyError, Error, ProcessError, StoreError
from ..gpu import checkpoint_api as ck, driver as drv
from ..gpu.copy_engine import CopyEngine, CopyStats, LoadItem, SaveItem, ring_shape
from ..gpu.devices import DeviceMap, workload_devices_map
from ..gpu.memory import ImportedAllocation, fault_in_ahead, retain_ahead
from ..shimctl import client as control
from ..store.manifest import Manifest, ProcessEntry
from ..store.backend import open_store
from . import plan
from .exports import Exports, export_one
from .faults import fault_point
from .handover import HandOver, check_vacated
from .results import size

QUIESCE_RETRY_S = 0.25
FD_MARGIN = 256  # fds this process keeps free beside those of the units it holds for the save
QUIESCE_ANSWER_S = 1.0  # a shim's busy answer, after its drain stages used what was left

# The step lists (run by engine/runner.py).
IN_PLACE = ("quiesce", "release", "void", "lock", "freeze", "checkpoint", "save", "unkeep")
# CRIU seizes the tasks itself, but only after pre-dump returns: the threads are frozen around the
# driver checkpoint (the long call that unmaps what they could touch) and handed over stopped, so
# that none runs between our freeze and CRIU's seize, nor between CRIU's restore and ours (JAX's
# runtime threads crash in that window); the way back takes them again (see _restore).
CRIU_PRE_DUMP = IN_PLACE + ("vacate", "stop")
# Resume and rollback: (step whose effect it undoes, undo step), in the order they run. An undo runs
# when the step it undoes is recorded as done (begun).
UNDO = (("checkpoint", "restore"),
        ("lock", "unlock"),
        # Once the driver has restored its memory nothing a CPU thread touches is unmapped (GPU work
        # stays waiting at the gates), and a thread frozen inside the shim's state lock would block
        # every shim command below.
        ("freeze", "thaw"),
        ("release", "recreate"),
        ("release", "load"),
        ("release", "attach"),
        ("quiesce", "reopen"))


class Beside:
    """work() run in a thread of its own, now; wait() -> its seconds, or raises its error."""

    def __init__(self, work, name):
        self._error, self._seconds = None, 0.0

        def run():
            t = time.monotonic()
            try:
                work()
            except BaseException as e:  # noqa: BLE001 - raised again by wait()
                self._error = e
            self._seconds = time.monotonic() - t
        self._thread = threading.Thread(target=run, name=name, daemon=True)
        self._thread.start()

    def wait(self):
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._seconds


def new_ref(kind, pid):
    """The store ref of a new checkpoint: what made it, of which process, when."""
    return f"{kind}-{pid}-{time.strftime('%Y%m%dT%H%M%S')}"


@dataclasses.dataclass
class Options:
    store: str
    timeout_s: float = 60.0        # each step's waits on the group (--timeout; README "Timeouts")
    ref: str = ""                  # the store ref naming this checkpoint
    gpu_map: dict = None           # {old uuid: new uuid} for resume
    verify: bool = True            # check every chunk a load reads against its name
    hold_kind: str = "suspension"  # what holds the ref in the store ("dump" for a CRIU dump)
    cache: str = None              # the node cache, read before the store on the way back
    cache_limit: int = None
    pin_ahead: bool = False        # the save's process loads next (a suspend's holder): CopyEngine

    @classmethod
    def from_settings(cls, settings, ref, **more):
        """A run's options from its settings (engine/settings.py): the one place they are made,
        for every job (engine/jobs.py, engine/suspension.py)."""
        fields = {"store": settings.store, "timeout_s": settings.timeout_s, "ref": ref,
                  "verify": settings.verify, "cache": settings.cache, "cache_limit": settings.cache_limit}
        return cls(**{**fields, **more})

    def stored(self):
        """The options whole, as the journal and the image record keep them."""
        return dataclasses.asdict(self)

    @classmethod
    def from_stored(cls, data, **override):
        """The options a journal kept: whole ("options"), or as older journals had them (store,
        ref, verify, cache, cache_limit beside the other fields); `override` wins."""
        if isinstance(data.get("options"), dict):
            fields = {f.name for f in dataclasses.fields(cls)}
            kept = {k: v for k, v in data["options"].items() if k in fields}
        else:
            kept = {"store": data["store"], "ref": data["ref"], "verify": data.get("verify", True),
                    "cache": data.get("cache"), "cache_limit": data.get("cache_limit")}
        return cls(**{**kept, **override})


class Group:
    """One group being suspended, dumped or restored: its plan, and a function per step (its
    threads across the checkpoint and CRIU's hand-over are engine/handover.py's, what it reports
    engine/results.py's).

    The plan (members, units, attachments, GPUs) and the steps done are kept in `state()`, which
    the journal stores, so that another process can rebuild the group with `from_state` and finish
    or undo what this one began.
    """

    def __init__(self, pids, options, report=print):
        self.pids = sorted(set(pids))
        self.options, self.report = options, report
        self.members = []
        self.units, self.attachments = [], []
        self.manifest = None
        self.done = []            # steps begun, in order, for rollback and status
        self.handover = HandOver()  # its threads while checkpointed, CRIU's hand-over
        self.stats = CopyStats()
        self.times = {}           # seconds per step (and per stretch between them), in order
        self.parts = {}           # step -> {part: seconds}: parts timed inside a step (phases())
        self.gpus = []
        self.manifest_id = None
        self._device_map = None
        self.loading_ahead = None  # a gpu/staging.StagedLoad the load takes from (engine/ahead.py)
        self.registered = {}      # chunk id -> gpu/file_pages.FilePages: copied in place by loads
        self.held = None          # Exports: an fd of every unit, taken at release for the save
        self.checkpointing = None  # Beside: the driver's checkpoint, running beside the save
        self.overlapped = {}      # seconds of work that ran beside a step (not phases: no sum)
        self.deadline = waits.Deadline(options.timeout_s)  # the running step's (see begin_step)

    def begin_step(self, undo=False):
        """A new deadline for the waits of the step about to run: --timeout for a step of a
        suspend or dump, UNDO_WAIT_S for one of a resume or rollback (waits.py)."""
        self.deadline = waits.Deadline(waits.UNDO_WAIT_S if undo else self.options.timeout_s)

    def discover(self):
        """Read every process's shim and driver state and make the plan; refuse, before anything
        changes, what cannot be handled (engine/plan.py)."""
        self.begin_step()
        started = drv.start_seconds()
        self.members = plan.discover(self.pids, self.deadline)
        if drv.background_start_seconds() is not None:  # begun beside other work: not a phase
            self.overlapped["CUDA start (bindings, cuInit)"] = drv.background_start_seconds()
        elif started is None and drv.start_seconds() is not None:  # the state queries started CUDA
            self.parts["discover"] = {"discover: CUDA start (bindings, cuInit)": drv.start_seconds()}
        self._plan()
        # the save's contexts are made while the journal is written and the shims quiesce (its
        # ring is not pinned meanwhile: that slowed the release beside it, bench/RESULTS.md
        # "nineteenth"; a suspend's holder pins it from the save's start, CopyEngine's pin_ahead,
        # its pages faulted in from now on: no driver call in that)
        retain_ahead(sorted({self.tool_device(u) for u in self.units}))
        if self.options.pin_ahead and self.units:
            fault_in_ahead(*ring_shape(sum(u.size for u in self.units)))
        self.gpus = [uuid for _, _, uuid in drv.gpus()] if self.pids_with_cuda() else []

    @property
    def has_gpu_state(self):
        return bool(self.pids_with_cuda())

    # -- the durable form (engine/journal.py) --------------------------------------------------

    def state(self):
        return {"pids": self.pids, "gpus": self.gpus, "done": list(self.done),
                "restore_tids": {str(p): t for p, t in self.handover.restore_tids.items()},
                "members": [plan.member_state(m) for m in self.members],
                "units": [plan.unit_state(u) for u in self.units],
                "attachments": [plan.attachment_state(a) for a in self.attachments]}

    @classmethod
    def from_state(cls, state, options, report=print, manifest=None):
        group = cls(state["pids"], options, report)
        group.gpus = state["gpus"]
        group.done = list(state["done"])
        group.handover = HandOver({int(p): t for p, t in state.get("restore_tids", {}).items()})
        group.members = [plan.member_from_state(m) for m in state["members"]]
        group.units = [plan.unit_from_state(u) for u in state["units"]]
        by_key = {u.key: u for u in group.units}
        group.attachments = [plan.attachment_from_state(a, by_key) for a in state["attachments"]]
        group.manifest = manifest
        return group

    def drop_dead(self):
        """Members that died (a crash during a step): reported and left out of what follows, so
        that the rest of the group still comes back; memory only they had is lost with them."""
        from .statedir import start_time
        dead = [p for p in self.pids if start_time(p) is None]
        if not dead:
            return []
        self.report(f"process(es) {', '.join(map(str, dead))} of the group died: left out, the "
                    "others are brought back")
        gone = set(dead)
        self.pids = [p for p in self.pids if p not in gone]
        self.members = [m for m in self.members if m.pid not in gone]
        self.units = [u for u in self.units if u.owner not in gone]
        self.attachments = [a for a in self.attachments
                            if a.importer not in gone and a.unit.owner not in gone]
        return dead

    @property
    def shim_pids(self):
        return [m.pid for m in self.members if m.status is not None]

    def pids_with_cuda(self):
        return [m.pid for m in self.members if m.cuda]

    def _each_shim(self, cmd, **fields):
        """Send cmd to each shim in turn; the first failure raises (naming the pid)."""
        for pid in self.shim_pids:
            control.request(pid, cmd, timeout=self.deadline.left(), **fields)

    def _open_gates(self, deadline):
        """Every shim's gates opened again, each tried even when one fails (a stopped or stuck
        process does not keep the others waiting) -> the failures, naming their pids."""
        failed = []
        for pid in self.shim_pids:
            try:
                control.resume(pid, timeout=deadline.left())
            except Error as e:
                failed.append(e)
        return failed

    def _reopen(self):
        failed = self._open_gates(self.deadline)
        if failed:
            raise failed[0]

    def step(self, name):
        """The function that carries out step `name` (of a step list or of UNDO)."""
        return {"quiesce": self._quiesce, "save": self._save_beside, "release": self._release,
                "void": self._void, "lock": self._lock, "freeze": self._freeze,
                "checkpoint": self._checkpoint, "unkeep": self._unkeep,
                "restore": self._restore, "unlock": self._unlock,
                "thaw": self.handover.thaw, "recreate": self._recreate, "load": self._load,
                "attach": self._attach, "reopen": self._reopen,
                "vacate": self._check_vacated, "stop": self._hand_over}[name]

    # -- suspend -------------------------------------------------------------------------------

    def _quiesce(self):
        deadline = self.deadline
        while True:
            try:
                for pid in self.shim_pids:
                    # The shim's two drain stages fit in what is left; its busy answer may come
                    # QUIESCE_ANSWER_S after (README, "Timeouts").
                    stage_ms = max(1, min(2000, int(deadline.left() * 1000 / 2)))
                    control.quiesce(pid, timeout_ms=stage_ms, timeout=deadline.left() + QUIESCE_ANSWER_S)
                self._replan()
                return
            except BusyError as e:
                self._reopen_gates()
                if deadline.left() < QUIESCE_RETRY_S:  # no time for another round
                    raise BusyError(f"GPU work did not drain within {self.options.timeout_s:g}s ({e})") from e
                time.sleep(QUIESCE_RETRY_S)
            except Error:
                self._reopen_gates()
                raise

    def _replan(self):
        """The plan again, now that the group's GPU work waits at the gates: memory allocated or
        freed since discover (a pool's churn, a late tensor) is planned as it is now."""
        for m in self.members:
            if m.status is not None:
                m.status = control.status(m.pid, timeout=self.deadline.left())
        self._plan()

    def _plan(self):
        plan.check(self.members, self.deadline)
        self.units, self.attachments = plan.make_plan(self.members)

    def _check_unchanged(self):
        """Right before anything is released, every shim must still hold exactly the memory that
        was saved: a release would drop memory that nobody saved."""
        for m in self.members:
            if m.status is None:
                continue
            st = control.status(m.pid, timeout=self.deadline.left())
            have = ({("allocation", a["id"]) for a in st.get("allocations", [])}
                    | {("import", i["id"]) for i in st.get("imports", [])})
            saved = ({(u.kind, u.id) for u in self.units if u.owner == m.pid}
                     | {("import", a.import_id) for a in self.attachments if a.importer == m.pid})
            if have != saved:
                raise ProcessError(m.pid, f"allocated or freed GPU memory while it was being "
                                   f"suspended ({len(have - saved)} new, {len(saved - have)} gone "
                                   "since the save): nothing was released and it runs on; "
                                   "suspend it again")

    def _reopen_gates(self):
        """After a busy or failed quiesce: a cleanup, with the bound of an undo step."""
        for e in self._open_gates(waits.Deadline(waits.UNDO_WAIT_S)):
            self.report(f"warning: reopening the gates: {e}")

    def tool_device(self, unit):
        """This process's ordinal of the GPU unit's memory is on now (after a --gpu-map restore,
        the mapped one): the workload's ordinal means nothing here."""
        if unit.gpu is None:
            return unit.device
        if self._device_map is None:  # read from the driver once, when first needed
            self._device_map = DeviceMap.here()
        return self._device_map.ordinal((self.options.gpu_map or {}).get(unit.gpu, unit.gpu))

    def _devices_field(self, pid):
        """recreate/adopt's devices map for pid under --gpu-map (empty: nothing moves)."""
        member = next((m for m in self.members if m.pid == pid), None)
        devices = workload_devices_map(member.devices or {}, self.options.gpu_map) if member else ""
        return {"devices": devices} if devices else {}

    @contextlib.contextmanager
    def _mapped(self, unit, exports):
        """unit's memory mapped in this process (its owner's shim exports an fd): the pointer."""
        fd = exports.take(unit)
        try:
            with ImportedAllocation(fd, unit.size, self.tool_device(unit)) as mem:
                yield mem.ptr
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def _mapped_for_save(self, unit, exports):
        with self._mapped(unit, exports) as ptr:
            yield ptr
        fault_point("copy")  # between two units: part of the memory is in the store

    def _save_beside(self):
        """The save step: the copy (unless the release saved first), then the checkpoint that ran
        beside it waited for."""
        if self.manifest_id is None:
            self._save()
        t = time.monotonic()
        self._wait_checkpoint()
        self.parts.setdefault("save", {})["save: wait for the checkpoint beside it"] = time.monotonic() - t

    def _save(self):
        exports, self.held = self.held or Exports(self.units, self.options.timeout_s), None
        with contextlib.ExitStack() as stack:
            exports = stack.enter_context(exports)  # closes the fds not taken, whatever happens
            store = stack.enter_context(open_store(self.options.store, create=True))
            session = stack.enter_context(store.begin_write(self.options.ref))
            processes = {}
            total = sum(u.size for u in self.units)
            items = [SaveItem(u.key, u.size, self.tool_device(u),
                              functools.partial(self._mapped_for_save, u, exports),
                              {"kind": u.kind, "id": u.id, "device": u.device, "origin": list(u.origin)})
                     for u in self.units]
            step = CopyStats()  # this step's own totals (self.stats sums every step)
            with CopyEngine(session, progress=self._progress(total, "saved"), total_bytes=total,
                            pin_ahead=self.options.pin_ahead) as engine:
                for unit, (alloc, stats) in zip(self.units, engine.save_all(items)):
                    self.stats.add(stats)
                    step.add(stats)
                    processes.setdefault(unit.owner, []).append(alloc)
            self.manifest = Manifest([ProcessEntry(pid, allocs) for pid, allocs in sorted(processes.items())],
                                     meta={"pids": self.pids, "gpus": self.gpus})
            # Held before the ref exists: no `store rm` can slip in between (store/holds.py).
            store.hold(self.options.ref, self.options.hold_kind, pid=self.pids[0])
            t = time.monotonic()
            self.manifest_id = session.commit(self.options.ref, self.manifest)
            self.parts.setdefault("save", {}).update({**memory_parts("save", step, engine, exports),
                                  "store commit (sync, manifest, ref)": time.monotonic() - t})

    def _progress(self, total, verb):
        """A line a second on long copies: bytes so far, rate, time left."""
        state = {"done": 0, "next": 0.0, "start": time.monotonic()}

        def progress(n):
            state["done"] += n
            now = time.monotonic()
            if now >= state["next"] or state["done"] >= total:
                state["next"] = now + 1.0
                rate = state["done"] / max(now - state["start"], 1e-6)
                left = (total - state["done"]) / rate if rate else 0.0
                self.report(f"  {verb} {size(state['done'])} / {size(total)}, "
                            f"{rate / 1e9:.1f} GB/s, {left:.0f} s left")
        return progress

    def _release(self):
        self._check_unchanged()
        keep = self._can_keep()
        if not keep:
            t = time.monotonic()
            self._save()  # in the store before anything is dropped, as the save step would
            self.parts.setdefault("release", {})["release: save first (memory that cannot be kept)"] = \
                time.monotonic() - t
        # Every importer first, then the owners: a failure half-way never leaves an import mapping
        # memory that the rollback re-creates elsewhere.
        self._each_shim("release", only="imports")
        if keep:
            self._each_shim("release", keep="fds")
            self.held = Exports(self.units, self.deadline.left())
            self.held.fetch_all()
        else:
            self._each_shim("release")

    def _can_keep(self):
        """Whether the save can run after the release, beside the checkpoint: every unit is an
        allocation its owner's shim can keep, and this process may hold an fd of each at once."""
        if any(u.kind != "allocation" for u in self.units):
            return False
        # not raised here: CRIU, started from this process, sets its own limit from this one
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        return soft == resource.RLIM_INFINITY or \
            len(self.units) + len(os.listdir("/proc/self/fd")) + FD_MARGIN <= soft

    def _unkeep(self):
        self._each_shim("drop-kept")

    def _void(self):
        self._each_shim("void-exports")

    def _driver_lock(self):
        """The node-wide driver lock, waited for within the step's deadline."""
        return ck.DriverLock(timeout_s=self.deadline.left())

    def _lock(self):
        with self._driver_lock():  # two processes calling at once hang the driver
            ms = max(1, int(self.deadline.left() * 1000))
            ck.raise_first(ck.lock_all(self.pids_with_cuda(), ms))

    def _checkpoint(self):
        """Begun in a thread: the save step runs beside it, and waits for it at its end."""
        pids, lock_s = self.pids_with_cuda(), self.deadline.left()

        def checkpoint():
            with ck.DriverLock(timeout_s=lock_s):  # two processes calling at once hang the driver
                ck.raise_first(ck.checkpoint_all(pids))
        self.checkpointing = Beside(checkpoint, "checkpoint")

    def _wait_checkpoint(self):
        """The checkpoint begun beside the save, ended: its failure raised (once)."""
        beside, self.checkpointing = self.checkpointing, None
        if beside is not None:
            try:
                self.overlapped["checkpoint (beside the save)"] = beside.wait()
            except BaseException as e:
                e.failed_step = "checkpoint"  # engine/runner.py names it, not the save
                raise

    def _freeze(self):
        # Only processes with CUDA state lose mappings at the checkpoint; the others run on.
        self.handover.freeze(self.pids_with_cuda(), self.deadline)

    def _hand_over(self):
        self.handover.hand_over(self.pids_with_cuda(), self.deadline)

    def _check_vacated(self):
        check_vacated(self.pids, self.pids_with_cuda(), self.deadline)

    # -- resume and rollback -------------------------------------------------------------------

    def _restore(self):
        if self.checkpointing is not None:  # a rollback while it runs: its outcome is read below
            with contextlib.suppress(Exception):
                self._wait_checkpoint()
        if "stop" in self.done:
            self.handover.take_back(self.pids_with_cuda(), self.deadline)
        todo = [p for p in self.pids_with_cuda()
                if ck.state(p, self.deadline.left()) is ck.State.CHECKPOINTED]
        if "freeze" in self.done:
            self.handover.refreeze(todo, self.deadline)
        pairs = []
        if self.gpus:
            pairs = ck.gpu_map(self.gpus, [u for _, _, u in drv.gpus()], self.options.gpu_map)
        try:
            fault_point("driver-restore")  # tests: the driver restore failing
            with self._driver_lock():  # two processes calling at once hang the driver
                ck.raise_first(ck.restore_all(todo, pairs))
        except BaseException:
            if "stop" in self.done:
                self.handover.hand_back(todo, self.report)
            raise

    def _unlock(self):
        locked = [p for p in self.pids_with_cuda() if ck.state(p, self.deadline.left()) is ck.State.LOCKED]
        with self._driver_lock():  # two processes calling at once hang the driver
            ck.raise_first(ck.unlock_all(locked, self.deadline.left()))

    def _recreate(self):
        if self.held is not None:  # a rollback before the save took them: they pin the memory
            self.held.close()
            self.held = None
        for pid in self.shim_pids:
            control.request(pid, "recreate", timeout=self.deadline.left(), **self._devices_field(pid))
        for unit in self.units:
            if unit.kind == "import":
                control.request(unit.owner, "adopt", id=unit.id, timeout=self.deadline.left(),
                                **self._devices_field(unit.owner))

    def _open_for_load(self):
        return open_for_load(self.options, self.report)

    def _to_load(self):
        """The units whose bytes must come from the store: every one, but allocations their shim
        has whole (kept by a release whose save may not have finished, or re-created from what
        it kept, or never released)."""
        whole = set()
        for m in self.members:
            if m.status is None:
                continue
            for a in control.status(m.pid, timeout=self.deadline.left()).get("allocations", []):
                if "fresh" not in a:  # a shim older than keeping: everything is loaded, as it was
                    continue
                if a["kept"] or a["intact"] or not (a["dropped"] or a["fresh"]):
                    whole.add((m.pid, a["id"]))
        return [u for u in self.units if u.kind != "allocation" or (u.owner, u.id) not in whole]

    def check_loadable(self):
        """Before a resume changes anything: every chunk the load will read is in the store or the
        node cache. StoreError naming the first problems; the group stays as it is. (The shims are
        not asked: the processes may be stopped yet.)"""
        if "release" not in self.done:
            return  # nothing was released: nothing to load
        if "unkeep" not in self.done and not self._ref_exists():
            return  # the save was not stored: the shims still keep the memory, the load reads none
        with self._open_for_load() as store:
            if self.manifest is None:
                self.manifest = store.read_manifest(store.read_ref(self.options.ref).manifest)
            check_readable(store, self.manifest, self.options.ref,
                           "nothing was changed, the processes stay suspended: repair the store "
                           "(or point --store at a copy) and resume again")

    def _ref_exists(self):
        try:
            with self._open_for_load() as store:
                store.read_ref(self.options.ref)
            return True
        except StoreError:
            return False

    def _load(self):
        staged = {}
        try:
            staged = self._loaded_ahead()
            units = self._to_load()
            if not units:
                return  # every unit came back whole (a rollback before its save was stored)
            with self._open_for_load() as store:
                if self.manifest is None:  # a resume in a process other than the one that saved
                    self.manifest = store.read_manifest(store.read_ref(self.options.ref).manifest)
                allocs = {a.key: a for p in self.manifest.processes for a in p.allocations}
                total = sum(u.size for u in units)
                with Exports(units, waits.UNDO_WAIT_S) as exports, \
                        CopyEngine(store, verify_loads=self.options.verify, total_bytes=total,
                                   progress=self._progress(total, "loaded"), registered=self.registered) as engine:
                    items = [LoadItem(allocs[u.manifest_key], self.tool_device(u),
                                      functools.partial(self._mapped, u, exports),
                                      staged=staged.get(u.manifest_key))
                             for u in units]
                    step = CopyStats()  # this step's own totals (self.stats sums every step)
                    loaded = engine.load_all(items)
                    for stats in loaded:
                        self.stats.add(stats)
                        step.add(stats)
                    self.parts.setdefault("load", {}).update(memory_parts("load", step, engine, exports))
                    if staged:  # an item loaded ahead is opened, copied on the GPU, closed
                        self.parts["load"]["load: copy what was loaded ahead (device to device)"] = \
                            sum(s.seconds - s.opening - s.closing for s in loaded if s.ahead)
        finally:
            if self.loading_ahead is not None:  # its GPU memory back before the workload runs on
                t = time.monotonic()
                self.loading_ahead.close()
                self.loading_ahead = None
                if staged:
                    freed = time.monotonic() - t
                    self.parts.setdefault("load", {})["load: free what was loaded ahead"] = freed

    def _loaded_ahead(self):
        """{manifest key: device pointer} of what engine/ahead.py loaded ahead, once it ended; the
        wait for it is a part of the load's time. A failure there is only reported: the load
        reads those allocations from the store itself."""
        if self.loading_ahead is None:
            return {}
        t = time.monotonic()
        ahead = self.loading_ahead
        staged = ahead.wait()
        if ahead.error is not None:
            self.report(f"warning: loading ahead failed, the load reads the store: {ahead.error}")
        elif staged:  # (none where no GPU had the room)
            self.parts.setdefault("load", {})["load ahead (not overlapped)"] = time.monotonic() - t
            self.stats.in_place += ahead.in_place
            self.report(f"loaded {size(ahead.bytes)} ahead in {ahead.seconds:.2f} s")
        return staged

    def _attach(self):
        for a in self.attachments:
            fd = export_one(a.unit, self.deadline.left())
            try:
                control.request(a.importer, "attach", fds=(fd,), id=a.import_id,
                                timeout=self.deadline.left())
            finally:
                os.close(fd)

    def release_holds(self):
        """The group is back: its checkpoint no longer needs protecting from `store rm`. Best
        effort: the workload runs either way, and a stale hold only delays `store rm`."""
        from ..store.backend import may_exist
        if not may_exist(self.options.store):
            return  # never created: it holds nothing of ours
        try:
            with open_store(self.options.store) as store:
                for info in store.holds(self.options.ref):
                    if info.pid in self.pids:
                        store.release_hold(info)
        except StoreError as e:
            self.report(f"warning: releasing the store's hold on {self.options.ref}: {e}")


def memory_parts(verb, step, engine, exports):
    """The parts of a save or load step outside its copies: opening and closing the processes'
    memory (`step`: the step's CopyStats; the opening's wait for the shims' fds, `exports`, a part
    of its own) and the engine's making ready."""
    return {f"{verb}: fds from the shims": exports.seconds,
            f"{verb}: open memory (import, map)": max(0.0, step.opening - exports.seconds),
            f"{verb}: close memory (unmap, release)": step.closing,
            f"{verb}: GPU start (context, stream, hasher)": engine.setup["start"],
            f"{verb}: pin the ring": engine.setup["pin"]}


def open_for_load(options, report=print):
    """The store, read through the node cache where one is configured (what `store prefetch`
    filled); a cache that cannot be opened is skipped with a warning, never fatal."""
    cache = None
    if options.cache:
        from ..store.cache import NodeCache
        try:
            cache = NodeCache.open(options.cache, options.cache_limit)
        except Error as e:
            report(f"warning: node cache {options.cache} not used: {e}")
    return open_store(options.store, cache=cache)


def check_readable(store, manifest, ref, consequence):
    """StoreError when a chunk of manifest is neither in the store nor in its node cache (stat
    only: fast enough before anything changes), naming the first problems and `consequence`."""
    problems = [p for p in store.check_chunks(manifest)
                if store.cache is None or not store.cache.contains(p.chunk)]
    if problems:
        listed = "; ".join(f"{p.kind} {p.path}" + (f" ({p.detail})" if p.detail else "")
                           for p in problems[:5])
        raise StoreError(f"{store.path}: {len(problems)} chunk(s) of {ref} cannot be read: "
                         f"{listed}; {consequence}")
