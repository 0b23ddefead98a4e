"""verify: re-hash chunks and name every one that is missing, truncated or corrupted."""
import os
import stat
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from ..errors import StoreError
from . import fsutil
from .chunkdir import ChunkDamaged, ChunkMissing
from .layout import CHUNK_SIZE_MAX, chunk_id
from .references import walk_refs


@dataclass
class Problem:
    kind: str       # missing | truncated | corrupt | bad-file | foreign | ref | unreadable
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


def check_chunks(store, manifest):
    """Problems that keep a restore of `manifest` from reading every chunk, found without reading
    a byte (one lstat, or one HEAD request, per distinct chunk: fast enough to run before a
    resume changes anything).

    Each Problem names the chunk id and its file; kinds: missing, truncated (any wrong size),
    bad-file (a symlink or other non-file under the chunk's name), foreign (the file or its
    fan-out directory is owned by a user other than root or us, or writable by group or others:
    FORMAT.md "Trust model"), unreadable (we may not read it).
    """
    return store.check_chunks(manifest)


#: The name this check had first; same function.
check_present = check_chunks


def presence_problem(store, cid, length):
    """A directory store's Problem for chunk `cid` (see check_chunks), or None."""
    path = store.chunks.chunk_path(cid)
    try:
        st = store.chunks.stat(cid)
    except StoreError as e:
        detail = str(e.args[0]).split(": ", 1)[-1]
        if "owned by uid" in detail or "writable by group" in detail:  # the fan-out directory
            return Problem("foreign", path, f"{os.path.dirname(path)}: {detail}", cid)
        return Problem("bad-file", path, detail, cid)  # a symlink or other non-file
    if st is None:
        return Problem("missing", path, f"chunk {cid} missing", cid)
    if st.st_size != length:
        return Problem("truncated", path, f"{st.st_size} bytes, expected {length}", cid)
    me = os.geteuid()
    dfd = store.chunks.fanout_fd(cid[:2])
    try:  # opened (and checked) earlier maybe: check the directory as it is now
        fsutil.check_trusted(dfd, os.path.dirname(path))
    except StoreError as e:
        return Problem("foreign", path, str(e.args[0]), cid)
    if st.st_uid not in (0, me):
        return Problem("foreign", path, f"owned by uid {st.st_uid}, not by root or by us "
                                        f"(uid {me}): whoever owns it decides what a restore loads",
                       cid)
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return Problem("foreign", path, f"writable by group or others (mode "
                                        f"{stat.S_IMODE(st.st_mode):04o})", cid)
    if me != 0 and not os.access(cid, os.R_OK, dir_fd=dfd, follow_symlinks=False):
        return Problem("unreadable", path, "no read permission", cid)
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
        for f in store.scan_chunks():
            if f.is_temp:
                continue
            path = store.chunk_path(f.name)
            if not f.is_regular:
                report.problems.append(Problem("bad-file", path, "not a regular file (symlink?)",
                                               f.name))
            elif f.name not in todo:
                todo[f.name] = (f.size, [])

    buffers = threading.local()
    lock = threading.Lock()

    def check_size(item):
        cid, (length, users) = item
        problem = store.presence_problem(cid, length)
        with lock:
            report.chunks_checked += 1
            if problem is not None:
                problem.refs = list(users)
                report.problems.append(problem)

    def check(item):
        cid, (length, users) = item
        path = store.chunk_path(cid)
        problem = None
        if length > CHUNK_SIZE_MAX:
            problem = Problem("bad-file", path, f"{length} bytes, over the chunk limit", cid)
        else:
            if getattr(buffers, "buf", None) is None:
                buffers.buf = bytearray(CHUNK_SIZE_MAX)
            view = memoryview(buffers.buf)[:length]
            try:
                store.read_chunk(cid, view, verify=False)  # hashed below
                got = chunk_id(view)
                if got != cid:
                    problem = Problem("corrupt", path, f"content hashes to {got}", cid)
            except ChunkMissing:
                problem = Problem("missing", path, f"chunk {cid} missing", cid)
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
