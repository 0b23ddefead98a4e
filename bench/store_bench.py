#!/usr/bin/env python3
"""Chunk store throughput: write (cold and deduplicated) and read, on tmpfs and on disk.

Each case makes a fresh store and writes --size bytes as 64 MiB chunks from one reused, page-aligned
buffer per thread (as the copy engine does from pinned memory; the first 16 bytes change per chunk
so every chunk is new), then writes the same chunks again (dedup: hash and stat only), then reads
them all back into an aligned buffer, with and without hash verification. Before reading from disk
the chunk files are dropped from the page cache (posix_fadvise DONTNEED), so disk reads are cold.

    python bench/store_bench.py                    # ~45 s on 2 cores: 1 GiB per case, best of 2
    python bench/store_bench.py --size 16G --threads 8 --tmpfs /dev/shm --disk /var/tmp
    python bench/store_bench.py --json
    python bench/store_bench.py --size 8G --threads 2,4,8,16 --io direct --tmpfs '' --disk DIR

Cases: target (tmpfs, disk) x I/O (O_DIRECT, buffered) x threads (1, N, or each of a list).
Throughput is GB/s (10^9 bytes per second) of chunk bytes.
"""
import argparse
import json
import mmap
import os
import shutil
import struct
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from criu_gpushare.config import parse_size  # noqa: E402
from criu_gpushare.store import CHUNK_SIZE_MAX, Store  # noqa: E402


def aligned_buffer(size, seed):
    buf = mmap.mmap(-1, size)  # page-aligned, like a pinned host buffer
    buf[:] = os.urandom(1 << 20) * (size >> 20) if size >= 1 << 20 else os.urandom(size)
    buf[16:24] = struct.pack("<Q", seed)
    return buf


def run_threads(threads, work):
    """Split chunk numbers round-robin over threads; each thread gets its own buffer."""
    with ThreadPoolExecutor(max_workers=threads) as pool:
        return [f.result() for f in [pool.submit(work, t) for t in range(threads)]]


def write_phase(store, n_chunks, chunk, threads, buffers):
    def work(t):
        buf, view = buffers[t], memoryview(buffers[t])[:chunk]
        ids = []
        for i in range(t, n_chunks, threads):
            buf[:8] = struct.pack("<Q", i)  # a distinct chunk from the same buffer
            ids.append((i, store.put(view).chunk_id))
        return ids
    t0 = time.perf_counter()
    ids = run_threads(threads, work)
    store.sync()
    return time.perf_counter() - t0, dict(pair for part in ids for pair in part)


def drop_page_cache(store, ids):
    for cid in ids:
        fd = os.open(os.path.join(store.path, "chunks", cid[:2], cid), os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def read_phase(store, ids, chunk, threads, buffers, verify):
    order = [ids[i] for i in sorted(ids)]

    def work(t):
        view = memoryview(buffers[t])[:chunk]
        for cid in order[t::threads]:
            store.get(cid, view, verify=verify)
    t0 = time.perf_counter()
    run_threads(threads, work)
    return time.perf_counter() - t0


def bench_case(base, size, chunk, threads, direct, buffers):
    root = tempfile.mkdtemp(prefix="store-bench-", dir=base)
    os.chmod(root, 0o755)
    try:
        n = max(1, size // chunk)
        total = n * chunk
        with Store.open(os.path.join(root, "s"), create=True, direct_io=direct) as st:
            cold, ids = write_phase(st, n, chunk, threads, buffers)
            used_direct = direct and not st.chunks.direct_refused
            dedup, _ = write_phase(st, n, chunk, threads, buffers)
            drop_page_cache(st, ids.values())
            read = read_phase(st, ids, chunk, threads, buffers, verify=False)
            drop_page_cache(st, ids.values())
            read_verify = read_phase(st, ids, chunk, threads, buffers, verify=True)
        return {"bytes": total, "write_cold": total / cold / 1e9, "write_dedup": total / dedup / 1e9,
                "read": total / read / 1e9, "read_verify": total / read_verify / 1e9,
                "o_direct_used": used_direct}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="1G", help="bytes written per case (default 1G)")
    ap.add_argument("--chunk", default="64M", help="chunk size (default 64M, the format's max)")
    ap.add_argument("--threads", default=str(min(8, os.cpu_count() or 1)),
                    help="the N of the multi-thread cases (default: CPUs, at most 8), or a list "
                         "such as 2,4,16: a case for each, and for 1 (how a disk's rate varies "
                         "with the readers and writers at once)")
    ap.add_argument("--io", choices=("both", "direct", "buffered"), default="both",
                    help="O_DIRECT cases, buffered cases, or both (default)")
    ap.add_argument("--tmpfs", default="/dev/shm", help="a tmpfs directory ('' to skip)")
    ap.add_argument("--disk", default="/var/tmp", help="a directory on disk ('' to skip)")
    ap.add_argument("--repeat", type=int, default=2,
                    help="runs per case; the best of each figure is reported (default 2)")
    ap.add_argument("--json", action="store_true", help="print JSON lines instead of a table")
    args = ap.parse_args()
    size, chunk = parse_size(args.size, "--size"), parse_size(args.chunk, "--chunk")
    if not 0 < chunk <= CHUNK_SIZE_MAX:
        ap.error(f"--chunk must be 1..{CHUNK_SIZE_MAX}")
    try:
        thread_counts = sorted({1, *(int(t) for t in args.threads.split(","))})
    except ValueError:
        ap.error(f"--threads: a number or numbers separated by commas, not {args.threads!r}")
    if thread_counts[0] < 1:
        ap.error("--threads: at least 1")
    ios = {"both": (True, False), "direct": (True,), "buffered": (False,)}[args.io]
    buffers = [aligned_buffer(chunk, t) for t in range(max(thread_counts))]
    rows = []
    for target, base in (("tmpfs", args.tmpfs), ("disk", args.disk)):
        if not base:
            continue
        # Untimed warm-up: the first writes to a file system pay for page allocation and metadata
        # that would otherwise be charged to whichever case happens to run first.
        bench_case(base, size, chunk, max(thread_counts), False, buffers)
        for direct in ios:
            for threads in thread_counts:
                runs = [bench_case(base, size, chunk, threads, direct, buffers)
                        for _ in range(max(1, args.repeat))]
                r = {k: max(run[k] for run in runs) for k in runs[0]}
                r.update(target=target, dir=base, io="O_DIRECT" if direct else "buffered",
                         threads=threads)
                rows.append(r)
                if args.json:
                    print(json.dumps(r), flush=True)
    if not args.json:
        print(f"chunk store throughput, GB/s ({size / 2**30:.1f} GiB per case in "
              f"{chunk >> 20} MiB chunks, best of {args.repeat}; reads from disk start cold)")
        head = ("target", "io", "threads", "write cold", "write dedup", "read", "read+verify")
        print("{:<7} {:<9} {:>7} {:>11} {:>12} {:>6} {:>12}".format(*head))
        for r in rows:
            io = r["io"] if r["o_direct_used"] or r["io"] == "buffered" else "buffered*"
            print("{:<7} {:<9} {:>7} {:>11.2f} {:>12.2f} {:>6.2f} {:>12.2f}".format(
                r["target"], io, r["threads"], r["write_cold"], r["write_dedup"], r["read"],
                r["read_verify"]))
        if any(r["io"] == "O_DIRECT" and not r["o_direct_used"] for r in rows):
            print("* O_DIRECT refused by the file system: the buffered fallback ran")


if __name__ == "__main__":
    main()
