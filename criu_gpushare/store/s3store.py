"""A chunk store in an S3 bucket (s3://BUCKET/PREFIX): the layout of store/FORMAT.md section 1 as
object keys, and the object-store rules of section 14 (no rename, no flock, no mtime refresh).

    <prefix>/store.json, chunks/<xx>/<id>, manifests/<mid>.json, refs/<name>,
    leases/<l>/start, leases/<l>/renew, leases/<l>/claims/<n>, holds/<ref>/<h>.hold, gc/<run>

A put is atomic (an object appears whole or not at all, multipart uploads included) and durable
once it returns, so there are no temp names and sync() has nothing to do. A write session keeps
its lease alive by rewriting leases/<l>/renew from a thread, and *claims* (writes down, in
leases/<l>/claims/) every chunk it deduplicates against before relying on it; gc keeps claimed
chunks, and a commit re-checks them once no gc that may have missed a claim is running. Every time
compared is an object's LastModified, the server's clock.
"""
import concurrent.futures
import json
import os
import socket
import threading
import time

from ..errors import StoreError
from . import catalog, holds as holdlib
from .base import ChunkStore
from .chunkdir import ChunkDamaged, ChunkFile, ChunkMissing, check_bytes
from .layout import (CHUNK_SIZE_MAX, HASH_NAME, HOLD_SUFFIX, MANIFEST_SUFFIX, STORE_FILE,
                     STORE_FORMAT, STORE_VERSION, chunk_id, fanout, is_chunk_id, is_ref_name,
                     manifest_name)
from .leases import RENEW_S, Tally
from .manifest import parse_manifest
from .results import PutResult, PutStatus
from .s3client import DEFAULT_STREAMS, S3Client
from .s3gc import COMMIT_WAIT_S, LEASE_TTL_S, read_leases, wait_for_gcs


def chunk_key(cid):
    return f"chunks/{fanout(cid)}/{cid}"


class S3Store(ChunkStore):
    """An open chunk store under s3://bucket/prefix. Thread-safe; any number of processes and
    nodes may open the same one."""

    def __init__(self, client, cache=None):
        super().__init__(client.url, cache)
        self.client = client

    @classmethod
    def open(cls, url, create=False, cache=None, streams=DEFAULT_STREAMS):
        """Open the store at s3://bucket/prefix (the bucket must exist); with create=True write
        its store.json when missing. Refuses a newer format version, and a prefix that holds
        other objects but no store.json."""
        client = S3Client(url, streams)
        try:
            client.check_bucket()
            store = cls(client, cache)
            store._check_or_write_store_file(create)
            return store
        except BaseException:
            client.close()
            raise

    @staticmethod
    def probe(url):
        """What `doctor` says of the store at URL: its bucket answers with these credentials, and
        whether the store exists yet. Raises StoreError (naming what to fix) when it cannot."""
        client = S3Client(url, streams=1)
        try:
            client.check_bucket()
            if client.head(STORE_FILE) is None:
                return f"{client.where()} at {client.endpoint} (bucket reachable; the store is created by the first dump)"
            return f"{client.where()} at {client.endpoint} (reachable)"
        finally:
            client.close()

    def _check_or_write_store_file(self, create):
        from .store import check_store_doc
        data = self._store_file()
        if data is None:
            if not create:
                raise StoreError(f"{self.client.where(STORE_FILE)}: not a criu-gpushare store (no "
                                 f"{STORE_FILE}); it is created by the first dump")
            if next(iter(self.client.list("")), None) is not None:
                # Another dump may have made the store since we looked, and written into it:
                # its store file is there now. Else the prefix holds something else.
                data = self._store_file()
                if data is None:
                    raise StoreError(f"{self.path}: not empty and not a criu-gpushare store (no "
                                     f"{STORE_FILE}); refusing to turn it into one")
            else:  # two first dumps at once write the same document
                doc = {"format": STORE_FORMAT, "version": STORE_VERSION, "hash": HASH_NAME,
                       "chunk_size_max": CHUNK_SIZE_MAX}
                self.client.put(STORE_FILE, json.dumps(doc, indent=1, sort_keys=True).encode() + b"\n")
                return
        check_store_doc(data, self.client.where(STORE_FILE))

    def _store_file(self):
        """The store file's bytes, or None when there is none."""
        try:
            return self.client.get_small(STORE_FILE, limit=1 << 20)
        except FileNotFoundError:
            return None

    def close(self):
        self.client.close()
        super().close()

    def _map(self, fn, items):
        """fn over items on the client's threads (HEADs, reads: latency-bound), in order."""
        with concurrent.futures.ThreadPoolExecutor(DEFAULT_STREAMS) as pool:
            return list(pool.map(fn, items))

    # -- chunks -----------------------------------------------------------------------------------

    def put(self, data, claim=None, cid=None):
        """Store one chunk (1..64 MiB); a PutResult as Store.put: ZERO (not stored), PRESENT
        (an object of that name and size exists: nothing is sent) or NEW (uploaded, in parallel
        parts when large). `claim(cid)`: a write session's claim, made before a PRESENT is
        trusted (see claim_present). cid: the id already computed, as Store.put takes it."""
        view, cid, n = self._hash_put(data, cid)
        if isinstance(cid, PutResult):
            return cid  # all zero
        with self._writing(cid):
            present = self.claim_present(cid, n, claim)
            if present is not None:
                return present
            self.client.put(chunk_key(cid), view)  # replaces an object of the wrong size too
            return PutResult(cid, n, PutStatus.NEW)

    def claim_present(self, cid, length, claim=None):
        """A PRESENT PutResult when chunk `cid` is stored with `length` bytes, else None. With
        `claim`, the chunk is claimed (durably) and then looked up again: a gc that reads the
        session's claims from then on keeps it, and one that read them before is caught by the
        commit (FORMAT.md section 14)."""
        info = self.client.head(chunk_key(cid))
        if info is None or info.size != length:
            return None
        if claim is not None:
            claim(cid)
            info = self.client.head(chunk_key(cid))
            if info is None or info.size != length:
                return None
        return PutResult(cid, length, PutStatus.PRESENT)

    def read_chunk(self, cid, view, verify=True):
        """Read from the bucket (no cache), re-hashed unless verify=False; ChunkMissing or
        ChunkDamaged naming the chunk and its URL."""
        path = self.chunk_path(cid)
        try:
            size, got = self.client.get_into(chunk_key(cid), view)
        except FileNotFoundError:
            raise ChunkMissing(f"{path}: chunk {cid} missing", cid, path) from None
        if size != len(view):
            raise ChunkDamaged(f"{path}: {size} bytes, expected {len(view)} (truncated or damaged "
                               f"chunk)", "truncated", cid, path)
        if got != len(view):
            raise ChunkDamaged(f"{path}: read {got} of {len(view)} bytes (truncated chunk)",
                               "truncated", cid, path)
        if verify:
            check_bytes(cid, view, path)

    def chunk_path(self, cid):
        return self.client.where(chunk_key(cid))

    def scan_chunks(self):
        for o in self.client.list("chunks/"):
            parts = o.key.split("/")
            if len(parts) == 3 and is_chunk_id(parts[2]) and fanout(parts[2]) == parts[1]:
                yield ChunkFile(parts[2], parts[1], o.size, o.mtime_ns, False, True)

    def chunk_size(self, cid):
        info = self.client.head(chunk_key(cid))
        return None if info is None else info.size

    def has_chunk(self, cid):
        return self.chunk_size(cid) is not None

    def sync(self):
        """Nothing to do: every object is durable once its put returned."""

    def presence_problem(self, cid, length):
        from .verify import Problem
        path = self.chunk_path(cid)
        size = self.chunk_size(cid)
        if size is None:
            return Problem("missing", path, f"chunk {cid} missing", cid)
        if size != length:
            return Problem("truncated", path, f"{size} bytes, expected {length}", cid)
        return None

    # -- manifests and refs -----------------------------------------------------------------------

    def write_manifest(self, manifest):
        data = manifest.to_json()
        mid = chunk_id(data)
        self.client.put(f"manifests/{manifest_name(mid)}", data)  # rewriting refreshes its time
        return mid

    def read_manifest(self, mid):
        if not is_chunk_id(mid):
            raise StoreError(f"{self.path}: {mid!r} is not a manifest id")
        rel = f"manifests/{manifest_name(mid)}"
        path = self.client.where(rel)
        try:
            data = self.client.get_small(rel, limit=1 << 30)
        except FileNotFoundError:
            raise StoreError(f"{path}: manifest missing") from None
        if chunk_id(data) != mid:
            raise StoreError(f"{path}: content hashes to {chunk_id(data)}, not to its name "
                             f"(corrupted manifest)")
        return parse_manifest(data, path)

    def list_manifest_files(self):
        out = []
        for o in self.client.list("manifests/"):
            name = o.key.rpartition("/")[2]
            mid = name[:-len(MANIFEST_SUFFIX)] if name.endswith(MANIFEST_SUFFIX) else None
            if is_chunk_id(mid):
                out.append((mid, o.size, o.mtime_ns, False, name))
        return out

    def set_ref(self, name, mid, meta=None):
        self.client.put(f"refs/{name}", catalog.ref_bytes(self.client.where(f"refs/{name}"), name,
                                                          mid, meta))

    def read_ref(self, name):
        path = self.client.where(f"refs/{name}")
        catalog.check_ref_name(path, name)
        try:
            data = self.client.get_small(f"refs/{name}", limit=1 << 20)
        except FileNotFoundError:
            raise catalog.RefMissing(f"{path}: no such checkpoint") from None
        return catalog.parse_ref(data, path, name)

    def list_refs(self):
        return sorted(o.key[len("refs/"):] for o in self.client.list("refs/")
                      if is_ref_name(o.key[len("refs/"):]))

    # -- holds ------------------------------------------------------------------------------------

    def hold(self, ref, kind, pid=None, meta=None):
        catalog.check_ref_name(self.client.where(f"holds/{ref}"), ref)
        info, data = holdlib.new_hold(self, ref, kind, pid, self.client.where(f"holds/{ref}"),
                                      meta)
        self.client.put(f"holds/{ref}/{info.name}", data)
        return S3Hold(self, info)

    def holds(self, ref):
        catalog.check_ref_name(self.client.where(f"holds/{ref}"), ref)
        return self._holds_of(ref, holdlib.this_host())

    def _holds_of(self, ref, here):
        out = []
        for o in self.client.list(f"holds/{ref}/"):
            name = o.key.rpartition("/")[2]
            if not name.endswith(HOLD_SUFFIX) or name.startswith("."):
                continue
            try:
                data = self.client.get_small(o.key, limit=1 << 20)
            except FileNotFoundError:
                continue  # released meanwhile
            out.append(holdlib.parse_hold(data, ref, name, self.client.where(o.key), here))
        return out

    def release_hold(self, info):
        S3Hold(self, info).release()

    def held_refs(self):
        out = set()
        for o in self.client.list("holds/"):
            parts = o.key.split("/")
            if len(parts) == 3 and is_ref_name(parts[1]) and parts[2].endswith(HOLD_SUFFIX):
                out.add(parts[1])
        return out

    def remove_ref(self, name, force=False):
        """As Store.remove_ref. There is no lock: an `rm` and a new hold from two nodes at once
        may race (holds are a safety net, FORMAT.md section 7a)."""
        path = self.client.where(f"refs/{name}")
        catalog.check_ref_name(path, name)
        found = self._holds_of(name, holdlib.this_host())
        live = [h for h in found if h.alive]
        if live and not force:
            raise holdlib.RefHeld(f"{path}: checkpoint {name} is held, not removed: "
                                  + "; ".join(h.describe() for h in live)
                                  + " (end them first, or pass --force)", live)
        if self.client.head(f"refs/{name}") is None:
            raise catalog.RefMissing(f"{path}: no such checkpoint")
        self.client.delete([f"refs/{name}"])
        self.client.delete(f"holds/{name}/{h.name}" for h in found if force or not h.alive)
        return live

    # -- sessions and maintenance -----------------------------------------------------------------

    def begin_write(self, purpose=""):
        return S3WriteSession(self, purpose)

    def live_writers(self):
        now = time.time_ns()  # only for du's count: gc itself uses the server's clock
        return sum(1 for lease in read_leases(self, now, read_claims=False) if lease.live)

    def collect_garbage(self, grace_s, dry_run=False):
        from .s3gc import collect_garbage
        return collect_garbage(self, grace_s, dry_run)


class S3Hold(holdlib.Hold):
    """A hold this process took on an S3 store; release() removes its object (idempotent)."""

    def _remove(self):
        self.store.client.delete([f"holds/{self.ref}/{self.name}"])


class S3WriteSession(Tally):
    """A dump's view of an S3 store: puts under a lease that a thread renews, deduplicated
    chunks claimed, then commit (FORMAT.md section 14)."""

    def __init__(self, store, purpose=""):
        super().__init__()
        self.store, self.client = store, store.client
        self.name = os.urandom(8).hex()
        self._base = f"leases/{self.name}"
        info = {"version": 1, "host": socket.gethostname(), "pid": os.getpid(),
                "purpose": purpose, "ttl_s": LEASE_TTL_S}
        self._renewed = time.monotonic()
        self.client.put(f"{self._base}/start", json.dumps(info).encode() + b"\n")
        self._claimed, self._pending = set(), set()
        self._flushing, self._batches = False, 0
        self._cv = threading.Condition()
        self._stop = threading.Event()
        self._renew_error = None
        self._renewer = threading.Thread(target=self._renew_loop, name="s3-lease", daemon=True)
        self._renewer.start()

    def _renew_loop(self):
        while not self._stop.wait(RENEW_S):
            began = time.monotonic()
            try:
                self.client.put(f"{self._base}/renew", b"{}\n")
                self._renewed = began
            except StoreError as e:
                self._renew_error = e  # the commit refuses once the lease may have lapsed

    def _check_lease(self):
        """A lease that may have lapsed (not renewed for LEASE_TTL_S) may have let a gc remove
        chunks this session wrote: the commit fails rather than publish a ref to them."""
        if time.monotonic() - self._renewed > LEASE_TTL_S - 5:
            raise StoreError(f"{self.client.where(self._base)}: the write session's lease lapsed "
                             f"(not renewed for {LEASE_TTL_S:.0f}s: {self._renew_error}); nothing "
                             f"was committed: dump again")

    def claim(self, cid):
        """Write chunk `cid` down in this session's claims, durably, before it is relied on.
        Claims from many threads go out together, one small object per batch."""
        with self._cv:
            if cid in self._claimed:
                return
            self._pending.add(cid)
            while cid not in self._claimed:
                if self._flushing:
                    self._cv.wait()
                    continue
                batch, self._pending = self._pending, set()
                self._flushing = True
                self._batches += 1
                rel = f"{self._base}/claims/{self._batches:06d}"
                self._cv.release()
                try:
                    self.client.put(rel, json.dumps(sorted(batch)).encode() + b"\n")
                except BaseException:
                    self._cv.acquire()
                    self._pending |= batch
                    self._flushing = False
                    self._cv.notify_all()
                    raise
                self._cv.acquire()
                self._claimed |= batch
                self._flushing = False
                self._cv.notify_all()

    def put(self, data, cid=None):
        return self._tally(self.store.put(data, claim=self.claim, cid=cid))

    def claim_present(self, cid, length):
        result = self.store.claim_present(cid, length, claim=self.claim)
        return None if result is None else self._tally(result)

    def commit(self, ref_name, manifest, ref_meta=None):
        """Finish a dump: once no gc that may have missed a claim runs, check every claimed chunk
        is still there, then write the manifest and the ref. Returns the manifest id."""
        catalog.check_ref_name(self.client.where(f"refs/{ref_name}"), ref_name)
        wait_for_gcs(self.store, COMMIT_WAIT_S)
        with self._cv:
            claimed = sorted(self._claimed)
        want = dict(manifest.chunk_ids())
        gone = [cid for cid, size in zip(claimed, self.store._map(self.store.chunk_size, claimed))
                if cid in want and size != want[cid]]
        if gone:
            raise StoreError(f"{self.store.chunk_path(gone[0])}: {len(gone)} chunk(s) this dump "
                             f"found in the store were removed by a gc that ran meanwhile; nothing "
                             f"was committed: dump again")
        self._check_lease()
        mid = self.store.write_manifest(manifest)
        self._check_lease()
        self.store.set_ref(ref_name, mid, ref_meta)
        return mid

    def close(self):
        """End the session: the lease and its claims go (chunks not committed are then under the
        grace period only)."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._renewer.join()
        try:
            self.client.delete([o.key for o in self.client.list(f"{self._base}/")])
        except StoreError:
            pass  # a lease left behind goes stale and gc removes it
