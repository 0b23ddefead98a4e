"""Garbage collection: remove what no ref reaches and no lease or grace period protects.

The rules are store/FORMAT.md, "Garbage collection". In short, with every time read from the
store's own file system:

    cutoff = min(now - grace, start of the oldest live lease)
    remove a chunk or manifest  iff  no ref reaches it  and  its mtime < cutoff

A writer refreshes a chunk's mtime when it deduplicates against it, so a dump that touched a chunk
after the cutoff keeps it. The check and the removal are not one step, so a condemned file is first
renamed into gc/<run>/ and checked again there: if a writer touched it in between, it goes back.
A writer that touches it after the rename finds it missing and writes it anew.
"""
import fcntl
import os
from dataclasses import dataclass, field

from ..config import DEFAULT_GC_GRACE_S as DEFAULT_GRACE_S
from ..errors import BusyError, StoreError
from . import catalog, fsutil, holds
from .layout import GC_DIR, GC_LOCK, MANIFESTS_DIR, is_chunk_id
from .leases import scan_leases


@dataclass
class GcReport:
    dry_run: bool
    grace_s: float
    cutoff_ns: int = 0
    live_leases: int = 0
    stale_leases_removed: int = 0
    refs: int = 0
    chunks_kept: int = 0
    chunks_kept_young: int = 0
    chunks_removed: int = 0
    bytes_removed: int = 0
    manifests_removed: int = 0
    temps_removed: int = 0
    restored_after_touch: int = 0
    live_holds: int = 0
    stale_holds_removed: int = 0
    ignored: list = field(default_factory=list)


class _Run:
    """One gc run: holds gc.lock and owns gc/<run>/ (the condemned files)."""

    def __init__(self, store):
        self.store = store
        lock_path = os.path.join(store.path, GC_LOCK)
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            self.lock_fd = os.open(GC_LOCK, flags, 0o644, dir_fd=store.root_fd)
        except OSError as e:
            raise StoreError(f"{lock_path}: {fsutil.describe(e)}") from e
        try:
            fcntl.flock(self.lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self.lock_fd)
            raise BusyError(f"{lock_path}: another gc of this store is running") from None
        try:
            self.gc_fd = store.dir_fd(GC_DIR, create=True)
            self.gc_path = os.path.join(store.path, GC_DIR)
            self.undo_crashed_runs()
            self.run_name = "run-" + os.urandom(8).hex()
            os.mkdir(self.run_name, 0o700, dir_fd=self.gc_fd)
            self.run_fd = fsutil.open_dir(os.path.join(self.gc_path, self.run_name),
                                          self.run_name, dir_fd=self.gc_fd)
        except BaseException:
            os.close(self.lock_fd)
            raise
        # "now" by the store's clock: the time the file system gave our new directory.
        self.now_ns = os.fstat(self.run_fd).st_mtime_ns

    def undo_crashed_runs(self):
        """Put back every file an interrupted gc had condemned; this run decides afresh."""
        for run in fsutil.list_dir(self.gc_fd):
            run_path = os.path.join(self.gc_path, run)
            run_fd = fsutil.open_dir(run_path, run, dir_fd=self.gc_fd)
            try:
                for name in fsutil.list_dir(run_fd):
                    self._put_back(run_fd, name)
            finally:
                os.close(run_fd)
            os.rmdir(run, dir_fd=self.gc_fd)

    def _home_fd(self, name):
        """The directory a condemned file came from: its fan-out directory, or manifests/."""
        if is_chunk_id(name):
            return self.store.chunks.fanout_fd(name[:2], create=True)
        return self.store.dir_fd(MANIFESTS_DIR, create=True)

    def _put_back(self, run_fd, name):
        home_fd = self._home_fd(name)
        try:
            os.link(name, name, src_dir_fd=run_fd, dst_dir_fd=home_fd, follow_symlinks=False)
        except FileExistsError:
            pass  # a writer wrote it anew meanwhile: same bytes
        os.unlink(name, dir_fd=run_fd)

    def condemn(self, name, home_fd, cutoff_ns):
        """Remove `name` from `home_fd` unless a writer touched it; returns (removed, size)."""
        try:
            os.rename(name, name, src_dir_fd=home_fd, dst_dir_fd=self.run_fd)
        except FileNotFoundError:
            return False, 0
        st = os.stat(name, dir_fd=self.run_fd, follow_symlinks=False)
        if st.st_mtime_ns >= cutoff_ns:
            self._put_back(self.run_fd, name)
            return False, 0
        os.unlink(name, dir_fd=self.run_fd)
        return True, st.st_size

    def close(self):
        os.close(self.run_fd)
        os.rmdir(self.run_name, dir_fd=self.gc_fd)
        os.close(self.lock_fd)


def collect_garbage(store, grace_s=DEFAULT_GRACE_S, dry_run=False, before_condemn=None):
    """Run gc on an open store; returns a GcReport. Only one gc runs per store at a time.

    Stops before removing anything (StoreError) if any ref or the manifest it names cannot be
    read: what it references would be unknown. `before_condemn(name)` is a test seam.
    """
    if grace_s < 0:
        raise StoreError(f"{store.path}: gc grace period must not be negative ({grace_s})")
    try:
        return _collect(store, grace_s, dry_run, before_condemn)
    except OSError as e:
        what = f" on {e.filename}" if e.filename else ""  # names relative to a store directory
        raise StoreError(f"{store.path}: gc failed{what}: {fsutil.describe(e)}") from e


def _collect(store, grace_s, dry_run, before_condemn):
    report = GcReport(dry_run, grace_s)
    run = _Run(store)
    try:
        grace_ns = int(grace_s * 1e9)
        leases = scan_leases(store, run.now_ns, grace_ns, remove_stale=not dry_run)
        live = [lease for lease in leases if lease.live]
        report.live_leases = len(live)
        report.stale_leases_removed = 0 if dry_run else len(leases) - len(live)
        cutoff = run.now_ns - grace_ns
        if live:
            cutoff = min(cutoff, min(lease.started_ns for lease in live))
        report.cutoff_ns = cutoff

        # Holds: stale ones go; the manifest a live hold recorded is a root like a ref. The tool
        # takes its holds before it commits the ref, so they record none: what protects its
        # checkpoints is the ref, which `store rm` refuses to delete while held. Refs themselves
        # are never removed by gc.
        swept = holds.sweep(store, run.now_ns, dry_run)
        report.live_holds, report.stale_holds_removed = len(swept.live), swept.stale_removed
        live_chunks, live_manifests = _mark(store, report, swept.live)

        for f in store.chunks.scan():
            if not f.is_regular:
                report.ignored.append(os.path.join(store.chunks.path, f.fanout, f.name))
            elif f.is_temp:
                if f.mtime_ns < cutoff:
                    report.temps_removed += 1
                    if not dry_run:
                        store.chunks.remove(f.name, f.fanout)
            elif f.name in live_chunks:
                report.chunks_kept += 1
            elif f.mtime_ns >= cutoff:
                report.chunks_kept_young += 1
            elif dry_run:
                report.chunks_removed += 1
                report.bytes_removed += f.size
            else:
                if before_condemn is not None:
                    before_condemn(f.name)
                removed, size = run.condemn(f.name, store.chunks.fanout_fd(f.fanout), cutoff)
                if removed:
                    report.chunks_removed += 1
                    report.bytes_removed += size
                else:
                    report.restored_after_touch += 1

        mfd = store.dir_fd(MANIFESTS_DIR)
        for mid, _size, mtime, temp, name in catalog.list_manifests(store):
            if mtime >= cutoff or mid in live_manifests:
                continue
            if temp:
                report.temps_removed += 1
                if not dry_run:
                    fsutil.unlink_quiet(name, mfd)
                continue
            if dry_run:
                report.manifests_removed += 1
            elif run.condemn(name, mfd, cutoff)[0]:
                report.manifests_removed += 1
        for name, mtime in catalog.list_ref_temps(store):
            if mtime < cutoff:
                report.temps_removed += 1
                if not dry_run:
                    fsutil.unlink_quiet(name, store.dir_fd("refs"))
    finally:
        run.close()
    return report


def _mark(store, report, live_holds=()):
    """The chunk ids and manifest ids some ref (or live hold) reaches. Any unreadable ref or
    manifest stops the gc; a held manifest that is gone protects nothing."""
    live_chunks, live_manifests = set(), set()
    for mid in sorted({h.manifest for h in live_holds if h.manifest}):
        try:
            manifest = store.read_manifest(mid)
        except StoreError as e:
            if "manifest missing" in str(e):
                continue
            raise StoreError(f"gc stopped before removing anything: {e} (named by a hold)") from e
        live_manifests.add(mid)
        live_chunks.update(cid for cid, _ in manifest.chunk_ids())
    for name in store.list_refs():
        try:
            ref = store.read_ref(name)
            manifest = store.read_manifest(ref.manifest)
        except catalog.RefMissing:
            continue  # removed since the listing: it protects nothing any more
        except StoreError as e:
            raise StoreError(f"gc stopped before removing anything: {e}; fix or remove that "
                             f"checkpoint (criu-gpushare store rm {name})") from e
        report.refs += 1
        live_manifests.add(ref.manifest)
        live_chunks.update(cid for cid, _ in manifest.chunk_ids())
    return live_chunks, live_manifests
