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

With --disk the directories are disks and the writes are a disk store's: O_DIRECT and made
durable, no hashing (a disk is slower than xxh3 on one core). Where a save's chunks lose to the
disk's own rate, these ways say which step takes it:

  one file         each thread writes its chunks one after another into one file, one fdatasync
                   at the end (at 1 thread: the disk's own rate as bench/checkpoint_bench.py
                   measures it, the yardstick of its disk rows)
  file each, fdatasync each
                   a new file per chunk, fdatasync before close (the store's write procedure,
                   store/FORMAT.md section 3, without the temp name, fan-out and link)
  file each, syncfs once
                   a new file per chunk, no fdatasync; one syncfs at the end, timed
  store put, syncfs
                   Store.put with the chunk's id given (as the copy engine gives it: no hash) into
                   a fresh store, then the commit's syncfs (store.sync), timed: a save's writes
  read back        the file-each files read back with O_DIRECT (a load's reading of a disk store)

    python3 bench/write_paths_bench.py --disk --dir /var/tmp --threads 2,4,8,16 --size 8G --repeat 1
"""
import argparse
import contextlib
import ctypes
import json
import mmap
import os
import shutil
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
from criu_gpushare.store import Store  # noqa: E402
from criu_gpushare.store.fsutil import O_DIRECT, syncfs, write_all  # noqa: E402  (the store's own)

CHUNK = 64 << 20
PIECE = 1 << 20
WRITE_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL


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


def stamp(buf, i):
    buf[:8] = struct.pack("<Q", i)  # a distinct chunk, as each chunk of a save is


def chunk_file(work, i):
    return os.path.join(work, f"{i:06d}")


def read_files(work, ids, buf, flags=0):
    """Read the chunk files `ids` under `work` back into buf, one after another."""
    view = memoryview(buf)
    for i in ids:
        fd = os.open(chunk_file(work, i), os.O_RDONLY | flags)
        try:
            read_only(fd, view)
        finally:
            os.close(fd)


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
            stamp(buf, i)
            fd = os.open(chunk_file(work, i), WRITE_NEW, 0o600)
            try:
                way(fd, view)
            finally:
                os.close(fd)

    def read_job(t):
        read_files(work, range(t, n, threads), buffers[t])
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


class DirectRefused(Exception):
    """The file system refused O_DIRECT: --disk measures nothing there."""


def direct_write(fd, view):
    if write_all(fd, view):  # the store's fallback to buffered I/O: not a disk measurement
        raise DirectRefused


def one_file(work, ids, buf, store):
    fd = os.open(os.path.join(work, f"stream-{ids.start}"), WRITE_NEW | O_DIRECT, 0o600)
    try:
        for i in ids:
            stamp(buf, i)
            direct_write(fd, memoryview(buf))
        os.fdatasync(fd)
    finally:
        os.close(fd)


def file_each(sync_each):
    def write_files(work, ids, buf, store):
        for i in ids:
            stamp(buf, i)
            fd = os.open(chunk_file(work, i), WRITE_NEW | O_DIRECT, 0o600)
            try:
                direct_write(fd, memoryview(buf))
                if sync_each:
                    os.fdatasync(fd)
            finally:
                os.close(fd)
    return write_files


def store_put(work, ids, buf, store):
    for i in ids:
        stamp(buf, i)
        store.put(memoryview(buf), cid=f"{i + 1:032x}")


#: name: (write(work, chunk ids, buffer, store), a syncfs at the end, timed)
DISK_WAYS = {"one file": (one_file, False),
             "file each, fdatasync each": (file_each(True), False),
             "file each, syncfs once": (file_each(False), True),
             "store put, syncfs": (store_put, True)}
DISK_COLUMNS = list(DISK_WAYS) + ["read back"]


def disk_case(directory, name, size, threads, buffers):
    """GB/s of writing size bytes as 64 MiB chunks on `threads` threads into a fresh directory
    under `directory` in the disk way `name` (or, for "read back", of reading the files of
    "file each, fdatasync each" back with O_DIRECT after writing them untimed)."""
    n = max(threads, size // CHUNK)
    work = tempfile.mkdtemp(prefix="write-paths-", dir=directory)
    reading = name == "read back"
    write, final_sync = DISK_WAYS["file each, fdatasync each" if reading else name]
    store = Store.open(os.path.join(work, "store"), create=True) if write is store_put else None

    def write_job(t):
        write(work, range(t, n, threads), buffers[t], store)

    def read_job(t):
        read_files(work, range(t, n, threads), buffers[t], O_DIRECT)
    try:
        if reading:
            on_threads(write_job, threads)
        t0 = time.perf_counter()
        on_threads(read_job if reading else write_job, threads)
        if store is not None:
            store.sync()
        elif final_sync:
            fd = os.open(work, os.O_RDONLY | os.O_DIRECTORY)
            try:
                syncfs(fd, work)
            finally:
                os.close(fd)
        return n * CHUNK / (time.perf_counter() - t0) / 1e9
    finally:
        if store is not None:
            store.close()
        shutil.rmtree(work)


FLOORS = {"copy, memory in place": dict(into_new=False),
          "new memory, small pages: made, copied into": dict(into_new=True),
          "new memory, MADV_HUGEPAGE: made, copied into": dict(into_new=True, huge=True)}


def thread_list(text):
    try:
        counts = sorted({int(c) for c in text.split(",")})
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a thread count or a list of them: {text!r}") from None
    if counts[0] < 1:
        raise argparse.ArgumentTypeError(f"thread counts start at 1: {text!r}")
    return counts


def direct_refusal(directory):
    """Why O_DIRECT cannot be measured in `directory` (one aligned block written), or None."""
    block = mmap.mmap(-1, 4096)
    try:
        fd, path = tempfile.mkstemp(prefix=".write-paths-direct-", dir=directory)
        os.close(fd)
        try:
            fd = os.open(path, os.O_WRONLY | O_DIRECT)
            try:
                os.write(fd, block)
            finally:
                os.close(fd)
        finally:
            os.unlink(path)
    except OSError as e:
        return f"{directory}: O_DIRECT refused ({e.strerror}): --disk measures disks"
    return None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", action="append", help="a directory to write in (repeatable; default "
                    "/dev/shm; with --disk, required)")
    ap.add_argument("--huge-tmpfs", action="store_true", help="also a tmpfs mounted with huge=always (root)")
    ap.add_argument("--disk", action="store_true",
                    help="the directories are disks: O_DIRECT, durable, the store's ways (no floors)")
    ap.add_argument("--size", default="4G", help="bytes per case (default 4G)")
    ap.add_argument("--threads", type=thread_list, default=[min(16, os.cpu_count() or 1)],
                    help="N, or a list N1,N2,...: the multi-thread cases besides 1 thread "
                         "(default: CPUs, at most 16, as the copy engine)")
    ap.add_argument("--repeat", type=int, default=2, help="runs per case, the best reported (default 2)")
    ap.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    args = ap.parse_args(argv)
    size = parse_size(args.size, "--size")
    if args.disk and (args.huge_tmpfs or not args.dir):
        ap.error("--disk needs --dir on each disk to measure, and no --huge-tmpfs")
    if args.disk:
        for d in args.dir:
            why = direct_refusal(d)
            if why:
                print(f"write_paths_bench: {why}", file=sys.stderr)
                return 2
    dirs = [(d, d) for d in (args.dir or ["/dev/shm"])]
    thread_counts = sorted({1, *args.threads})
    most = max(thread_counts)
    huge = bl.mount_huge_tmpfs(max(size, CHUNK * most) + (1 << 30)) if args.huge_tmpfs else None
    if huge:
        dirs.append(("tmpfs huge=always", huge))
    buffers = []
    for t in range(most):
        buf = mmap.mmap(-1, CHUNK)  # page-aligned, as a pinned buffer
        buf[:] = os.urandom(1 << 20) * (CHUNK >> 20)
        buffers.append(buf)
    repeat = max(1, args.repeat)
    rows, floors = [], {}
    try:
        for label, directory in dirs:
            if not args.disk:
                run_case(directory, write_only, size, most, buffers)  # warm-up, untimed
            for threads in thread_counts:
                row = {"dir": label, "threads": threads}
                if args.disk:
                    for name in DISK_COLUMNS:
                        row[name] = round(max(disk_case(directory, name, size, threads, buffers)
                                              for _ in range(repeat)), 2)
                else:
                    for name, way in WAYS.items():
                        row[name] = round(max(run_case(directory, way, size, threads, buffers)
                                              for _ in range(repeat)), 2)
                    row["read back"] = round(max(run_case(directory, write_only, size, threads, buffers, True)
                                                 for _ in range(repeat)), 2)
                rows.append(row)
        if not args.disk:
            floors = {name: round(max(copy_floor(size, most, buffers, **kw) for _ in range(repeat)), 2)
                      for name, kw in FLOORS.items()}
    except DirectRefused:
        print("write_paths_bench: O_DIRECT refused at a write: --disk measures disks", file=sys.stderr)
        return 2
    finally:
        if huge:
            bl.unmount(huge)
    if args.json:
        out = {"size": size, "chunk": CHUNK, "rows": rows}
        out.update({"mode": "disk"} if args.disk else
                   {"mode": "buffered", "piece": PIECE, "floors": floors, "floor_threads": most})
        print(json.dumps(out, indent=2))
        return 0
    columns = DISK_COLUMNS if args.disk else COLUMNS
    how = "O_DIRECT, durable" if args.disk else "buffered, no fsync"
    print(f"writing {size / 2**30:.1f} GiB as {CHUNK >> 20} MiB chunk files ({how}), GB/s, best of {repeat}")
    print(f"{'directory':<22} {'threads':>7} " + " ".join(f"{w:>16}" for w in columns))
    for r in rows:
        print(f"{r['dir']:<22} {r['threads']:>7} " + " ".join(f"{r[w]:>16.2f}" for w in columns))
    if args.disk:
        print("\nthe writes against one file at 1 thread (the disk's own rate, the yardstick of "
              "bench/checkpoint_bench.py's disk rows), %")
        for label, _ in dirs:
            own = next(r["one file"] for r in rows if r["dir"] == label and r["threads"] == 1)
            for r in (r for r in rows if r["dir"] == label):
                print(f"{label:<22} {r['threads']:>7} " + " ".join(
                    f"{100 * r[w] / own:>15.0f}%" for w in DISK_WAYS))
        return 0
    print(f"\nthe host's own floor, {most} threads, GB/s")
    for name, rate in floors.items():
        print(f"{name:<46} {rate:>8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
