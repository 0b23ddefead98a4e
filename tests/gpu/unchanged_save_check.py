"""Run by test_fingerprint.py on a real GPU: a second save of unchanged memory, timed.

    python3 tests/gpu/unchanged_save_check.py --gib N [--store DIR]

Makes an exportable N GiB allocation (one distinct value per 64 MiB chunk), imports its fd as the
tool does, saves it with the CopyEngine into a store (default: a new directory in /dev/shm), then
saves it again with a fresh engine (a second suspend: GPU chunk ids, nothing copied) and once more
with GPU hashing off (every chunk copied and hashed on the CPU, all deduplicated). Prints JSON.
"""
import argparse
import json
import shutil
import sys
import tempfile
import time

from criu_gpushare.gpu import driver as drv
from criu_gpushare.gpu.copy_engine import CHUNK_SIZE, CopyEngine
from criu_gpushare.gpu.memory import ImportedAllocation, use_device
from criu_gpushare.store.store import Store

FD = "CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR"


def exportable(size):
    cu = drv.driver()
    prop = cu.CUmemAllocationProp()
    prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = 0
    prop.requestedHandleTypes = getattr(cu.CUmemAllocationHandleType, FD)
    gran = drv.check(cu.cuMemGetAllocationGranularity(
        prop, cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM), "granularity")
    size = -(-size // gran) * gran
    handle = drv.check(cu.cuMemCreate(size, prop, 0), "cuMemCreate")
    fd = drv.check(cu.cuMemExportToShareableHandle(handle, getattr(cu.CUmemAllocationHandleType, FD), 0),
                   "export")
    return handle, fd, size


def stats_dict(stats, seconds):
    return {"secs": round(seconds, 3), "copied": stats.copied, "unchanged": stats.unchanged,
            "written": stats.written, "dedup": stats.deduplicated, "zero": stats.zero}


def load_checks(cu, store, alloc, mem, size):
    """Loads with every chunk checked against its name: on the GPU (the default where the kernel
    runs) and on the host, timed; then one chunk damaged in the store must be refused."""
    from criu_gpushare.store.chunkdir import ChunkDamaged
    out = {}
    for name, gpu_hash in (("load_gpu_check", True), ("load_host_check", False)):
        drv.check(cu.cuMemsetD8(int(mem.ptr), 0, size), "clear")
        drv.check(cu.cuCtxSynchronize(), "sync")
        t0 = time.perf_counter()
        with CopyEngine(store, verify_loads=True, gpu_hash=gpu_hash) as engine:
            engine.load(alloc, mem.ptr, 0)
            ids = engine.hasher(0).chunk_ids(mem.ptr, size, CHUNK_SIZE) if gpu_hash else None
        out[name] = {"secs": round(time.perf_counter() - t0, 3)}
        if ids is not None:
            out[name]["intact"] = ids == [c.id for c in alloc.chunks]
    victim = store.chunks.chunk_path(alloc.chunks[1].id)
    data = bytearray(open(victim, "rb").read())
    data[12345] ^= 0xFF
    import os
    os.chmod(victim, 0o644)
    with open(victim, "wb") as f:
        f.write(data)
    try:
        with CopyEngine(store, verify_loads=True) as engine:
            engine.load(alloc, mem.ptr, 0)
        out["damaged_refused"] = False
    except ChunkDamaged as e:
        out["damaged_refused"] = str(e)[:200]
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=int, default=8)
    ap.add_argument("--store")
    args = ap.parse_args()
    cu = drv.driver()
    use_device(0)
    handle, fd, size = exportable(args.gib << 30)
    store_dir = args.store or tempfile.mkdtemp(prefix="gpushare-fp.", dir="/dev/shm")
    out = {"gib": size / (1 << 30)}
    try:
        with ImportedAllocation(fd, size, 0) as mem, Store.open(store_dir + "/s", create=True) as store:
            for i, off in enumerate(range(0, size, CHUNK_SIZE)):
                n = min(CHUNK_SIZE, size - off)
                drv.check(cu.cuMemsetD32(int(mem.ptr) + off, 0x01000193 * (i + 1) & 0xFFFFFFFF, n // 4), "fill")
            drv.check(cu.cuCtxSynchronize(), "sync")
            runs = (("first", True), ("second", True), ("second_no_gpu_hash", False))
            allocs = {}
            for name, gpu_hash in runs:
                with store.begin_write(name) as session:
                    t0 = time.perf_counter()
                    with CopyEngine(session, gpu_hash=gpu_hash) as engine:
                        alloc, stats = engine.save("a", mem.ptr, size, 0)
                    out[name] = stats_dict(stats, time.perf_counter() - t0)
                    allocs[name] = [c.id for c in alloc.chunks]
            out["same_manifest"] = allocs["first"] == allocs["second"] == allocs["second_no_gpu_hash"]
            out.update(load_checks(cu, store, alloc, mem, size))
    finally:
        cu.cuMemRelease(handle)
        if not args.store:
            shutil.rmtree(store_dir, ignore_errors=True)
    json.dump(out, sys.stdout)
    print()


if __name__ == "__main__":
    main()
