"""One CuPy process holding GPU memory of random contents, from a chosen memory pool (allocator bench).

    python3 cupy_blocks.py --gib 8 --block-mib 256 --pool default|async [--ctl DIR]

--pool default: CuPy's MemoryPool (cudaMalloc underneath); async: cupy.cuda.MemoryAsyncPool
(cudaMallocAsync, stream-ordered memory pools). Commands (wlcommon.py): `check` -> {"sha"}, with the
same digest as the torch workloads, computed with CuPy on the GPU.
"""
import argparse
import hashlib
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import wlcommon  # noqa: E402


def cupy_digest(cp, arrays):
    parts, weights = [], None
    for a in arrays:
        words = a.view(cp.int64).ravel()
        for off in range(0, words.size, wlcommon.BLOCK_WORDS):
            block = words[off:off + wlcommon.BLOCK_WORDS]
            if weights is None or weights.size < block.size:
                weights = cp.arange(block.size, dtype=cp.int64) * 2 + 1
            parts.append(block.sum())
            parts.append((block * weights[:block.size]).sum())
    del weights
    h = hashlib.sha256()
    if parts:
        values = [int(v) for v in cp.stack(parts).get()]
        h.update(struct.pack(f"<{len(values)}q", *values))
    cp.cuda.Device().synchronize()
    cp.get_default_memory_pool().free_all_blocks()  # the digest's temporaries (default pool)
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--block-mib", type=int, default=256)
    ap.add_argument("--pool", choices=("default", "async"), default="default")
    ap.add_argument("--ctl")
    args = ap.parse_args()
    import cupy as cp

    if args.pool == "async":
        cp.cuda.set_allocator(cp.cuda.MemoryAsyncPool().malloc)
    total, block = wlcommon.gib_to_bytes(args.gib), args.block_mib << 20
    sizes = [block] * (total // block) + ([total % block] if total % block else [])
    rng = cp.random.default_rng(os.getpid())
    arrays = []
    for size in sizes:
        arrays.append(rng.integers(-(1 << 62), 1 << 62, size=size // 8, dtype=cp.int64))
    cp.cuda.Device().synchronize()
    wlcommon.serve(wlcommon.channel_from_args(args.ctl),
                   {"pids": [os.getpid()], "bytes": sum(sizes), "pool": args.pool},
                   {"check": lambda _a: {"sha": cupy_digest(cp, arrays)}})


if __name__ == "__main__":
    main()
