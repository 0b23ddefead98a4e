"""Run by test_staged_load.py in a process that loads the (fake) CUDA driver.

    staged_load.py STORE

Saves two allocations (8 MiB with two zero chunks, and 4 MiB), then, each case a key of the JSON
line it prints:
  staged     StagedLoad reads both into the tool's own GPU memory; the store's chunk files are
             then removed, and load_all still brings both back whole into new memory, device to
             device (CopyStats.ahead); close() gives the buffers' GPU memory back
  damaged    a damaged chunk: StagedLoad ends with the error, wait() answers {}, nothing is held
  no_room    the second of three placements cannot be allocated: the first is loaded, the third
             is not tried
  stopped    close() while the store is being read: the loading stops at its next chunk
"""
import ctypes
import json
import os
import shutil
import sys
import threading

from criu_gpushare.gpu import driver as drv
from criu_gpushare.gpu.copy_engine import CopyEngine, LoadItem
from criu_gpushare.gpu.memory import ImportedAllocation, use_device
from criu_gpushare.gpu.staging import StagedLoad
from criu_gpushare.store.manifest import Allocation
from criu_gpushare.store.store import Store

from copy_roundtrip import exportable_allocation

MiB = 1 << 20


def contents(ptr, size):
    buf = (ctypes.c_char * size)()
    drv.check(drv.driver().cuMemcpyDtoH(buf, ptr, size), "read back")
    return bytes(buf)


def free_bytes():
    return drv.check(drv.driver().cuMemGetInfo(), "cuMemGetInfo")[0]


def filled(size, seed):
    """Exportable memory holding two zero MiB (when size allows) and then distinct words."""
    cu = drv.driver()
    _, fd = exportable_allocation(size)
    mem = ImportedAllocation(fd, size, 0)
    os.close(fd)
    zero = 2 * MiB if size > 4 * MiB else 0
    drv.check(cu.cuMemsetD8(mem.ptr, 0, size), "zero")
    words = (ctypes.c_uint32 * ((size - zero) // 4))(*range(seed, seed + (size - zero) // 4))
    drv.check(cu.cuMemcpyHtoD(int(mem.ptr) + zero, words, size - zero), "fill")
    return mem


def main():
    root = sys.argv[1]
    use_device(0)
    out = {}
    sources = {"a": filled(8 * MiB, 7), "b": filled(4 * MiB, 99)}
    want = {k: contents(m.ptr, m.size) for k, m in sources.items()}
    with Store.open(root, create=True) as store:
        with store.begin_write("t") as session, CopyEngine(session, ring_slots=2, chunk_size=MiB,
                                                           workers=2) as engine:
            allocs = {k: engine.save(k, m.ptr, m.size, 0)[0] for k, m in sources.items()}
    saved = shutil.copytree(root, root + ".saved")

    def restore_store():
        shutil.rmtree(root)
        shutil.copytree(saved, root)

    placements = [(allocs["a"], 0), (allocs["b"], 0)]
    targets = {k: filled(m.size, 12345) for k, m in sources.items()}
    free_before = free_bytes()
    staged = StagedLoad(lambda: placements, lambda: Store.open(root)).start()
    ptrs = staged.wait()
    held = free_before - free_bytes()
    for name in os.listdir(os.path.join(root, "chunks")):
        shutil.rmtree(os.path.join(root, "chunks", name))
    with Store.open(root) as store, CopyEngine(store, verify_loads=True) as engine:
        stats = engine.load_all([LoadItem(allocs[k], 0, lambda p=targets[k].ptr: _open(p), staged=ptrs[k])
                                 for k in ("a", "b")])
    staged.close()
    out["staged"] = {"keys": sorted(ptrs), "bytes": staged.bytes, "error": repr(staged.error),
                     "held": held, "same": all(contents(targets[k].ptr, targets[k].size) == want[k] for k in want),
                     "ahead": [s.ahead for s in stats], "zero": [s.zero for s in stats],
                     "freed": free_bytes() == free_before}

    restore_store()
    chunk = next(c for c in allocs["a"].chunks if not c.is_zero)
    with Store.open(root) as store:
        path = store.chunk_path(chunk.id)
    os.chmod(path, 0o644)
    with open(path, "r+b") as f:
        f.seek(100)
        f.write(b"\xff\xfe")
    staged = StagedLoad(lambda: placements, lambda: Store.open(root)).start()
    out["damaged"] = {"wait": staged.wait(), "error": str(staged.error), "victim": chunk.id,
                      "freed": free_bytes() == free_before}
    staged.close()

    restore_store()
    too_big = Allocation("big", 1 << 50, allocs["b"].chunks)
    staged = StagedLoad(lambda: [(allocs["a"], 0), (too_big, 0), (allocs["b"], 0)],
                        lambda: Store.open(root)).start()
    out["no_room"] = {"keys": sorted(staged.wait()), "error": repr(staged.error)}
    staged.close()
    out["no_room"]["freed"] = free_bytes() == free_before

    reading, gets = threading.Event(), []
    release = threading.Event()

    class SlowStore(Store):
        def get(self, cid, buf, verify=True):
            gets.append(cid)
            reading.set()
            release.wait(10)
            return super().get(cid, buf, verify)

    staged = StagedLoad(lambda: placements, lambda: SlowStore.open(root)).start()
    reading.wait(10)
    closer = threading.Thread(target=staged.close)
    closer.start()
    staged._stop.wait(10)  # close() has asked it to stop before the read it waits in returns
    release.set()
    closer.join(30)
    total = sum(1 for a, _ in placements for c in a.chunks if not c.is_zero)
    out["stopped"] = {"gets": len(gets), "total": total, "error": type(staged.error).__name__,
                      "closed": not closer.is_alive(), "freed": free_bytes() == free_before}
    print(json.dumps(out))


class _open:
    """A LoadItem's open(): the pointer, as a context manager."""

    def __init__(self, ptr):
        self.ptr = ptr

    def __enter__(self):
        return self.ptr

    def __exit__(self, *exc):
        return False


if __name__ == "__main__":
    main()
