"""Run by test_unchanged_save.py in a process that loads the (fake) CUDA driver.

    unchanged_save.py STORE

The fake driver runs no kernels, so the copy engine finds no GpuHasher there (checked first). This
program then gives the engine a stand-in hasher that computes the same ids on the CPU (reading the
memory back), to exercise the save path around it: a second save of unchanged memory copies
nothing, counts it `unchanged` and refreshes the chunks' mtimes; a chunk removed from the store, or
rewritten on the device, crosses the link again, put under its device id without hashing it again
unless it is the first of its length copied (or every 64th); a hasher that lies about such a chunk
makes the save fail, and so does memory written between its hashing and the end of its copy; a
save in a process that loads next (pin_ahead) pins its ring ahead from its start, and one that copied
nothing leaves it to the load;
memory written mid-save in one allocation of a group fails the save, naming it.
Prints one JSON line.
"""
import contextlib
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

    def reserve(self, count):
        pass

    def start_ids(self, ptr, size, chunk_size, stream, first=0):
        ids = self.chunk_ids(ptr, size, chunk_size, stream) if size else []
        return type("Ready", (), {"result": lambda _self: ids})()

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
            puts = []  # the id each put was given: None where put hashes the bytes itself
            real_put = session.put
            session.put = lambda data, cid=None: (puts.append(cid), real_put(data, cid))[1]
            alloc3, third = engine.save("a", mem.ptr, size, 0)
            del session.put
            out["third"] = summary(alloc3, third)
            out["third_put_ids"] = puts
        # A fresh engine: chunk 6, with a wrong GPU id (so not present), is its first copy.
        with CopyEngine(session, ring_slots=3, chunk_size=chunk, workers=2) as engine:
            engine._hashers[0] = CpuHasher(lie_at=6)
            try:
                engine.save("a", mem.ptr, size, 0)
                out["lie"] = "saved"
            except DriverError as e:
                out["lie"] = str(e)
        out["hasher_calls"] = hasher.calls
        out["pin_ahead"] = pinned_in_a_holder(session, store, mem, size, chunk, alloc3)
        out["pin_ahead_copied"] = pinned_in_a_holder(session, store, mem, size, chunk, alloc3, lose=2)
        out["changed"] = written_while_saved(session, store, mem, size, chunk, alloc3)  # it writes
        out["changed_in_group"] = written_in_a_group(session, store, mem, size, chunk)
    json.dump(out, sys.stdout)


class WritesAfterHashing(CpuHasher):
    """Hashes, then (once) rewrites one chunk on the device: a process still writing mid-save."""

    def __init__(self, rewrite_at):
        super().__init__()
        self.rewrite_at = rewrite_at

    def chunk_ids(self, ptr, size, chunk_size, stream=0):
        ids = super().chunk_ids(ptr, size, chunk_size, stream)
        if self.rewrite_at is not None:
            off, self.rewrite_at = self.rewrite_at, None
            drv.check(drv.driver().cuMemsetD8(int(ptr) + off, 0x3C, chunk_size), "write mid-save")
        return ids


def written_while_saved(session, store, mem, size, chunk, alloc):
    """A save whose memory changes between hashing and the end of its copies (chunk 3 rewritten
    after the ids were computed; chunk 2 missing from the store, so something is copied)."""
    os.unlink(store.chunks.chunk_path(alloc.chunks[2].id))
    with CopyEngine(session, ring_slots=3, chunk_size=chunk, workers=2) as engine:
        engine._hashers[0] = WritesAfterHashing(rewrite_at=3 * chunk)
        try:
            engine.save("a", mem.ptr, size, 0)
            return "saved"
        except DriverError as e:
            return str(e)


def pinned_in_a_holder(session, store, mem, size, chunk, alloc, lose=None):
    """A suspend, then its resume, in one holder: the ring's pages faulted in from discovery on
    (memory.fault_in_ahead, as engine/steps.py's discover does), its buffers pinned ahead (in the
    background, from the save's start) or on the save's or the load's path. The memory is
    unchanged, but for chunk `lose` of alloc, removed from the store first: the save copies it."""
    if lose is not None:
        os.unlink(store.chunks.chunk_path(alloc.chunks[lose].id))
    for b in memory.take_kept():  # what earlier engines kept: none of it for this case
        b.free()
    made = {"ahead": 0, "on the path": 0}
    faulted = {"ahead": 0, "on the path": 0}
    real, real_faulted_in = memory.PinnedBuffer, memory._faulted_in

    def counted(n):
        ahead = threading.current_thread().name.startswith("pin-ahead")  # its thread, or one of its pool
        made["ahead" if ahead else "on the path"] += 1
        return real(n)

    def faulted_counted(n):
        faulted["ahead" if threading.current_thread().name.startswith("fault-ahead") else "on the path"] += 1
        return real_faulted_in(n)

    memory.PinnedBuffer, memory._faulted_in = counted, faulted_counted
    try:
        memory.fault_in_ahead(chunk, 3)
        with CopyEngine(session, ring_slots=3, chunk_size=chunk, workers=2, pin_ahead=True) as engine:
            engine._hashers[0] = CpuHasher()
            _, stats = engine.save("a", mem.ptr, size, 0)
        with CopyEngine(store, ring_slots=3, chunk_size=chunk, workers=2) as engine:
            engine.load(alloc, mem.ptr, 0)
        return {"copied": stats.copied, "by_save": made["ahead"], "by_load": made["on the path"],
                "faulted_ahead": faulted["ahead"], "faulted_on_the_path": faulted["on the path"]}
    finally:
        memory.PinnedBuffer, memory._faulted_in = real, real_faulted_in


class WritesAfterHashingAt(CpuHasher):
    """Hashes, then (once) rewrites the chunk at device address `target` when the region hashed
    holds it: one allocation of a group still written mid-save."""

    def __init__(self, target):
        super().__init__()
        self.target = target

    def chunk_ids(self, ptr, size, chunk_size, stream=0):
        ids = super().chunk_ids(ptr, size, chunk_size, stream)
        if self.target is not None and int(ptr) <= self.target < int(ptr) + size:
            target, self.target = self.target, None
            drv.check(drv.driver().cuMemsetD8(target, 0x5D, chunk_size), "write mid-save")
        return ids


def written_in_a_group(session, store, mem, size, chunk):
    """The memory saved as three allocations (3, 3 and 2 MiB) in one group; chunks 2 and 6 missing
    from the store, so pieces 0 and 2 are copied, and the chunk after 6 rewritten once its piece
    was hashed: the group's second look names piece 2 and the offset in it."""
    from criu_gpushare.gpu.copy_engine import SaveItem
    now = CpuHasher().chunk_ids(mem.ptr, size, chunk)
    for i in (2, 6):
        path = store.chunks.chunk_path(now[i])
        if os.path.exists(path):
            os.unlink(path)
    pieces = [(0, 3 * MiB), (3 * MiB, 3 * MiB), (6 * MiB, 2 * MiB)]
    with CopyEngine(session, ring_slots=3, chunk_size=chunk, workers=2) as engine:
        engine._hashers[0] = WritesAfterHashingAt(int(mem.ptr) + 7 * MiB)
        try:
            engine.save_all([SaveItem(f"p{k}", n, 0, lambda o=off: contextlib.nullcontext(int(mem.ptr) + o))
                             for k, (off, n) in enumerate(pieces)])
            return "saved"
        except DriverError as e:
            return str(e)


if __name__ == "__main__":
    main()
