"""Run by test_verified_load.py in a process that loads the (fake) CUDA driver.

    verified_load.py STORE

Saves 8 MiB (two zero chunks, six of data), then loads it back with every chunk checked against
its name, with the check done by a device hasher (a CPU stand-in for the kernel, which the fake
cannot run): the host does not hash what it reads; the bytes arrive intact. Bytes damaged on the
device after their copy, in several allocations loaded as one group, are caught by the group's
check and made right again (a zero chunk zeroed, the others read from the store). Then a chunk
damaged in the store is refused (ChunkDamaged). Prints one JSON line.
"""
import contextlib
import ctypes
import json
import os
import sys

from criu_gpushare.gpu import driver as drv
from criu_gpushare.gpu.copy_engine import CopyEngine, LoadItem, SaveItem
from criu_gpushare.gpu.memory import ImportedAllocation, use_device
from criu_gpushare.store.chunkdir import ChunkDamaged
from criu_gpushare.store.layout import zero_chunk_id
from criu_gpushare.store.store import Store

from copy_roundtrip import exportable_allocation
from unchanged_save import CpuHasher

MiB = 1 << 20


class CountingHasher(CpuHasher):
    def hash_region(self, ptr, length, stream=0):
        return self.chunk_ids(ptr, length, length)[0]


class FlipsOnce(CountingHasher):
    """Before hashing a region, damages each of `addresses` inside it once (one byte on the
    device): what a load's check finds when a copy went wrong."""

    def __init__(self, addresses):
        super().__init__()
        self.addresses = set(addresses)

    def start_ids(self, ptr, size, chunk_size, stream, first=0):
        for addr in sorted(a for a in self.addresses if int(ptr) <= a < int(ptr) + size):
            self.addresses.discard(addr)
            drv.check(drv.driver().cuMemsetD8(addr, 0xEE, 1), "damage a byte")
        return super().start_ids(ptr, size, chunk_size, stream, first)


def reloaded_in_a_group(store, mem, size, chunk):
    """Three allocations (8 MiB in pieces of 3, 3 and 2 MiB) saved with save_all and loaded with
    load_all, their bytes checked on the "device" as one group: a damaged zero chunk (piece 0) is
    zeroed again, a damaged chunk in piece 1 and one in piece 2 are read from the store again;
    every byte comes back."""
    cu = drv.driver()
    pieces = [(0, 3 * MiB), (3 * MiB, 3 * MiB), (6 * MiB, 2 * MiB)]
    before = (ctypes.c_char * size)()
    drv.check(cu.cuMemcpyDtoH(before, mem.ptr, size), "read back")
    with store.begin_write("pieces") as session, CopyEngine(session, ring_slots=3, chunk_size=chunk,
                                                            workers=2) as engine:
        saved = engine.save_all([SaveItem(f"p{k}", n, 0, lambda o=off: contextlib.nullcontext(int(mem.ptr) + o))
                                 for k, (off, n) in enumerate(pieces)])
    drv.check(cu.cuMemsetD8(mem.ptr, 0xAB, size), "scribble")
    reads = []
    real_get = store.get
    store.get = lambda cid, buf, verify=True: (reads.append(verify), real_get(cid, buf, verify))[1]
    flips = [int(mem.ptr) + 100, int(mem.ptr) + 4 * MiB + 5, int(mem.ptr) + 7 * MiB + 9]
    try:
        with CopyEngine(store, ring_slots=3, chunk_size=chunk, workers=2, verify_loads=True) as engine:
            engine._hashers[0] = hasher = FlipsOnce(flips)
            engine.load_all([LoadItem(a, 0, lambda o=off: contextlib.nullcontext(int(mem.ptr) + o))
                             for (a, _), (off, _) in zip(saved, pieces)])
    finally:
        del store.get
    after = (ctypes.c_char * size)()
    drv.check(cu.cuMemcpyDtoH(after, mem.ptr, size), "read back")
    return {"intact": bytes(after) == bytes(before), "all_damaged": not hasher.addresses,
            "reread_checked": reads.count(True)}


def filled_and_saved(store, mem):
    """8 MiB at mem: two zero chunks, then six of data (1 MiB chunks), saved into store: its
    manifest Allocation."""
    cu = drv.driver()
    drv.check(cu.cuMemsetD8(mem.ptr, 0, 2 * MiB), "memset")
    words = (ctypes.c_uint32 * (6 * MiB // 4))(*range(7, 7 + 6 * MiB // 4))
    drv.check(cu.cuMemcpyHtoD(int(mem.ptr) + 2 * MiB, words, 6 * MiB), "fill")
    with store.begin_write("t") as session, CopyEngine(session, ring_slots=3, chunk_size=MiB,
                                                       workers=2) as engine:
        return engine.save("a", mem.ptr, 8 * MiB, 0)[0]


def main():
    store_path = sys.argv[1]
    cu = drv.driver()
    use_device(0)
    size, chunk = 8 * MiB, MiB
    _, fd = exportable_allocation(size)
    out = {}
    with ImportedAllocation(fd, size, 0) as mem, Store.open(store_path, create=True) as store:
        alloc = filled_and_saved(store, mem)
        host_verifies = []
        real_get = store.get

        def get(cid, buf, verify=True):
            host_verifies.append(verify)
            return real_get(cid, buf, verify)
        store.get = get
        drv.check(cu.cuMemsetD8(mem.ptr, 0xAB, size), "scribble")
        with CopyEngine(store, ring_slots=3, chunk_size=chunk, workers=2, verify_loads=True) as engine:
            engine._hashers[0] = hasher = CountingHasher()
            engine.load(alloc, mem.ptr, 0)
            want = [c.id or zero_chunk_id(c.length) for c in alloc.chunks]
            out["intact"] = hasher.chunk_ids(mem.ptr, size, chunk) == want
            out["host_hashed"] = any(host_verifies)
        out["reloaded"] = reloaded_in_a_group(store, mem, size, chunk)
        victim = store.chunks.chunk_path(alloc.chunks[3].id)
        data = bytearray(open(victim, "rb").read())
        data[100] ^= 0xFF
        os.chmod(victim, 0o644)
        with open(victim, "wb") as f:
            f.write(data)
        try:
            with CopyEngine(store, ring_slots=3, chunk_size=chunk, workers=2, verify_loads=True) as engine:
                engine._hashers[0] = CountingHasher()
                engine.load(alloc, mem.ptr, 0)
            out["damaged"] = "loaded"
        except ChunkDamaged as e:
            out["damaged"] = str(e)
        out["victim"] = alloc.chunks[3].id
    print(json.dumps(out))


if __name__ == "__main__":
    main()
