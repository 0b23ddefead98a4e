"""Host-side rates the chunk store depends on: xxh3-128 hashing and O_DIRECT disk writes.

    host_rates.py --hash-mib N [--threads T] [--disk-dir DIR --disk-mib M]

No CUDA. Prints

    PROBE xxhash mib=N one_thread_gbps=... threads=T threaded_gbps=...
    PROBE disk_write dir=DIR fs=TYPE mib=M odirect=yes|no gbps=...

The disk figure is O_DIRECT writes of 16 MiB blocks plus one fdatasync; where the file system
refuses O_DIRECT (tmpfs) it is a buffered write + fdatasync and says odirect=no.
"""
import argparse
import concurrent.futures
import errno
import mmap
import os
import time

import xxhash

BLOCK = 16 << 20
HASH_PIECE = 64 << 20  # the store's chunk size


def hash_rates(mib, threads):
    data = bytearray(os.urandom(1 << 20)) * mib
    view = memoryview(data)
    pieces = [view[o:o + HASH_PIECE] for o in range(0, len(data), HASH_PIECE)]
    t0 = time.perf_counter()
    for piece in pieces:
        xxhash.xxh3_128_digest(piece)
    one = len(data) / (time.perf_counter() - t0) / 1e9
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        list(pool.map(xxhash.xxh3_128_digest, pieces[:threads]))  # start the threads
        t0 = time.perf_counter()
        list(pool.map(xxhash.xxh3_128_digest, pieces))
        many = len(data) / (time.perf_counter() - t0) / 1e9
    print(f"PROBE xxhash mib={mib} one_thread_gbps={one:.2f} threads={threads} "
          f"threaded_gbps={many:.2f}", flush=True)


def fs_type(path):
    """The type of the file system holding `path` (longest matching mount point)."""
    path = os.path.realpath(path)
    best, kind = "", "unknown"
    with open("/proc/self/mounts") as f:
        for line in f:
            fields = line.split()
            mount = fields[1]
            inside = path == mount or path.startswith(mount.rstrip("/") + "/")
            if inside and len(mount) >= len(best):
                best, kind = mount, fields[2]
    return kind


def write_file(path, mib, direct):
    block = mmap.mmap(-1, BLOCK)  # page-aligned, as O_DIRECT wants
    block.write(os.urandom(1 << 20) * (BLOCK >> 20))
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | (os.O_DIRECT if direct else 0)
    fd = os.open(path, flags, 0o600)
    try:
        t0 = time.perf_counter()
        for _ in range(max(1, (mib << 20) // BLOCK)):
            os.write(fd, block)
        os.fdatasync(fd)
        return time.perf_counter() - t0
    finally:
        os.close(fd)
        os.unlink(path)


def disk_rate(directory, mib):
    path = os.path.join(directory, f"host_rates.{os.getpid()}.tmp")
    written = max(1, (mib << 20) // BLOCK) * BLOCK
    try:
        secs, direct = write_file(path, mib, direct=True), "yes"
    except OSError as e:
        if e.errno != errno.EINVAL:
            raise
        if os.path.exists(path):
            os.unlink(path)
        secs, direct = write_file(path, mib, direct=False), "no"
    print(f"PROBE disk_write dir={directory} fs={fs_type(directory)} mib={written >> 20} "
          f"odirect={direct} gbps={written / secs / 1e9:.2f}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hash-mib", type=int, required=True)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--disk-dir")
    parser.add_argument("--disk-mib", type=int, default=1024)
    args = parser.parse_args()
    hash_rates(args.hash_mib, args.threads)
    if args.disk_dir:
        disk_rate(args.disk_dir, args.disk_mib)


if __name__ == "__main__":
    main()
