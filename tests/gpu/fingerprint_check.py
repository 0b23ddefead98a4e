"""Run by test_fingerprint.py on a real GPU: the GPU chunk ids against the CPU's, and their speed.

    python3 tests/gpu/fingerprint_check.py [--gib 8] [--from ptx]

Checks GpuHasher (criu_gpushare/gpu/fingerprint.py, kernel xxh3.cu) bit for bit against
`xxhash.xxh3_128_hexdigest`, the store's chunk id: random bytes of many lengths (every short-path
edge, block and tile edges, 64 MiB and around it, odd sizes), at the start of an allocation and at
a 16-byte offset, all-zero inputs, and chunk_ids over a multi-chunk region with a short last chunk.
Then times chunk_ids over GIB GiB in 64 MiB chunks, and that region cut in 1 GiB pieces hashed
at once (start_ids on several streams) against one by one. Prints one JSON object. The kernel comes from
xxh3.fatbin as the tool loads it, or with --from ptx from xxh3.ptx (the fallback, and what GPUs
without machine code in the fatbin compile); "hasher_ms" is its load and self-test (with
CUDA_CACHE_DISABLE=1 in the environment, a PTX load pays the driver's JIT compile every time).
"""
import argparse
import ctypes
import json
import os
import random
import sys
import time

import xxhash

from criu_gpushare.gpu import driver as drv
from criu_gpushare.gpu import fingerprint
from criu_gpushare.gpu.fingerprint import GpuHasher
from criu_gpushare.gpu.memory import use_device

MiB = 1 << 20
CHUNK = 64 * MiB
LENGTHS = sorted({0, 1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 96, 97, 127, 128,
                  129, 159, 160, 161, 200, 239, 240, 241, 255, 256, 257, 511, 1023, 1024, 1025,
                  1088, 2047, 2048, 2049, 4095, 4097, 65535, 65536, 65537, 66567, 131071, 1000003,
                  4 * MiB + 13, 33554467, CHUNK - 1, CHUNK, CHUNK + 1, CHUNK + 4095})
ZERO_LENGTHS = [0, 1, 16, 17, 240, 241, 1024, 1025, 65536, MiB, CHUNK - 1, CHUNK]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=int, default=8)
    ap.add_argument("--from", dest="source", choices=("fatbin", "ptx"), default="fatbin")
    args = ap.parse_args()
    if args.source == "ptx":
        fingerprint.FATBIN_PATH = "/nonexistent/xxh3.fatbin"  # as where none ships: the PTX
    cu = drv.driver()
    use_device(0)
    t0 = time.perf_counter()
    hasher = GpuHasher(0)  # from PTX the driver JIT-compiles it here (cached on disk, unless disabled)
    mismatches = []
    problem = hasher.self_test()
    hasher_ms = (time.perf_counter() - t0) * 1e3
    if problem:
        mismatches.append(f"self-test: {problem}")

    size = max(LENGTHS) + 16
    data = random.Random(1).randbytes(size)
    host = (ctypes.c_char * size).from_buffer_copy(data)
    buf = drv.check(cu.cuMemAlloc(size), "cuMemAlloc")
    drv.check(cu.cuMemcpyHtoD(buf, host, size), "fill")
    checked = 0
    for n in LENGTHS:
        for shift in (0, 16):
            got = hasher.hash_region(int(buf) + shift, n)
            want = xxhash.xxh3_128_hexdigest(data[shift:shift + n])
            checked += 1
            if got != want:
                mismatches.append(f"random {n} bytes at +{shift}: GPU {got} CPU {want}")
    # chunk_ids: 3 full chunks and a short last one, and small chunks with an odd tail
    for total, chunk in ((size - 16, CHUNK), (3 * MiB + 777, MiB), (100000, 4096)):
        got = hasher.chunk_ids(buf, total, chunk)
        want = [xxhash.xxh3_128_hexdigest(data[o:min(o + chunk, total)]) for o in range(0, total, chunk)]
        checked += len(want)
        if got != want:
            bad = [i for i, (g, w) in enumerate(zip(got, want)) if g != w]
            mismatches.append(f"chunk_ids({total}, {chunk}): {len(got)} ids for {len(want)} chunks, "
                              f"wrong at {bad[:8]}")
    drv.check(cu.cuMemsetD8(buf, 0, size), "zero")
    for n in ZERO_LENGTHS:
        got = hasher.hash_region(buf, n)
        want = xxhash.xxh3_128_hexdigest(bytes(n))
        checked += 1
        if got != want:
            mismatches.append(f"zero {n} bytes: GPU {got} CPU {want}")
    cu.cuMemFree(buf)

    # Throughput over GIB GiB in 64 MiB chunks (a pattern that differs per word; speed does not
    # depend on the bytes), with two chunks checked against the CPU.
    total = args.gib << 30
    free, _ = drv.check(cu.cuMemGetInfo(), "cuMemGetInfo")
    while total > free - (2 << 30):
        total //= 2
    big = drv.check(cu.cuMemAlloc(total), f"cuMemAlloc({total})")
    drv.check(cu.cuMemsetD32(big, 0x9E3779B1, total // 4), "fill")
    drv.check(cu.cuMemcpyHtoD(int(big) + CHUNK, host, CHUNK), "fill one chunk")
    hasher.chunk_ids(big, total, CHUNK)  # warm up (JIT, first launch)
    best = None
    for _ in range(3):
        t0 = time.perf_counter()
        ids = hasher.chunk_ids(big, total, CHUNK)
        dt = time.perf_counter() - t0
        best = dt if best is None else min(best, dt)
    back = (ctypes.c_char * CHUNK)()
    for i in (0, 1, len(ids) - 1):
        drv.check(cu.cuMemcpyDtoH(back, int(big) + i * CHUNK, CHUNK), "read back")
        want = xxhash.xxh3_128_hexdigest(bytes(back))
        checked += 1
        if ids[i] != want:
            mismatches.append(f"{total >> 30} GiB region, chunk {i}: GPU {ids[i]} CPU {want}")
    # One 64 MiB chunk alone (one CUDA block: the latency of a single chunk)
    t0 = time.perf_counter()
    hasher.chunk_ids(big, CHUNK, CHUNK)
    one_chunk_s = time.perf_counter() - t0
    # The region cut in 1 GiB pieces hashed at once (start_ids: each piece into its own id slots,
    # on 8 streams, as a save hashes a group of allocations): each piece's ids are those
    # chunk_ids gives it alone, and together the whole region's.
    piece = 1 << 30
    regions = [(int(big) + o, min(piece, total - o)) for o in range(0, total, piece)]
    streams = [drv.check(cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING), "stream")
               for _ in range(8)]
    hasher.reserve(sum(-(-n // CHUNK) for _, n in regions))
    t0 = time.perf_counter()
    pending, first = [], 0
    for k, (p, n) in enumerate(regions):
        pending.append(hasher.start_ids(p, n, CHUNK, streams[k % len(streams)], first))
        first += -(-n // CHUNK)
    at_once = [x.result() for x in pending]
    at_once_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    one_by_one = [hasher.chunk_ids(p, n, CHUNK) for p, n in regions]
    one_by_one_s = time.perf_counter() - t0
    checked += len(ids)
    if at_once != one_by_one or sum(at_once, []) != ids:
        bad = [k for k, (a, b) in enumerate(zip(at_once, one_by_one)) if a != b]
        mismatches.append(f"{len(regions)} pieces hashed at once differ from one by one at {bad[:8]}"
                          if bad else "pieces hashed at once do not add up to the whole region's ids")
    for stream in streams:
        cu.cuStreamDestroy(stream)
    cu.cuMemFree(big)
    hasher.close()
    gbps = total / best / 1e9
    json.dump({"checked": checked, "mismatches": mismatches, "gib": total / (1 << 30),
               "chunks": len(ids), "secs": round(best, 4), "gbps": round(gbps, 1),
               "one_chunk_ms": round(one_chunk_s * 1e3, 2), "hasher_ms": round(hasher_ms, 1),
               "pieces": len(regions), "pieces_at_once_ms": round(at_once_s * 1e3, 2),
               "pieces_one_by_one_ms": round(one_by_one_s * 1e3, 2),
               "est_40gib_s": round(40 * (1 << 30) / gbps / 1e9, 3),
               "loaded_from": os.path.basename(hasher.loaded_from),
               "device": drv.gpus()[0][1]}, sys.stdout)
    print()


if __name__ == "__main__":
    main()
