"""The tool's copy-out path, measured: import another process's cuMem export and stream it out.

    tool_copy.py --dir D --size-mib N [--seed S] [--buffers 8] [--threads 8]

Fetches the fd from `D/exporter.sock` (share.py exporter --kind fd), imports and maps it, then
copies the N MiB out in 64 MiB chunks through a ring of pinned host buffers on one stream while a
thread pool hashes each chunk with xxh3-128 (xxhash releases the GIL). After the timed part it
checks every digest against the exporter's fill pattern. Prints

    PROBE tool_copy mib=N import_ms=... pin_ms=... copy_hash_gbps=... chunks=K data_ok=True|False

and exits 1 when the data did not match.
"""
import argparse
import concurrent.futures
import ctypes
import sys
import time

import xxhash
from cuda.bindings import driver as cu

import probelib as pl
from share import import_fd


def copy_out(args):
    pl.init_context()
    rv = pl.Rendezvous(args.dir, "tool")
    rv.wait("exporter.ready")
    size = args.size_mib * pl.MiB
    t0 = time.perf_counter()
    handle = import_fd(rv)
    va = pl.map_handle(handle, size)
    import_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    chunk = min(pl.CHUNK, size)
    buffers = [int(pl.check(cu.cuMemHostAlloc(chunk, 0), "cuMemHostAlloc"))
               for _ in range(args.buffers)]
    events = [pl.check(cu.cuEventCreate(0), "cuEventCreate") for _ in range(args.buffers)]
    stream = pl.check(cu.cuStreamCreate(0), "cuStreamCreate")
    pin_s = time.perf_counter() - t0

    def hash_when_copied(slot, length):
        pl.check(cu.cuEventSynchronize(events[slot]), "cuEventSynchronize")
        return xxhash.xxh3_128_digest((ctypes.c_char * length).from_address(buffers[slot]))

    futures = []  # one per chunk, in chunk order
    with concurrent.futures.ThreadPoolExecutor(args.threads) as pool:
        t0 = time.perf_counter()
        for index, offset, length in pl.chunk_ranges(size):
            slot = index % args.buffers
            if index >= args.buffers:  # reuse a buffer only once the hash of its last chunk is done
                futures[index - args.buffers].result()
            pl.check(cu.cuMemcpyDtoHAsync(buffers[slot], va + offset, length, stream),
                     "cuMemcpyDtoHAsync")
            pl.check(cu.cuEventRecord(events[slot], stream), "cuEventRecord")
            futures.append(pool.submit(hash_when_copied, slot, length))
        digests = [f.result() for f in futures]
        copy_s = time.perf_counter() - t0

    expected = [xxhash.xxh3_128_digest(pl.expected_chunk(args.seed, index, length))
                for index, _, length in pl.chunk_ranges(size)]
    data_ok = digests == expected
    pl.probe_line("tool_copy", mib=args.size_mib, import_ms=f"{import_s * 1e3:.1f}",
                  pin_ms=f"{pin_s * 1e3:.1f}", copy_hash_gbps=f"{size / copy_s / 1e9:.2f}",
                  chunks=len(digests), buffers=args.buffers, threads=args.threads,
                  data_ok=data_ok)
    pl.check(cu.cuMemUnmap(va, size), "cuMemUnmap")
    pl.check(cu.cuMemRelease(handle), "cuMemRelease")
    for b in buffers:
        pl.check(cu.cuMemFreeHost(b), "cuMemFreeHost")
    return data_ok


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", required=True)
    parser.add_argument("--size-mib", type=int, required=True)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--buffers", type=int, default=8)
    parser.add_argument("--threads", type=int, default=8)
    args = parser.parse_args()
    try:
        ok = copy_out(args)
    except pl.ProbeFailure as e:
        sys.exit(f"tool_copy: {e}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
