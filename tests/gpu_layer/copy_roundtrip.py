"""Run by test_copy_engine.py in a process that loads the CUDA driver (fake or real).

    copy_roundtrip.py STORE MIB [--ring N --chunk-mib M] [--pieces K [--hold-first-put]]

Allocates MIB MiB of exportable cuMem memory, fills it with a pattern that has an all-zero part and
a repeated part, exports it as a POSIX fd, imports that fd as the tool would (ImportedAllocation),
saves it with the CopyEngine, clears the memory, loads it back, and compares. Prints one JSON line.
With --pieces K the memory is K allocations of equal size (the last takes the rest), saved with
one save_all and loaded with one load_all; "most_open" says how many pieces each was seen to
hold open at once (both hold a hash group open at a time); --hold-first-put holds the save's
first store put until another put has begun (a slow disk), and "first_put_overlapped" says
whether one did (else the first put gave up waiting after HOLD_S).
"""
import contextlib
import argparse
import ctypes
import json
import sys
import threading

from criu_gpushare.gpu import driver as drv
from criu_gpushare.gpu.copy_engine import CopyEngine
from criu_gpushare.gpu.memory import ImportedAllocation, use_device
from criu_gpushare.store.store import Store

HOLD_S = 60.0  # reached only where the puts do not overlap: the test fails then, never by luck


def exportable_allocation(size, device=0):
    cu = drv.driver()
    prop = cu.CUmemAllocationProp()
    prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = device
    prop.requestedHandleTypes = cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
    handle = drv.check(cu.cuMemCreate(size, prop, 0), "cuMemCreate")
    fd = drv.check(cu.cuMemExportToShareableHandle(
        handle, cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0), "export")
    return handle, fd


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("store")
    ap.add_argument("mib", type=int)
    ap.add_argument("--ring", type=int, default=4)
    ap.add_argument("--chunk-mib", type=int, default=1)
    ap.add_argument("--pieces", type=int, default=0)
    ap.add_argument("--hold-first-put", action="store_true")
    args = ap.parse_args()
    cu = drv.driver()
    use_device(0)
    size, chunk = args.mib << 20, args.chunk_mib << 20
    _, fd = exportable_allocation(size)
    with ImportedAllocation(fd, size, 0) as mem, Store.open(args.store, create=True) as store:
        # Layout: first quarter zero, second quarter a constant (dedups within itself), rest distinct.
        q = size // 4
        drv.check(cu.cuMemsetD8(mem.ptr, 0, q), "memset")
        drv.check(cu.cuMemsetD32(int(mem.ptr) + q, 0x5A5A5A5A, q // 4), "memset")
        words = (ctypes.c_uint32 * ((size - 2 * q) // 4))(*range((size - 2 * q) // 4))
        drv.check(cu.cuMemcpyHtoD(int(mem.ptr) + 2 * q, words, len(words) * 4), "fill")
        before = (ctypes.c_char * size)()
        drv.check(cu.cuMemcpyDtoH(before, mem.ptr, size), "read back")
        if args.pieces:
            return pieces(args, store, mem, size, chunk, bytes(before))
        with CopyEngine(store, ring_slots=args.ring, chunk_size=chunk, workers=3) as engine:
            alloc, saved = engine.save("alloc0", mem.ptr, size, 0)
            _, again = engine.save("alloc0", mem.ptr, size, 0)
            drv.check(cu.cuMemsetD8(mem.ptr, 0xEE, size), "clobber")
            loaded = engine.load(alloc, mem.ptr, 0)
            ring = sorted(int(b.ptr) for b in engine._ring)
        with CopyEngine(store, ring_slots=args.ring, chunk_size=chunk, workers=3) as later:
            later.prepare(0)  # a later engine of this process pins nothing anew
            reused = sorted(int(b.ptr) for b in later._ring) == ring
        after = (ctypes.c_char * size)()
        drv.check(cu.cuMemcpyDtoH(after, mem.ptr, size), "read back")
    json.dump({"same": bytes(before) == bytes(after), "chunks": len(alloc.chunks),
               "zero_chunks": sum(c.is_zero for c in alloc.chunks),
               "first": {"copied": saved.copied, "written": saved.written,
                         "dedup": saved.deduplicated, "zero": saved.zero},
               "second": {"written": again.written, "dedup": again.deduplicated, "zero": again.zero},
               "loaded": loaded.copied, "ring_reused": reused}, sys.stdout)


def pieces(args, store, mem, size, chunk, before):
    from criu_gpushare.gpu.copy_engine import LoadItem, SaveItem
    cu = drv.driver()
    step = size // args.pieces // 4096 * 4096
    bounds = [(k * step, step if k < args.pieces - 1 else size - k * step) for k in range(args.pieces)]
    state = {"open": 0, "most": 0, "order": []}

    @contextlib.contextmanager
    def opened(k):
        state["open"] += 1
        state["most"] = max(state["most"], state["open"])
        state["order"].append(k)
        try:
            yield int(mem.ptr) + bounds[k][0]
        finally:
            state["open"] -= 1

    class HeldPuts:  # the store, its first put held until another one begins (a slow disk)
        def __init__(self):
            self.lock, self.began, self.another = threading.Lock(), 0, threading.Event()
            self.overlapped = None

        def put(self, data, cid=None):
            with self.lock:
                self.began += 1
                first = self.began == 1
            if first:
                self.overlapped = self.another.wait(HOLD_S)
            else:
                self.another.set()
            return store.put(data, cid)

        def get(self, *a, **kw):
            return store.get(*a, **kw)

        def chunk_pages(self):
            return store.chunk_pages()

    held = HeldPuts() if args.hold_first_put else None
    with CopyEngine(held or store, ring_slots=args.ring, chunk_size=chunk, workers=3) as engine:
        saved = engine.save_all([SaveItem(f"p{k}", n, 0, lambda k=k: opened(k)) for k, (_, n) in enumerate(bounds)])
        most_open = {"save": state["most"]}
        state["most"] = 0
        drv.check(cu.cuMemsetD8(mem.ptr, 0xEE, size), "clobber")
        loaded = engine.load_all([LoadItem(a, 0, lambda k=k: opened(k)) for k, (a, _) in enumerate(saved)])
        most_open["load"] = state["most"]
    after = (ctypes.c_char * size)()
    drv.check(cu.cuMemcpyDtoH(after, mem.ptr, size), "read back")
    json.dump({"same": before == bytes(after), "most_open": most_open, "open_now": state["open"],
               "order": state["order"],
               "first_put_overlapped": held.overlapped if held else None,
               "saved": sum(s.written + s.deduplicated + s.zero for _, s in saved),
               "loaded": sum(s.copied for s in loaded)}, sys.stdout)


if __name__ == "__main__":
    main()
