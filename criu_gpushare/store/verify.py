"""verify: re-hash chunks and name every one that is missing, truncated or corrupted."""
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from ..errors import StoreError
from .chunkdir import ChunkDamaged, ChunkMissing
from .layout import CHUNK_SIZE_MAX, chunk_id
from .references import walk_refs


@dataclass
class Problem:
    kind: str       # missing | truncated | corrupt | bad-file | ref | unreadable
    path: str
    detail: str
    chunk: object = None
    refs: list = field(default_factory=list)

    def as_dict(self):
        return {"kind": self.kind, "path": self.path, "detail": self.detail, "chunk": self.chunk,
                "refs": self.refs}


@dataclass
class VerifyReport:
    refs: int = 0
    chunks_checked: int = 0
    bytes_hashed: int = 0
    problems: list = field(default_factory=list)

    @property
    def ok(self):
        return not self.problems


def check_present(store, manifest):
    """Problems that keep a restore of `manifest` from reading every chunk: missing chunks and
    chunk files of the wrong size or kind. Only stats files (fast: for a pre-restore check)."""
    problems, seen = [], set()
    for cid, length in manifest.chunk_ids():
        if cid not in seen:
            seen.add(cid)
            problem = _presence_problem(store, cid, length)
            if problem is not None:
                problems.append(problem)
    return problems


def _presence_problem(store, cid, length):
    path = store.chunks.chunk_path(cid)
    try:
        st = store.chunks.stat(cid)
    except StoreError as e:  # a symlink or other non-file under the chunk's name
        return Problem("bad-file", path, str(e.args[0]).split(": ", 1)[-1], cid)
    if st is None:
        return Problem("missing", path, "chunk missing", cid)
    if st.st_size != length:
        return Problem("truncated", path, f"{st.st_size} bytes, expected {length}", cid)
    return None


def verify_store(store, refs=None, all_chunks=False, threads=4, quick=False):
    """Check the chunks the named refs (default: all) reference; with all_chunks, every chunk file.

    Every chunk is read from the store itself (never the cache) and re-hashed; with quick=True
    chunks are only checked for presence and size.
    """
    walked = walk_refs(store, refs)
    report = VerifyReport(refs=len(walked.refs))
    for name, err in walked.problems:
        path, _, detail = str(err.args[0]).partition(": ")
        report.problems.append(Problem("ref", path, detail, refs=[name]))
    todo = {cid: (length, users) for cid, (length, users) in walked.chunks.items()}
    if all_chunks:
        for f in store.chunks.scan():
            if f.is_temp:
                continue
            path = os.path.join(store.chunks.path, f.fanout, f.name)
            if not f.is_regular:
                report.problems.append(Problem("bad-file", path, "not a regular file (symlink?)",
                                               f.name))
            elif f.name not in todo:
                todo[f.name] = (f.size, [])

    buffers = threading.local()
    lock = threading.Lock()

    def check_size(item):
        cid, (length, users) = item
        problem = _presence_problem(store, cid, length)
        with lock:
            report.chunks_checked += 1
            if problem is not None:
                problem.refs = list(users)
                report.problems.append(problem)

    def check(item):
        cid, (length, users) = item
        path = store.chunks.chunk_path(cid)
        problem = None
        if length > CHUNK_SIZE_MAX:
            problem = Problem("bad-file", path, f"{length} bytes, over the chunk limit", cid)
        else:
            if getattr(buffers, "buf", None) is None:
                buffers.buf = bytearray(CHUNK_SIZE_MAX)
            view = memoryview(buffers.buf)[:length]
            try:
                store.read_chunk(cid, view)
                got = chunk_id(view)
                if got != cid:
                    problem = Problem("corrupt", path, f"content hashes to {got}", cid)
            except ChunkMissing:
                problem = Problem("missing", path, "chunk missing", cid)
            except ChunkDamaged as e:
                problem = Problem(e.kind, path, str(e.args[0]).split(": ", 1)[-1], cid)
            except StoreError as e:
                problem = Problem("unreadable", path, str(e.args[0]), cid)
        with lock:
            report.chunks_checked += 1
            if problem is None:
                report.bytes_hashed += length
            else:
                problem.refs = list(users)
                report.problems.append(problem)

    with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        list(pool.map(check_size if quick else check, todo.items()))
    report.problems.sort(key=lambda p: (p.kind, p.path))
    return report
