"""Run by test_in_place_load.py in a process that loads the (fake) CUDA driver, with the store on a
tmpfs and CRIU_GPUSHARE_PAGES_IN_PLACE=1.

    in_place_load.py STORE

Saves 8 MiB (two zero chunks, six of data), then loads it back from the chunk files' own pages
(gpu/file_pages.py): checked on the host (the fake runs no hash kernel), with no pinned ring; then
with the driver refusing every registration (the pages are copied through the driver's staging);
then with a chunk corrupted, one truncated and one removed, each refused with the chunk's own
error. Every page mapped is released. Prints one JSON line.
"""
import ctypes
import json
import logging
import os
import sys

from criu_gpushare.gpu import driver as drv, file_pages
from criu_gpushare.gpu.copy_engine import CopyEngine
from criu_gpushare.gpu.memory import ImportedAllocation, use_device
from criu_gpushare.store.chunkdir import ChunkDamaged, ChunkMissing
from criu_gpushare.store.store import Store

from copy_roundtrip import exportable_allocation

MiB = 1 << 20


class Counted(file_pages.FilePages):
    made, released, registered = 0, 0, 0

    def __init__(self, *args):
        super().__init__(*args)
        Counted.made += 1
        Counted.registered += self.registered

    def release(self):
        super().release()
        Counted.released += 1


def main():
    file_pages.FilePages = Counted
    warnings = []
    logging.getLogger("criu_gpushare.gpu.file_pages").addHandler(
        type("H", (logging.Handler,), {"emit": lambda self, r: warnings.append(r.getMessage())})())
    cu = drv.driver()
    use_device(0)
    size, chunk = 8 * MiB, MiB
    _, fd = exportable_allocation(size)
    out = {}
    with ImportedAllocation(fd, size, 0) as mem, Store.open(sys.argv[1], create=True) as store:
        drv.check(cu.cuMemsetD8(mem.ptr, 0, 2 * MiB), "memset")
        words = (ctypes.c_uint32 * (6 * MiB // 4))(*range(7, 7 + 6 * MiB // 4))
        drv.check(cu.cuMemcpyHtoD(int(mem.ptr) + 2 * MiB, words, 6 * MiB), "fill")
        before = (ctypes.c_char * size)()
        drv.check(cu.cuMemcpyDtoH(before, mem.ptr, size), "read back")
        with store.begin_write("t") as session, CopyEngine(session, ring_slots=3, chunk_size=chunk,
                                                           workers=2) as engine:
            alloc, _ = engine.save("a", mem.ptr, size, 0)
        out["pages"] = store.chunk_pages()

        def load():
            drv.check(cu.cuMemsetD8(mem.ptr, 0xAB, size), "scribble")
            with CopyEngine(store, ring_slots=3, chunk_size=chunk, workers=2, verify_loads=True) as engine:
                stats = engine.load(alloc, mem.ptr, 0)
                pinned = engine._ring is not None
            file_pages.wait_released()
            after = (ctypes.c_char * size)()
            drv.check(cu.cuMemcpyDtoH(after, mem.ptr, size), "read back")
            return {"intact": bytes(after) == bytes(before), "in_place": stats.in_place,
                    "ring_pinned": pinned, "made": Counted.made, "released": Counted.released,
                    "registered": Counted.registered}

        out["load"] = load()
        real_register = cu.cuMemHostRegister
        cu.cuMemHostRegister = lambda ptr, n, flags: (cu.CUresult.CUDA_ERROR_NOT_PERMITTED,)
        try:
            out["refused"] = load()
        finally:
            cu.cuMemHostRegister = real_register
        out["warnings"] = warnings

        def damaged(k, how):
            path = store.chunks.chunk_path(alloc.chunks[k].id)
            data = bytearray(open(path, "rb").read())
            os.chmod(path, 0o644)
            if how == "remove":
                os.unlink(path)
            else:
                with open(path, "wb") as f:
                    f.write(data[:-1] if how == "truncate" else data[:100] + bytes([data[100] ^ 0xFF]) + data[101:])
            try:
                load()
                result = "loaded"
            except (ChunkDamaged, ChunkMissing) as e:
                result = f"{type(e).__name__}: {e}"
            file_pages.wait_released()
            with open(path, "wb") as f:  # as it was, for the next case
                f.write(data)
            return {"error": result, "chunk": alloc.chunks[k].id, "made": Counted.made,
                    "released": Counted.released}

        out["corrupt"] = damaged(3, "corrupt")
        out["truncated"] = damaged(4, "truncate")
        out["removed"] = damaged(5, "remove")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
