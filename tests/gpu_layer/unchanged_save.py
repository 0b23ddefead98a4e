"""Run by test_unchanged_save.py in a process that loads the (fake) CUDA driver.

    unchanged_save.py STORE

The fake driver runs no kernels, so the copy engine finds no GpuHasher there (checked first). This
program then gives the engine a stand-in hasher that computes the same ids on the CPU (reading the
memory back), to exercise the save path around it: a second save of unchanged memory copies
nothing, counts it `unchanged` and refreshes the chunks' mtimes; a chunk removed from the store, or
rewritten on the device, crosses the link again; a hasher that lies makes the save fail; a save
that copied nothing in a process that loads next (pin_ahead) leaves the load a ring already pinned.
Prints one JSON line.
"""
import ctypes
import json
import os
import sys
import threading

from criu_gpushare.errors import DriverError
from criu_gpushare.gpu import driver as drv, memory
from criu_gpushare.gpu.copy_engine import CopyEngine
from criu_gpushare.gpu.memory import ImportedAllocation, use_device
from criu_gpushare.store.layout import chunk_id
from criu_gpushare.store.store import Store

from copy_roundtrip import exportable_allocation

MiB = 1 << 20


class CpuHasher:
    """GpuHasher's interface, hashing a copy on the CPU (what the GPU kernel computes in place)."""

    def __init__(self, lie_at=None):
        self.lie_at, self.calls = lie_at, 0

    @staticmethod
    def supports(ptr, chunk_size):
        return int(ptr) % 16 == 0 and chunk_size % 16 == 0

    def chunk_ids(self, ptr, size, chunk_size, stream=0):
        self.calls += 1
        cu = drv.driver()
        host = (ctypes.c_char * size)()
        drv.check(cu.cuMemcpyDtoH(host, ptr, size), "read back")
        data = bytes(host)
        ids = [chunk_id(data[o:o + chunk_size]) for o in range(0, size, chunk_size)]
        if self.lie_at is not None:
            ids[self.lie_at] = "0" * 32
        return ids

    def close(self):
        pass


def summary(alloc, stats):
    return {"copied": stats.copied, "unchanged": stats.unchanged, "written": stats.written,
            "dedup": stats.deduplicated, "zero": stats.zero,
            "ids": [c.id for c in alloc.chunks]}


def main():
    store_path = sys.argv[1]
    cu = drv.driver()
    use_device(0)
    size, chunk = 8 * MiB, MiB
    _, fd = exportable_allocation(size)
    out = {}
    with ImportedAllocation(fd, size, 0) as mem, Store.open(store_path, create=True) as store, \
            store.begin_write("t") as session:
        drv.check(cu.cuMemsetD8(mem.ptr, 0, 2 * MiB), "memset")   # chunks 0, 1: zero
        words = (ctypes.c_uint32 * (6 * MiB // 4))(*range(6 * MiB // 4))
        drv.check(cu.cuMemcpyHtoD(int(mem.ptr) + 2 * MiB, words, 6 * MiB), "fill")
        with CopyEngine(session, ring_slots=3, chunk_size=chunk, workers=2) as engine:
            out["fake_hasher"] = engine.hasher(0) is not None
            plain_alloc, plain = engine.save("a", mem.ptr, size, 0)
            out["plain"] = summary(plain_alloc, plain)
        # A later run of the tool (a second suspend): a fresh engine, with ids from the "device".
        with CopyEngine(session, ring_slots=3, chunk_size=chunk, workers=2) as engine:
            engine._hashers[0] = hasher = CpuHasher()
            for cid in {c.id for c in plain_alloc.chunks if c.id}:
                path = store.chunks.chunk_path(cid)
                os.utime(path, ns=(10**9, 10**9))  # long ago: a present put refreshes it
            alloc, again = engine.save("a", mem.ptr, size, 0)
            out["again"] = summary(alloc, again)
            out["refreshed"] = all(os.stat(store.chunks.chunk_path(c.id)).st_mtime_ns > 10**9
                                   for c in alloc.chunks if c.id)
            out["ring_allocated"] = engine._ring is not None
            # one chunk gone from the store, one chunk rewritten on the GPU
            os.unlink(store.chunks.chunk_path(alloc.chunks[2].id))
            drv.check(cu.cuMemsetD8(int(mem.ptr) + 5 * MiB, 7, MiB), "rewrite chunk 5")
            alloc3, third = engine.save("a", mem.ptr, size, 0)
            out["third"] = summary(alloc3, third)
            engine._hashers[0] = CpuHasher(lie_at=6)  # a wrong GPU id for chunk 6: not present
            try:
                engine.save("a", mem.ptr, size, 0)
                out["lie"] = "saved"
            except DriverError as e:
                out["lie"] = str(e)
        out["hasher_calls"] = hasher.calls
        out["pin_ahead"] = pinned_for_the_load(session, store, mem, size, chunk, alloc3)
    json.dump(out, sys.stdout)


def pinned_for_the_load(session, store, mem, size, chunk, alloc):
    """A suspend of unchanged memory, then its resume, in one holder: buffers pinned ahead (in the
    background, after the save's engine) and on the load's path."""
    with memory._kept_lock:  # what earlier engines kept: none of it for this case
        for b in memory._kept:
            b.free()
        memory._kept.clear()
    made = {"ahead": 0, "on the path": 0}
    real = memory.PinnedBuffer

    def counted(n):
        ahead = threading.current_thread().name.startswith("pin-ahead")  # its thread, or one of its pool
        made["ahead" if ahead else "on the path"] += 1
        return real(n)

    memory.PinnedBuffer = counted
    try:
        with CopyEngine(session, ring_slots=3, chunk_size=chunk, workers=2, pin_ahead=True) as engine:
            engine._hashers[0] = CpuHasher()
            _, stats = engine.save("a", mem.ptr, size, 0)
        with CopyEngine(store, ring_slots=3, chunk_size=chunk, workers=2) as engine:
            engine.load(alloc, mem.ptr, 0)
        return {"copied": stats.copied, "by_save": made["ahead"], "by_load": made["on the path"]}
    finally:
        memory.PinnedBuffer = real


if __name__ == "__main__":
    main()
