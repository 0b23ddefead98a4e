"""What every chunk store does the same way, whatever holds its bytes (a directory, Store; an S3
bucket, S3Store): chunk ids and zero chunks, one put per chunk id at a time, reads through the
node cache. The backends differ in how a chunk, a manifest, a ref, a lease or a hold is kept; the
copy engine and the commands see only this interface:

  put(view) -> PutResult, claim_present(cid, length), get(cid, buf, verify) -> Source,
  read_chunk(cid, view, verify), chunk_pages() (and where it is not None: open_chunk(cid, length),
  check_chunk(cid, view)), chunk_path(cid), scan_chunks(), sync(), synced_device(),
  begin_write(purpose) -> a session (put, claim_present, commit(ref, manifest)),
  write_manifest / read_manifest / set_ref / read_ref / list_refs / remove_ref,
  hold / holds / held_refs, check_chunks(manifest), presence_problem(cid, length),
  list_manifest_files(), live_writers(), collect_garbage(grace_s, dry_run), close().
"""
import contextlib
import threading

from ..errors import StoreError
from .layout import CHUNK_SIZE_MAX, chunk_id, is_chunk_id, zero_chunk_id
from .results import PutResult, PutStatus, Source


class ChunkStore:
    """Shared parts; subclasses set self.path (what messages call the store) and self.cache."""

    def __init__(self, path, cache=None):
        self.path, self.cache = path, cache
        self._lock = threading.Lock()
        self._in_flight = {}  # chunk id -> Event set when its put ends

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        if self.cache is not None:
            self.cache.close()

    def synced_device(self):
        """The local file system (st_dev) that sync() makes durable; None where there is none."""
        return None

    @staticmethod
    def _hash_put(data, cid=None):
        """(view, chunk id, length) of a chunk to put; a ZERO PutResult instead of the id for an
        all-zero chunk (never stored). cid: the id the caller already computed (see put)."""
        view = byte_view(data)
        n = len(view)
        if not 0 < n <= CHUNK_SIZE_MAX:
            raise ValueError(f"chunk of {n} bytes: a chunk holds 1..{CHUNK_SIZE_MAX} bytes")
        if cid is not None and not is_chunk_id(cid):
            raise ValueError(f"{cid!r} is not a chunk id")
        cid = chunk_id(view) if cid is None else cid
        if cid == zero_chunk_id(n):
            return view, PutResult(None, n, PutStatus.ZERO), n
        return view, cid, n

    @contextlib.contextmanager
    def _writing(self, cid):
        """One put per chunk id at a time in this process: the copy engine's threads often meet
        the same chunk (e.g. repeated weights) at once; the second one then finds it present."""
        while True:
            with self._lock:
                busy = self._in_flight.get(cid)
                if busy is None:
                    self._in_flight[cid] = threading.Event()
                    break
            busy.wait()
        try:
            yield
        finally:
            with self._lock:
                self._in_flight.pop(cid).set()

    def get(self, cid, buf, verify=True):
        """Read chunk `cid` into the writable buffer `buf` (exactly the chunk's length).

        Reads the node cache first when one is set (a hit refreshes its LRU time; a miss reads the
        store and leaves the cache alone). By default the bytes are re-hashed, from the cache as
        from the store: a damaged cached copy is dropped and the store read instead; a damaged
        store chunk is a ChunkDamaged naming the chunk id and where it is. verify=False (the
        setting `verify = false`, CRIU_GPUSHARE_VERIFY=0) skips the hashing; sizes are always
        checked. Returns the Source the bytes came from.
        """
        if not is_chunk_id(cid):
            raise StoreError(f"{self.path}: {cid!r} is not a chunk id")
        view = byte_view(buf)
        if view.readonly:
            raise ValueError("get needs a writable buffer")
        if self.cache is not None and self.cache.read(cid, view, verify):
            return Source.CACHE
        self.read_chunk(cid, view, verify)
        return Source.STORE

    def chunk_pages(self):
        """Where this store's chunk files keep their bytes, for a suspended group's holder that
        registers them for its resume (gpu/file_pages.py): "huge" or "small" pages in memory
        (store/memfs.py), or None where they must be read (a disk, a bucket, or reads that go
        through the node cache)."""
        return None

    def check_chunks(self, manifest):
        """Every problem that would keep a restore of `manifest` from reading its chunks (missing,
        wrong size, not a file, foreign owner, unreadable), found without reading chunk bytes: a
        list of verify.Problem (.kind, .chunk, .path, .detail), empty when all is well."""
        todo = dict(manifest.chunk_ids())  # each distinct chunk once
        problems = self._map(lambda item: self.presence_problem(*item), todo.items())
        return [p for p in problems if p is not None]

    def _map(self, fn, items):
        """fn over items, results in order (a backend may run them in parallel)."""
        return [fn(item) for item in items]


def byte_view(data):
    view = data if isinstance(data, memoryview) else memoryview(data)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view
