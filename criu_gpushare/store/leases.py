"""Write sessions and their leases: how a dump in progress keeps gc away from its chunks.

A session creates leases/<random>.lease and holds an exclusive flock on it until it ends; the file
records when it started (by the file system's clock). gc never removes a chunk or manifest touched
after the start of a live lease (store/FORMAT.md, "Leases" and "Garbage collection"). A lease
whose flock is free was left by a dead writer; gc removes it once it is older than the grace period
(the age check covers file systems whose locks other nodes cannot see). A live session refreshes
the lease's mtime at most every RENEW_S seconds while it puts chunks.
"""
import fcntl
import json
import os
import socket
import threading
import time
from dataclasses import dataclass

from ..errors import StoreError
from . import fsutil
from .layout import LEASE_SUFFIX, LEASES_DIR, is_temp_name
from .results import PutStatus

RENEW_S = 30.0
#: A lease temp file older than this (or the grace period, if longer) was left by a dead writer.
LEASE_TEMP_MAX_AGE_NS = 600 * 10**9


class Tally:
    """What a write session put: bytes and chunks written, deduplicated and zero (thread-safe)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.bytes = {s: 0 for s in PutStatus}
        self.chunks = {s: 0 for s in PutStatus}

    def _tally(self, result):
        with self._lock:
            self.bytes[result.status] += result.length
            self.chunks[result.status] += 1
        return result

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class WriteSession(Tally):
    """A dump's view of a directory store: put chunks under a lease, then commit a manifest and a
    ref. Thread-safe. (An S3 store's session is s3store.S3WriteSession.)
    """

    def __init__(self, store, purpose=""):
        super().__init__()
        self.store = store
        dfd = store.dir_fd(LEASES_DIR, create=True)
        dir_path = os.path.join(store.path, LEASES_DIR)
        # Lock the lease under a temp name, then give it its name: gc never sees an unlocked
        # lease of a live writer.
        self.name = os.urandom(8).hex() + LEASE_SUFFIX
        fd, tmp = fsutil.create_temp(dfd, dir_path, self.name)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            self.started_ns = os.fstat(fd).st_mtime_ns
            info = {"version": 1, "host": socket.gethostname(), "pid": os.getpid(),
                    "started_ns": self.started_ns, "purpose": purpose}
            fsutil.write_all(fd, memoryview(json.dumps(info).encode() + b"\n"))
            os.rename(tmp, self.name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except OSError as e:
            os.close(fd)
            fsutil.unlink_quiet(tmp, dfd)
            raise StoreError(f"{dir_path}: cannot take a lease: {fsutil.describe(e)}") from e
        self._fd, self._dfd = fd, dfd
        self._path = os.path.join(dir_path, self.name)
        self._renewed = time.monotonic()

    def put(self, data, cid=None):
        """Store.put under this lease; updates the session's counters."""
        return self._count(self.store.put(data, cid))

    def claim_present(self, cid, length):
        """Store.claim_present under this lease, counted like a PRESENT put."""
        result = self.store.claim_present(cid, length)
        return None if result is None else self._count(result)

    def _count(self, result):
        self._tally(result)
        now = time.monotonic()
        with self._lock:
            renew = now - self._renewed > RENEW_S and self._fd >= 0
            if renew:
                self._renewed = now
        if renew:
            os.utime(self._fd)
        return result

    def commit(self, ref_name, manifest, ref_meta=None):
        """Finish a dump: sync the chunks, write the manifest, then the ref. Returns the manifest id.

        The order makes a durable ref imply a durable manifest and durable chunks.
        """
        self.store.sync()
        mid = self.store.write_manifest(manifest)
        self.store.set_ref(ref_name, mid, ref_meta)
        self.store.sync()
        return mid

    def close(self):
        """End the session (the lease goes; chunks not committed are now only under grace)."""
        if self._fd >= 0:
            fsutil.unlink_quiet(self.name, self._dfd)
            os.close(self._fd)
            self._fd = -1


@dataclass(frozen=True)
class LeaseInfo:
    name: str
    started_ns: int
    mtime_ns: int
    locked: bool     # its flock is taken by a live writer (on this node, or a lock-sharing FS)
    live: bool


def scan_leases(store, now_ns, grace_ns, remove_stale=False):
    """Every lease, classified; stale ones (free flock and older than grace) removed on request."""
    dfd = store.dir_fd(LEASES_DIR)
    if dfd is None:
        return []
    out = []
    for name in fsutil.list_dir(dfd):
        if is_temp_name(name):
            # A lease being created (its writer has put nothing yet), or left by a writer that
            # died while creating it: removed once old (it lives for microseconds normally).
            if remove_stale:
                try:
                    st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                    if st.st_mtime_ns < now_ns - max(grace_ns, LEASE_TEMP_MAX_AGE_NS):
                        fsutil.unlink_quiet(name, dfd)
                except FileNotFoundError:
                    pass
            continue
        if not name.endswith(LEASE_SUFFIX):
            continue
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
        except FileNotFoundError:
            continue
        except OSError as e:
            raise StoreError(f"{os.path.join(store.path, LEASES_DIR, name)}: "
                             f"{fsutil.describe(e)}") from e
        try:
            st = os.fstat(fd)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                locked = False
            except BlockingIOError:
                locked = True
            started = st.st_mtime_ns
            try:
                started = int(json.loads(os.pread(fd, 4096, 0))["started_ns"])
            except (ValueError, KeyError, TypeError):
                pass  # unreadable: the file's own time is a safe stand-in
            live = locked or st.st_mtime_ns >= now_ns - grace_ns
            if not live and remove_stale:
                fsutil.unlink_quiet(name, dfd)
            out.append(LeaseInfo(name, min(started, st.st_mtime_ns), st.st_mtime_ns, locked, live))
        finally:
            os.close(fd)
    return out
