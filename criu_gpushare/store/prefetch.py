"""prefetch: copy the chunks of some checkpoints from the store into the node cache, ahead of a
restore, verifying each one on the way."""
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from ..errors import StoreError
from .layout import CHUNK_SIZE_MAX, chunk_id
from .references import walk_refs


@dataclass
class PrefetchReport:
    refs: int = 0
    chunks: int = 0
    already_cached: int = 0
    fetched: int = 0
    bytes_fetched: int = 0
    skipped_for_limit: int = 0
    evicted: int = 0
    bytes_evicted: int = 0
    failed: list = field(default_factory=list)  # messages naming the failing chunk file
    seconds: float = 0.0


def prefetch(store, cache, refs=None, threads=8):
    """Bring every chunk of the named refs (default: all) into `cache`; the store is only read.

    With a cache size limit, first evicts least recently used chunks the refs do not need, then
    fetches until the limit is reached (the rest is counted as skipped).
    """
    t0 = time.monotonic()
    walked = walk_refs(store, refs, strict=True)
    report = PrefetchReport(refs=len(walked.refs), chunks=len(walked.chunks))
    wanted = set(walked.chunks)
    todo = []
    for cid, (length, _) in walked.chunks.items():
        if cache.contains(cid):
            report.already_cached += 1
        else:
            todo.append((cid, length))
    if cache.limit_bytes is not None:
        _, used = cache.usage()
        need = sum(length for _, length in todo)
        if used + need > cache.limit_bytes:
            report.evicted, report.bytes_evicted = cache.evict(
                max(0, cache.limit_bytes - need), keep=wanted)
            _, used = cache.usage()
        room = cache.limit_bytes - used
        kept = []
        for cid, length in todo:
            if length <= room:
                kept.append((cid, length))
                room -= length
            else:
                report.skipped_for_limit += 1
        todo = kept

    buffers = threading.local()
    lock = threading.Lock()

    def fetch(item):
        cid, length = item
        if getattr(buffers, "buf", None) is None:
            buffers.buf = bytearray(CHUNK_SIZE_MAX)
        view = memoryview(buffers.buf)[:length]
        try:
            store.read_chunk(cid, view, verify=False)  # hashed below
            if chunk_id(view) != cid:
                raise StoreError(f"{store.chunk_path(cid)}: content does not match its "
                                 f"name (corrupted chunk); not cached")
            cache.insert(cid, view)
        except StoreError as e:
            with lock:
                report.failed.append(str(e))
            return
        with lock:
            report.fetched += 1
            report.bytes_fetched += length

    with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        list(pool.map(fetch, todo))
    report.failed.sort()
    report.seconds = time.monotonic() - t0
    return report
