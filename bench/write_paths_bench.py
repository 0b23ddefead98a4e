#!/usr/bin/env python3
"""How a saved chunk gets into a file system: the ways to write it, side by side, in GB/s.

    python3 bench/write_paths_bench.py                          # /dev/shm, 1 and N threads
    python3 bench/write_paths_bench.py --huge-tmpfs --size 16G  # also a tmpfs with huge pages (root)
    python3 bench/write_paths_bench.py --dir /dev/shm --dir /var/tmp --json

A save (engine/steps.py, gpu/copy_engine.py) copies each 64 MiB chunk from the GPU into a pinned
host buffer, then a worker thread puts it: Store.put hashes the whole chunk where it is given no
id (xxh3-128: its name; the copy engine gives the GPU's id but for a sample, store/FORMAT.md
section 13), then writes it to a new file. On tmpfs that write allocates and fills every page of
the file (bench/RESULTS.md has what it costs a cold dump). This bench measures,
per directory and thread count, from one page-aligned buffer per thread (as the pinned ring):

  write            the write alone: the file system's own rate for this pattern
  hash, write      xxh3-128 of the whole chunk, then the write (Store.put given no id)
  hash as written  in 1 MiB pieces, each hashed then written while still in the CPU's cache
                   (the chunk read from memory once instead of twice)
  read back        the files just written read into the buffers (a load's or a resume's reading
                   of the store into the pinned ring)

and, apart from any file system, the host's own floor at N threads (what no way of writing or
reading a store through the CPU can beat on this machine):

  copy, memory in place   memmove between buffers already populated (one pass through the CPU)
  new memory: made, copied into
                          anonymous memory mapped and populated (MADV_POPULATE_WRITE: allocated
                          and zeroed by the kernel, as tmpfs does for a write), small pages and
                          MADV_HUGEPAGE, then the memmove into it; all of it timed

Buffered writes, no fsync (tmpfs needs none; on a disk the figures are the page cache's). With
--huge-tmpfs (root) it mounts a tmpfs with huge=always for the run, so the plain and the huge-page
tmpfs are measured side by side. No GPU needed.
"""
import argparse
import contextlib
import ctypes
import json
import mmap
import os
import struct
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import xxhash

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib as bl  # noqa: E402
from criu_gpushare.config import parse_size  # noqa: E402
from criu_gpushare.store.fsutil import write_all  # noqa: E402  (what the store writes a chunk with)

CHUNK = 64 << 20
PIECE = 1 << 20


def write_only(fd, view):
    write_all(fd, view)


def hash_then_write(fd, view):
    xxhash.xxh3_128_digest(view)
    write_all(fd, view)


def hash_as_written(fd, view):
    h = xxhash.xxh3_128()
    for off in range(0, len(view), PIECE):
        piece = view[off:off + PIECE]
        h.update(piece)
        write_all(fd, piece)
    h.digest()


WAYS = {"write": write_only, "hash, write": hash_then_write, "hash as written": hash_as_written}
COLUMNS = list(WAYS) + ["read back"]


def read_only(fd, view):
    """Read a whole chunk file into view (os.readv: no new bytes object, the GIL let go)."""
    done = 0
    while done < len(view):
        n = os.readv(fd, [view[done:]])
        if n == 0:
            raise EOFError("chunk file shorter than written")
        done += n


def run_case(directory, way, size, threads, buffers, read_back=False):
    """GB/s of writing size bytes as CHUNK files into a fresh directory under `directory` with
    `way`; with read_back, the files are written first (untimed) and the GB/s of reading them
    back is returned instead."""
    n = max(threads, size // CHUNK)
    work = tempfile.mkdtemp(prefix="write-paths-", dir=directory)

    def write_job(t):
        buf = buffers[t]
        view = memoryview(buf)
        for i in range(t, n, threads):
            buf[:8] = struct.pack("<Q", i)  # a distinct chunk, as each chunk of a save is
            fd = os.open(os.path.join(work, f"{i:06d}"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                way(fd, view)
            finally:
                os.close(fd)

    def read_job(t):
        view = memoryview(buffers[t])
        for i in range(t, n, threads):
            fd = os.open(os.path.join(work, f"{i:06d}"), os.O_RDONLY)
            try:
                read_only(fd, view)
            finally:
                os.close(fd)
    try:
        if read_back:
            on_threads(write_job, threads)
        t0 = time.perf_counter()
        on_threads(read_job if read_back else write_job, threads)
        return n * CHUNK / (time.perf_counter() - t0) / 1e9
    finally:
        for name in os.listdir(work):
            os.unlink(os.path.join(work, name))
        os.rmdir(work)


def on_threads(job, threads):
    """job(t) for t in range(threads), each on its own thread; its errors raised here."""
    with ThreadPoolExecutor(threads) as pool:
        for f in [pool.submit(job, t) for t in range(threads)]:
            f.result()


MADV_HUGEPAGE = 14
MADV_POPULATE_WRITE = 23  # Linux 5.14: the pages allocated and zeroed at once, no fault per page


def copy_floor(size, threads, buffers, into_new, huge=False):
    """GB/s of memmove of size bytes in CHUNK pieces on `threads` threads, from each thread's
    buffer into a second one: already populated, or (into_new) mapped, populated by the kernel
    (its pages allocated and zeroed, as a write into tmpfs has them) and then written, all timed."""
    n = max(threads, size // CHUNK)
    per_thread = [len(range(t, n, threads)) for t in range(threads)]
    targets = [None] * threads
    try:
        if not into_new:
            for t in range(threads):
                targets[t] = mmap.mmap(-1, CHUNK)
                targets[t][:] = buffers[t]  # populated before the clock starts

        def job(t):
            if into_new:
                targets[t] = target = mmap.mmap(-1, CHUNK * per_thread[t])
                if huge:
                    target.madvise(MADV_HUGEPAGE)
                target.madvise(MADV_POPULATE_WRITE)
            src = ctypes.addressof(ctypes.c_char.from_buffer(buffers[t]))
            dst = ctypes.addressof(ctypes.c_char.from_buffer(targets[t]))
            for k in range(per_thread[t]):  # ctypes.memmove lets the GIL go
                ctypes.memmove(dst + (k * CHUNK if into_new else 0), src, CHUNK)
        t0 = time.perf_counter()
        on_threads(job, threads)
        return n * CHUNK / (time.perf_counter() - t0) / 1e9
    finally:
        for target in targets:
            if target is not None:
                with contextlib.suppress(BufferError):  # a from_buffer view may still be alive
                    target.close()


FLOORS = {"copy, memory in place": dict(into_new=False),
          "new memory, small pages: made, copied into": dict(into_new=True),
          "new memory, MADV_HUGEPAGE: made, copied into": dict(into_new=True, huge=True)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", action="append", help="a directory to write in (repeatable; default /dev/shm)")
    ap.add_argument("--huge-tmpfs", action="store_true", help="also a tmpfs mounted with huge=always (root)")
    ap.add_argument("--size", default="4G", help="bytes per case (default 4G)")
    ap.add_argument("--threads", type=int, default=min(16, os.cpu_count() or 1),
                    help="the N of the multi-thread cases (default: CPUs, at most 16, as the copy engine)")
    ap.add_argument("--repeat", type=int, default=2, help="runs per case, the best reported (default 2)")
    ap.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    args = ap.parse_args(argv)
    size = parse_size(args.size, "--size")
    dirs = [(d, d) for d in (args.dir or ["/dev/shm"])]
    huge = bl.mount_huge_tmpfs(max(size, CHUNK * args.threads) + (1 << 30)) if args.huge_tmpfs else None
    if huge:
        dirs.append(("tmpfs huge=always", huge))
    thread_counts = sorted({1, args.threads})
    buffers = []
    for t in range(max(thread_counts)):
        buf = mmap.mmap(-1, CHUNK)  # page-aligned, as a pinned buffer
        buf[:] = os.urandom(1 << 20) * (CHUNK >> 20)
        buffers.append(buf)
    rows = []
    try:
        for label, directory in dirs:
            run_case(directory, write_only, size, max(thread_counts), buffers)  # warm-up, untimed
            for threads in thread_counts:
                row = {"dir": label, "threads": threads}
                for name, way in WAYS.items():
                    row[name] = round(max(run_case(directory, way, size, threads, buffers)
                                          for _ in range(max(1, args.repeat))), 2)
                row["read back"] = round(max(run_case(directory, write_only, size, threads, buffers, True)
                                             for _ in range(max(1, args.repeat))), 2)
                rows.append(row)
        floors = {name: round(max(copy_floor(size, args.threads, buffers, **kw)
                                  for _ in range(max(1, args.repeat))), 2)
                  for name, kw in FLOORS.items()}
    finally:
        if huge:
            bl.unmount(huge)
    if args.json:
        print(json.dumps({"size": size, "chunk": CHUNK, "piece": PIECE, "rows": rows,
                          "floors": floors, "floor_threads": args.threads}, indent=2))
        return 0
    print(f"writing {size / 2**30:.1f} GiB as {CHUNK >> 20} MiB chunk files, GB/s, best of {args.repeat}")
    print(f"{'directory':<22} {'threads':>7} " + " ".join(f"{w:>16}" for w in COLUMNS))
    for r in rows:
        print(f"{r['dir']:<22} {r['threads']:>7} " + " ".join(f"{r[w]:>16.2f}" for w in COLUMNS))
    print(f"\nthe host's own floor, {args.threads} threads, GB/s")
    for name, rate in floors.items():
        print(f"{name:<46} {rate:>8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
