"""Run by test_verified_load.py in a process that loads the (fake) CUDA driver.

    verified_load.py STORE

Saves 8 MiB (two zero chunks, six of data), then loads it back with every chunk checked against
its name, with the check done by a device hasher (a CPU stand-in for the kernel, which the fake
cannot run): the host does not hash what it reads; the bytes arrive intact. Then a chunk damaged
in the store is refused (ChunkDamaged), and a damaged cached copy is dropped and read from the
store. Prints one JSON line.
"""
import ctypes
import json
import os
import sys

from criu_gpushare.gpu import driver as drv
from criu_gpushare.gpu.copy_engine import CopyEngine
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


def main():
    store_path = sys.argv[1]
    cu = drv.driver()
    use_device(0)
    size, chunk = 8 * MiB, MiB
    _, fd = exportable_allocation(size)
    out = {}
    with ImportedAllocation(fd, size, 0) as mem, Store.open(store_path, create=True) as store:
        drv.check(cu.cuMemsetD8(mem.ptr, 0, 2 * MiB), "memset")
        words = (ctypes.c_uint32 * (6 * MiB // 4))(*range(7, 7 + 6 * MiB // 4))
        drv.check(cu.cuMemcpyHtoD(int(mem.ptr) + 2 * MiB, words, 6 * MiB), "fill")
        with store.begin_write("t") as session, CopyEngine(session, ring_slots=3, chunk_size=chunk,
                                                           workers=2) as engine:
            alloc, _ = engine.save("a", mem.ptr, size, 0)
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
