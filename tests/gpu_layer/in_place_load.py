"""Run by test_in_place_load.py in a process that loads the (fake) CUDA driver, with the store on a
tmpfs.

    in_place_load.py STORE

Saves 8 MiB (two zero chunks, six of data), registers its chunk files ahead (gpu/file_pages.py
RegisteredAhead), then loads it back: all of it from the registered pages, checked on the host (the
fake runs no hash kernel), with no pinned ring; half registered, half read through the ring; a
chunk corrupted in its file after it was registered, refused; a chunk removed before the
registering, which stops there (the rest loads through the ring and the missing chunk is refused);
the driver refusing every registration (nothing registered, the load reads the store). Every page
registered is released. Prints one JSON line.
"""
import ctypes
import json
import logging
import os
import sys
import time

from criu_gpushare.gpu import driver as drv, file_pages
from criu_gpushare.gpu.copy_engine import CopyEngine
from criu_gpushare.gpu.memory import ImportedAllocation, use_device
from criu_gpushare.store.chunkdir import ChunkDamaged, ChunkMissing
from criu_gpushare.store.store import Store

from copy_roundtrip import exportable_allocation
from verified_load import filled_and_saved

MiB = 1 << 20


class Counted(file_pages.FilePages):
    made, released = 0, 0

    def __init__(self, *args):
        super().__init__(*args)
        Counted.made += 1

    def free(self):
        super().free()
        Counted.released += 1


def main():
    file_pages.FilePages = Counted
    warnings = []
    logging.getLogger("criu_gpushare.gpu.file_pages").addHandler(
        type("H", (logging.Handler,), {"emit": lambda self, r: warnings.append(r.getMessage())})())
    cu = drv.driver()
    use_device(0)
    size, chunk = 8 * MiB, MiB
    path = sys.argv[1]
    _, fd = exportable_allocation(size)
    out = {}
    with ImportedAllocation(fd, size, 0) as mem, Store.open(path, create=True) as store:
        alloc = filled_and_saved(store, mem)
        before = (ctypes.c_char * size)()
        drv.check(cu.cuMemcpyDtoH(before, mem.ptr, size), "read back")
        out["pages"] = store.chunk_pages()
        data = [(c.id, c.length) for c in alloc.chunks if not c.is_zero]

        def registered(chunks):
            ahead = file_pages.RegisteredAhead(lambda: Store.open(path), chunks, 0).start()
            while ahead.seconds is None:
                time.sleep(0.01)
            return ahead.take()

        def load(pages):
            drv.check(cu.cuMemsetD8(mem.ptr, 0xAB, size), "scribble")
            try:
                with CopyEngine(store, ring_slots=3, chunk_size=chunk, workers=2, verify_loads=True,
                                registered=pages) as engine:
                    stats = engine.load(alloc, mem.ptr, 0)
                    pinned = engine._ring is not None
            except (ChunkDamaged, ChunkMissing) as e:
                return {"error": f"{type(e).__name__}: {e}"}
            finally:
                file_pages.release_later(list(pages.values()), 0)
                file_pages.wait_released()
            after = (ctypes.c_char * size)()
            drv.check(cu.cuMemcpyDtoH(after, mem.ptr, size), "read back")
            return {"intact": bytes(after) == bytes(before), "in_place": stats.in_place,
                    "ring_pinned": pinned}

        out["all"] = load(registered(data))
        out["half"] = load(registered(data[:3]))
        pages = registered(data)
        victim = store.chunks.chunk_path(alloc.chunks[3].id)
        os.chmod(victim, 0o644)
        with open(victim, "r+b") as f:  # in place: the registered pages are the file's
            f.seek(100)
            byte = f.read(1)
            f.seek(100)
            f.write(bytes([byte[0] ^ 0xFF]))
        out["corrupt"] = dict(load(pages), chunk=alloc.chunks[3].id)
        with open(victim, "r+b") as f:
            f.seek(100)
            f.write(byte)
        gone = store.chunks.chunk_path(alloc.chunks[4].id)
        kept = open(gone, "rb").read()
        os.unlink(gone)
        warnings.clear()
        pages = registered(data)
        out["removed"] = dict(load(pages), chunk=alloc.chunks[4].id, registered=len(pages),
                              warnings=list(warnings))
        with open(gone, "wb") as f:
            f.write(kept)
        real_register = cu.cuMemHostRegister
        cu.cuMemHostRegister = lambda ptr, n, flags: (cu.CUresult.CUDA_ERROR_NOT_PERMITTED,)
        warnings.clear()
        try:
            pages = registered(data)
        finally:
            cu.cuMemHostRegister = real_register
        out["refused"] = dict(load(pages), registered=len(pages), warnings=list(warnings))
        out["made"], out["released"] = Counted.made, Counted.released
    print(json.dumps(out))


if __name__ == "__main__":
    main()
