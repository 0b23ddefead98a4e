"""Pinned host <-> device copy rates: the ceiling the product's copy engine works against.

    copy_rates.py --size-mib N [--reps R]

Times cuMemcpyHtoDAsync / cuMemcpyDtoHAsync of N MiB between one device buffer and one pinned
host buffer on one stream (R repetitions after a warm-up), then the same D2H in 64 MiB chunks
into a ring of 4 pinned buffers (the store's pattern). Prints

    PROBE pinned_copy mib=N h2d_gbps=... d2h_gbps=... d2h_chunked_gbps=... pin_alloc_gbps=...
"""
import argparse
import sys
import time

from cuda.bindings import driver as cu

import probelib as pl


def timed(stream, reps, issue):
    issue()  # warm-up
    pl.check(cu.cuStreamSynchronize(stream), "cuStreamSynchronize")
    t0 = time.perf_counter()
    for _ in range(reps):
        issue()
    pl.check(cu.cuStreamSynchronize(stream), "cuStreamSynchronize")
    return time.perf_counter() - t0


def measure(args):
    pl.init_context()
    size = args.size_mib * pl.MiB
    device = int(pl.check(cu.cuMemAlloc(size), "cuMemAlloc"))
    t0 = time.perf_counter()
    host = int(pl.check(cu.cuMemHostAlloc(size, 0), "cuMemHostAlloc"))
    pin_s = time.perf_counter() - t0
    stream = pl.check(cu.cuStreamCreate(0), "cuStreamCreate")

    def h2d():
        pl.check(cu.cuMemcpyHtoDAsync(device, host, size, stream), "cuMemcpyHtoDAsync")

    def d2h():
        pl.check(cu.cuMemcpyDtoHAsync(host, device, size, stream), "cuMemcpyDtoHAsync")

    chunk = min(pl.CHUNK, size)
    ring = [host + k * chunk for k in range(min(4, size // chunk))]

    def d2h_chunked():
        for index, offset, length in pl.chunk_ranges(size):
            pl.check(cu.cuMemcpyDtoHAsync(ring[index % len(ring)], device + offset, length, stream),
                     "cuMemcpyDtoHAsync")

    moved = size * args.reps
    figures = {
        "h2d_gbps": moved / timed(stream, args.reps, h2d) / 1e9,
        "d2h_gbps": moved / timed(stream, args.reps, d2h) / 1e9,
        "d2h_chunked_gbps": moved / timed(stream, args.reps, d2h_chunked) / 1e9,
        "pin_alloc_gbps": size / pin_s / 1e9,
    }
    pl.probe_line("pinned_copy", mib=args.size_mib, reps=args.reps,
                  **{k: f"{v:.2f}" for k, v in figures.items()})
    pl.check(cu.cuMemFreeHost(host), "cuMemFreeHost")
    pl.check(cu.cuMemFree(device), "cuMemFree")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, required=True)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    try:
        measure(args)
    except pl.ProbeFailure as e:
        sys.exit(f"copy_rates: {e}")


if __name__ == "__main__":
    main()
