"""A CRIU dump's GPU side, in whichever process runs it: `criu-gpushare dump` itself (CRIU's RPC
notifications arrive in that process) or the holder that the hook's `pre-dump` starts.

  begin()       by pre-dump, tasks running: the CRIU_PRE_DUMP steps on the tree's processes with
                CUDA state (their GPU memory to the store, then the driver's checkpoint, so that CRIU
                finds no GPU mapping and no /dev/nvidia* fd), and the record in the image directory.
                From then on CRIU's image goes to the disk as CRIU writes it (criu/images.py
                WriteBack). A failure rolls back: CRIU aborts the dump, the workload runs as
                before. The hook's holder runs it at pre-dump; `criu-gpushare dump` while CRIU
                starts (pre-dump waits for it, and a CRIU that ends before pre-dump finds it
                undone).
  complete()    at post-dump, tasks seized: the store and CRIU's image are durable, the dump is
                marked complete.
  after_criu()  once CRIU has let go of the tasks (its exit): tasks still alive (--leave-running,
                or a dump that failed after pre-dump, which runs no action at all, or whose CRIU
                was killed) get their GPU state back in place; a dump that CRIU did not finish
                leaves no ref in the store, even once post-dump had marked it complete.
CRIU holds the tasks seized between pre-dump and its exit, and no driver checkpoint call can run on
a seized task: that is why the GPU state comes back only after CRIU is done.
"""
import os
import time

from ..criu.images import WriteBack, dump_succeeded
from ..errors import GroupHeld, StoreError
from ..gpu.driver import gpu_inventory
from ..shimctl import client as control
from ..shimctl.processes import process_tree
from ..store import fsutil
from ..store.backend import open_store
from . import journal as jn, record
from .faults import fault_point
from .runner import Runner
from .steps import CRIU_PRE_DUMP, Group
from .suspension import resume_group


class DumpJob:
    def __init__(self, root_pid, images_dir, options, report=print, cancel=None, pids=None):
        """options: engine/steps.py Options (engine/jobs.py builds them), its ref this dump's;
        pids: the tree's, where a holder forked for it has them already (its key is theirs)."""
        self.root_pid, self.images_dir, self.cancel = root_pid, images_dir, cancel
        # before any fork: the group's key is min(pids)
        self.pids = sorted(pids) if pids is not None else sorted(process_tree(root_pid))
        self.report = report
        self.options = options
        self.journal = self.group = None
        self.completed = False
        self.writeback = WriteBack(images_dir)  # from begin() to post-dump

    @property
    def ref(self):
        return self.options.ref

    @property
    def key(self):
        """The group's key (its journal's, and `resume`'s): the lowest pid of the tree."""
        return self.pids[0]

    def set_report(self, report):
        self.report = report
        if self.group is not None:
            self.group.report = report

    def begin(self):
        """-> True when the tree had GPU state (then after_criu must run once CRIU exits)."""
        pids = self.pids
        t = time.monotonic()
        self.journal = jn.Journal.create("dump", pids, jn.DUMPING, options=self.options,
                                         images_dir=self.images_dir)
        try:
            self.group = Group(pids, self.options, self.report)
            self.group.discover()
            self.group.times["discover"] = time.monotonic() - t  # the journal made too
            manifest_id = None
            if self.group.has_gpu_state:
                Runner(self.group, self.journal, self.cancel).run(CRIU_PRE_DUMP, verb="dump")  # records the group
                manifest_id = self.group.manifest_id
            t = time.monotonic()
            nspids = {p: control.ns_pid(p) for p in pids}
            gpus = gpu_inventory() if self.group.has_gpu_state else []
            record.write(self.images_dir, record.make(self.group, self.options.store, self.ref,
                                                      manifest_id, gpus, nspids, control.PROTOCOL,
                                                      options=self.options))
            self.group.times["record"] = time.monotonic() - t
        except GroupHeld as e:
            self.journal.set(state=jn.HELD, error=str(e))
            raise
        except BaseException:
            self._undo_quietly()
            raise
        if not self.group.has_gpu_state:
            self.journal.close()
            return False
        self.journal.set(state=jn.DUMPED)
        self.writeback.start()  # CRIU's dump comes next
        return True

    def _undo_quietly(self):
        """A failure after the steps succeeded (writing the record): undo them, then let go."""
        if self.group is not None and self.group.done:
            try:
                Runner(self.group, self.journal).undo(verb="dump rollback")
            except BaseException as e:
                self.journal.set(state=jn.HELD, error=str(e))
                raise
        if self.group is not None:
            self.group.release_holds()
        drop_ref(self.options.store, self.ref)
        self.journal.close()

    def complete(self):
        """post-dump: make the store durable before CRIU reports success, and CRIU's image too
        (CRIU has closed and flushed its image files by post-dump, but syncs none of them; most
        of them are on their way to the disk already: WriteBack)."""
        self.writeback.stop()
        with open_store(self.options.store) as store:
            store.read_ref(self.ref)  # the ref a restore needs must be there
            store.sync()
            store_dev = store.synced_device()
        sync_image(self.images_dir, skip_dev=store_dev)
        self.completed = True
        self.journal.set(completed=True)
        fault_point("post-dump")

    def after_criu(self, criu_succeeded=None):
        """CRIU has exited: give running tasks their GPU state back; drop the ref of a dump CRIU
        did not finish. criu_succeeded: CRIU's answer where this process has it; else tasks CRIU
        killed mean success, and tasks left running mean success only with CRIU's stats-dump."""
        self.writeback.stop()  # a dump that failed before post-dump
        alive = self.journal.processes_alive()
        if criu_succeeded is None:
            criu_succeeded = not alive or dump_succeeded(self.images_dir, self.journal.data["created"])
        try:
            if alive:
                self.report(f"CRIU is done and process(es) {', '.join(map(str, alive))} run on: "
                            "bringing their GPU state back")
                self.journal.set(state=jn.SUSPENDED)  # what a failed resume leaves them
                resume_group(self.group, self.journal, verb="resume after the dump")
            else:  # CRIU killed them: a completed dump is kept by its image, not by a hold
                self.group.release_holds()
                self.journal.close()
        finally:
            if not (self.completed and criu_succeeded):
                drop_ref(self.options.store, self.ref)


def sync_image(images_dir, skip_dev=None):
    """syncfs of the file system holding images_dir, unless it is skip_dev (already synced)."""
    fd = os.open(images_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        if os.fstat(fd).st_dev != skip_dev:
            fsutil.syncfs(fd, images_dir)
    finally:
        os.close(fd)


def drop_ref(store_path, ref):
    try:
        with open_store(store_path) as store:
            store.remove_ref(ref)
    except StoreError:
        pass  # never written, or the store is gone: nothing refers to it


def forget_if_failed(journal):
    """A dump's journal whose tree was brought back from it (its worker died): its tree runs, so
    CRIU's dump either succeeded with --leave-running (CRIU's stats-dump says so: the ref is the
    image's) or failed (the ref names nothing a restore can use: dropped)."""
    data = journal.data
    if not dump_succeeded(data.get("images_dir") or "", data["created"]):
        drop_ref(data["store"], data["ref"])
