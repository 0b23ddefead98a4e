"""Where a cold save and a load of GPU memory spend their time: the copy engine, stage by stage.

    python3 bench/save_stages_bench.py --gib 40                       # store under /dev/shm
    python3 bench/save_stages_bench.py --gib 40 --dir /mnt/huge-tmpfs

Needs a GPU. In one process, GIB of device memory (distinct, non-zero 64 MiB chunks) goes through
the tool's CopyEngine into a fresh store, then back, with one stage taken out at a time so that
each row's difference from the first says what that stage costs:

  pin 1 GiB, cuMemHostAlloc / the tool's buffers   the ring's pinning (memory.PinnedBuffer)
  GPU chunk ids                                    the XXH3 kernel over all of it
  pin 1 GiB on N threads: first / last 64 MiB ready
                                                   when the ring's first and last buffers are
                                                   pinned (could a save copy before all are?)
  pin 1 GiB: pages faulted in / registered         the ring's pinning cut in its two parts: the
                                                   kernel faulting fresh pages in (no driver call:
                                                   memory.fault_in_ahead), then registering them
  import and map, alone / beside pinning 1 GiB / beside faulting 1 GiB in / beside registering 1 GiB
                                                   the save's opening of the memory (the group's
                                                   fd imported and mapped, memory.ImportedAllocation)
                                                   while the ring's pinning, or either part of it,
                                                   runs on two threads: what each holds up
  GPU chunk ids, GPU idle first (1 GiB at a time)  the same after a second without kernels, whole
                                                   or one launch per 1 GiB: what idle clocks and
                                                   per-allocation launches cost
  GPU hasher made                                  its module loaded and self-tested: once per
                                                   copy engine and GPU
  save, first                                      the run's first save: on a machine just booted
                                                   it also pays the first touch of the store's memory
  save                                             as the tool saves (GPU ids, a sample re-hashed)
  save, every chunk hashed on the host too         as it saved before FORMAT.md section 13's sample
  save, no host hash at all                        put never hashes
  save, copies only                                device to the pinned ring, nothing stored
  save unchanged, one allocation / 1 GiB allocations
                                                   a save of what the store holds already, after
                                                   the GPU sat idle: the unchanged dump's save
  load, reads only, chunks never read before       reading chunk files just written (a resume after
                                                   a cold suspend) against reading them again
  load / load, no check / load, copies only        the same for the way back
  load, reads only                                 the store read into the ring, nothing copied to
                                                   the GPU: what reading alone allows
  load, no check, 32 slots and workers             twice the ring and the readers: whether the
                                                   load's reading is bound by them
  load ahead                                       the load into a new buffer of the tool's own
                                                   (gpu/staging.py: what a restore does while CRIU
                                                   restores the processes)
  chunk files registered ahead, the loads from them, their release
                                                   a store in memory (tmpfs) only: its chunk files
                                                   mapped and registered with the driver as a
                                                   suspended group's holder does (gpu/file_pages.py),
                                                   then copied from their own pages by the load
                                                   and the load ahead, then released
  device to device                                 a second copy on the GPU (what a load ahead
                                                   leaves to the load step: engine/ahead.py)
  DMA into the page cache / DMA from the page cache
                                                   each chunk file mapped, registered, copied and
                                                   released one by one on 16 threads, written
                                                   (new files) or read: a save that way is not
                                                   the tool's (registering new pages is slow)
The ring is pinned before the save and load rows (their figures leave its pinning out). Each row
after the first save is the best of --repeat runs (default 2). Prints seconds and GB/s (10^9
bytes/s) per row.
"""
import argparse
import concurrent.futures
import contextlib
import itertools
import mmap
import os
import shutil
import sys
import threading
import time
from unittest import mock

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from criu_gpushare.errors import DriverError  # noqa: E402
from criu_gpushare.gpu import copy_engine as ce, driver as drv, file_pages, memory  # noqa: E402
from criu_gpushare.gpu.fingerprint import GpuHasher  # noqa: E402
from criu_gpushare.gpu.staging import StagedLoad  # noqa: E402
from criu_gpushare.store import base as store_base, memfs  # noqa: E402
from criu_gpushare.store.results import PutResult, PutStatus  # noqa: E402
from criu_gpushare.store.store import Store  # noqa: E402

import exportable  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gib", type=float, default=16.0, help="GiB of device memory (default 16)")
    ap.add_argument("--dir", default="/dev/shm", help="where the store is made (removed after)")
    ap.add_argument("--repeat", type=int, default=2, help="runs per row, the best shown (default 2)")
    args = ap.parse_args()
    size = int(args.gib * 2**30) // ce.CHUNK_SIZE * ce.CHUNK_SIZE
    root = os.path.join(args.dir, f"save-stages-{os.getpid()}")
    cu = drv.driver()
    memory.use_device(0)
    rows = []

    def row(name, seconds, nbytes=size):
        rows.append((name, seconds, nbytes / seconds / 1e9 if seconds and nbytes else None))
        print(f"  {name:52s} {seconds:7.3f} s", flush=True)

    def timed(fn):
        t = time.monotonic()
        out = fn()
        return time.monotonic() - t, out

    def best(fn):
        """fn() -> seconds, run --repeat times: the least."""
        return min(fn() for _ in range(max(1, args.repeat)))

    def attempt(name, fn):
        """A row for a way the driver may refuse (registering file pages): its error instead."""
        try:
            row(name, timed(fn)[0])
        except (DriverError, OSError) as e:
            print(f"  {name}: failed: {e}", flush=True)
            rows.append((name, None, None))

    handle, ptr = exportable.allocation(size)  # as a shim's memory, exported: the import rows map
    fd = exportable.export(handle)             # it a second time
    for i, off in enumerate(range(0, size, ce.CHUNK_SIZE)):  # distinct and never all zero
        drv.check(cu.cuMemsetD32(int(ptr) + off, (i * 2654435761 + 1) & 0xFFFFFFFF, ce.CHUNK_SIZE // 4), "fill")
    drv.check(cu.cuCtxSynchronize(), "fill")

    s, host = timed(lambda: [drv.check(cu.cuMemHostAlloc(ce.CHUNK_SIZE, 0), "pin") for _ in range(16)])
    row("pin 1 GiB, cuMemHostAlloc", s, 2**30)
    for p in host:
        cu.cuMemFreeHost(p)
    s, ring = timed(lambda: memory.pin_buffers(ce.CHUNK_SIZE, 16))
    row("pin 1 GiB, the tool's buffers", s, 2**30)
    memory.keep_pinned(ring)
    for threads in (16, 2):
        ready = pin_ready_times(16, threads)
        row(f"pin 1 GiB on {threads} threads: first 64 MiB ready", ready[0], 0)
        row(f"pin 1 GiB on {threads} threads: last 64 MiB ready", ready[-1], 0)
    with nothing_kept():  # the ring kept for the rows below would count as pinned ahead
        row("pin 1 GiB: pages faulted in", best(lambda: pinned_in_parts()[0]), 2**30)
        row("pin 1 GiB: pages faulted in first, registered", best(lambda: pinned_in_parts()[1]), 2**30)
        for beside in (None, "pinning 1 GiB", "faulting 1 GiB in", "registering 1 GiB"):
            row(f"import and map, {'beside ' + beside if beside else 'alone'}",
                best(lambda: imported_beside(fd, size, beside)), 0)

    def made_and_closed():
        GpuHasher.create(0).close()  # what every copy engine pays once per GPU

    hasher = GpuHasher.create(0)
    if hasher is None:  # e.g. the tests' fake driver, which runs no kernels: every chunk is copied
        print("  GPU chunk ids: no usable GPU hasher here", flush=True)
    else:
        hasher.chunk_ids(ptr, size, ce.CHUNK_SIZE)  # the kernel's first launch apart
        row("GPU chunk ids", timed(lambda: hasher.chunk_ids(ptr, size, ce.CHUNK_SIZE))[0])
        time.sleep(IDLE_S)
        row("GPU chunk ids, GPU idle first", timed(lambda: hasher.chunk_ids(ptr, size, ce.CHUNK_SIZE))[0])
        time.sleep(IDLE_S)
        row("GPU chunk ids, 1 GiB at a time, GPU idle first",
            timed(lambda: [hasher.chunk_ids(int(ptr) + off, min(PIECE, size - off), ce.CHUNK_SIZE)
                           for off in range(0, size, PIECE)])[0])
        hasher.close()
        row("GPU hasher made (module, self-test)", best(lambda: timed(made_and_closed)[0]), 0)

    def loaded_ahead(allocation, registered=None):
        """A load ahead of the whole allocation (buffer made, store read, checked): its seconds."""
        t = time.monotonic()
        staged = StagedLoad(lambda: [(allocation, 0)], lambda: Store.open(root), registered=registered).start()
        try:
            staged.wait()
            if staged.error is not None:
                raise DriverError(f"loading ahead failed: {staged.error}")
            return time.monotonic() - t
        finally:
            staged.close()

    def allocate_pieces():
        """What loading ahead makes before its first read (gpu/staging.py: one buffer per
        allocation, here 1 GiB ones): their seconds, the buffers freed after."""
        t = time.monotonic()
        made = [drv.check(cu.cuMemAlloc(min(PIECE, size - off)), "allocate") for off in range(0, size, PIECE)]
        seconds = time.monotonic() - t
        for p in made:
            cu.cuMemFree(p)
        return seconds

    def fresh_store():
        shutil.rmtree(root, ignore_errors=True)
        return Store.open(root, create=True)

    def save():
        with fresh_store() as store, ce.CopyEngine(store, total_bytes=size) as engine:
            return timed(lambda: engine.save("a", ptr, size, 0))

    def save_unchanged(piece):
        """A save into the store save() just filled, the memory cut in allocations of `piece`
        bytes (as a workload's 1 GiB blocks), after the GPU sat idle: every chunk is found
        unchanged on the GPU and nothing crosses the link."""
        items = [ce.SaveItem(f"a{off}", min(piece, size - off), 0,
                             lambda p=int(ptr) + off: contextlib.nullcontext(p))
                 for off in range(0, size, piece)]
        with Store.open(root) as store, ce.CopyEngine(store, total_bytes=size) as engine:
            engine.hasher(0)
            time.sleep(IDLE_S)
            return timed(lambda: engine.save_all(items))[0]

    def load(allocation, verify, slots=16, registered=None):
        """A load through the ring, or from the chunk files' `registered` pages: its seconds."""
        with Store.open(root) as store, ce.CopyEngine(store, ring_slots=slots, workers=slots, verify_loads=verify,
                                                      total_bytes=size, registered=registered) as engine:
            return timed(lambda: engine.load(allocation, ptr, 0))[0]

    def registered_ahead(allocation):
        """(seconds, {chunk id: FilePages}): the allocation's chunk files registered as a
        suspended group's holder does (gpu/file_pages.py RegisteredAhead), waited for whole."""
        chunks = [(c.id, c.length) for c in allocation.chunks if not c.is_zero]
        ahead = file_pages.RegisteredAhead(lambda: Store.open(root), chunks, 0).start()
        ahead.join()
        return ahead.seconds, ahead.take()

    def released(pages):
        file_pages.release_later(list(pages.values()), 0)
        return timed(file_pages.wait_released)[0]

    try:
        row("save, first", save()[0])
        row("save", best(lambda: save()[0]))
        with mock.patch.object(ce, "HOST_CHECK_EVERY", 1):
            row("save, every chunk hashed on the host too", best(lambda: save()[0]))
        counter = itertools.count(1)
        with mock.patch.object(store_base, "chunk_id", lambda view: f"{next(counter):032x}"), \
                mock.patch.object(ce, "_check_same_id", lambda *a: None):
            row("save, no host hash at all", best(lambda: save()[0]))

        def no_put(self, data, cid=None):
            return PutResult(cid or f"{next(counter):032x}", len(data), PutStatus.NEW)

        with mock.patch.object(Store, "put", no_put), mock.patch.object(ce, "_check_same_id", lambda *a: None):
            row("save, copies only", best(lambda: save()[0]))
        s, (allocation, _) = save()  # the store the loads read
        row("save unchanged, one allocation, GPU idle first", save_unchanged(size))
        row("save unchanged, 1 GiB allocations, GPU idle first", save_unchanged(PIECE))
        cu = drv.driver()
        with mock.patch.object(cu, "cuMemcpyHtoDAsync", lambda *a: (cu.CUresult.CUDA_SUCCESS,)):
            s, (fresh, _) = save()  # chunk files written now and never read yet
            row("load, reads only, chunks never read before", load(fresh, False))
        s, (allocation, _) = save()
        row("load", best(lambda: load(allocation, True)))
        row("load, no check", best(lambda: load(allocation, False)))
        with mock.patch.object(Store, "get", lambda self, cid, buf, verify=True: None):
            row("load, copies only", best(lambda: load(allocation, False)))
        with mock.patch.object(cu, "cuMemcpyHtoDAsync", lambda *a: (cu.CUresult.CUDA_SUCCESS,)):
            row("load, reads only", best(lambda: load(allocation, False)))
        row("load, no check, 32 slots and workers", best(lambda: load(allocation, False, slots=32)))
        row("load ahead (buffer made, read, checked)", best(lambda: loaded_ahead(allocation)))
        if memfs.pages_of(args.dir) is not None:
            seconds, pages = registered_ahead(allocation)
            row("chunk files registered ahead", seconds)
            row("load, from the registered chunk files", best(lambda: load(allocation, True, registered=pages)))
            row("load ahead, from the registered chunk files",
                best(lambda: loaded_ahead(allocation, registered=pages)))
            row("the registered chunk files released", released(pages))
        else:
            print(f"  chunk files registered ahead: not run: {args.dir} is not in memory (tmpfs)", flush=True)
        row("load ahead's buffers made, 1 GiB each", best(allocate_pieces))
        attempt("device to device", lambda: device_to_device(ptr, size))
        with Store.open(root) as store:
            paths = [store.chunk_path(c.id) for c in allocation.chunks]
        attempt("DMA from the page cache", lambda: direct_dma(paths, ptr, to_device=True))
        scratch = os.path.join(root, "direct")
        os.makedirs(scratch)
        paths = [os.path.join(scratch, str(i)) for i in range(len(paths))]
        attempt("DMA into the page cache", lambda: direct_dma(paths, ptr, to_device=False))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    workers = min(16, os.cpu_count() or 4)  # as CopyEngine
    print(f"\n{args.gib:g} GiB, store in {args.dir}, ring {ce.ring_size(size)} x 64 MiB, {workers} workers")
    print(f"{'stage':52s} {'s':>8s} {'GB/s':>8s}")
    for name, s, rate in rows:
        if s is None:
            print(f"{name:52s} {'failed':>8s} {'-':>8s}")
        else:
            print(f"{name:52s} {s:8.3f} {rate:8.2f}" if rate else f"{name:52s} {s:8.3f} {'-':>8s}")


READ_ONLY = 0x08  # CU_MEMHOSTREGISTER_READ_ONLY
IDLE_S = 1.0  # a GPU left this long without kernels has let its clocks fall
PIECE = 1 << 30  # the allocation size of the "1 GiB" rows


def pin_ready_times(count, threads):
    """Seconds, sorted, at which each of `count` ring buffers (64 MiB) pinned on `threads` threads
    (memory.pin_pool, as the ring pins them) was ready: whether a save could start copying before
    the whole ring is pinned."""
    t0 = time.monotonic()
    pool, futures = memory.pin_pool(ce.CHUNK_SIZE, count, threads)
    with pool:
        ready = [time.monotonic() - t0 for _ in concurrent.futures.as_completed(futures)]
    for f in futures:
        f.result().free()
    return ready


@contextlib.contextmanager
def nothing_kept():
    """The buffers this process keeps for its next ring set aside meanwhile, then kept again."""
    kept = memory.take_kept()
    try:
        yield
    finally:
        memory.keep_pinned(kept)


def pinned_in_parts():
    """(seconds to fault in the pages of 16 ring buffers, seconds to pin the buffers on them), on
    PIN_THREADS threads as a suspend's holder does both; the buffers freed after."""
    t = time.monotonic()
    concurrent.futures.wait(memory.fault_in_ahead(ce.CHUNK_SIZE, 16))
    faulted = time.monotonic() - t
    t = time.monotonic()
    buffers = memory.pin_buffers(ce.CHUNK_SIZE, 16)
    registered = time.monotonic() - t
    for b in buffers:
        b.free()
    return faulted, registered


def imported_beside(fd, size, beside):
    """Seconds to import fd (size bytes) and map it, as the save opens a group's memory, started
    with `beside` running on PIN_THREADS threads: None, "pinning 1 GiB" (the ring's buffers made
    whole), "faulting 1 GiB in" (their pages only) or "registering 1 GiB" (pages faulted in before,
    then registered). Each waited for and undone after."""
    pool, futures = None, []
    if beside in ("faulting 1 GiB in", "registering 1 GiB"):
        futures = memory.fault_in_ahead(ce.CHUNK_SIZE, 16)
    if beside == "registering 1 GiB":
        concurrent.futures.wait(futures)  # faulted in before: the pinning below registers only
    if beside in ("pinning 1 GiB", "registering 1 GiB"):
        pool, futures = memory.pin_pool(ce.CHUNK_SIZE, 16)
    t = time.monotonic()
    imported = memory.ImportedAllocation(fd, size, 0)
    seconds = time.monotonic() - t
    imported.close()
    concurrent.futures.wait(futures)
    if pool is not None:
        pool.shutdown()
        for f in futures:
            f.result().free()
    memory.drop_faulted()
    return seconds


def device_to_device(ptr, size):
    """size bytes copied from ptr into a second allocation on the same GPU; its allocation is
    timed too, as a load ahead makes one."""
    cu = drv.driver()
    other = drv.check(cu.cuMemAlloc(size), f"allocate a second {size} bytes")
    try:
        drv.check(cu.cuMemcpyDtoD(other, ptr, size), "copy device to device")
        drv.check(cu.cuCtxSynchronize(), "copy device to device")
    finally:
        cu.cuMemFree(other)


def direct_dma(paths, ptr, to_device, workers=16):
    """Each 64 MiB file of `paths` (chunk i at ptr + i * 64 MiB) mapped, registered with the driver
    and copied by DMA straight from (to_device) or into (made now) its pages, on `workers`
    threads, each with its own stream."""
    cu = drv.driver()
    ctx = drv.check(cu.cuCtxGetCurrent(), "current context")
    local = threading.local()

    def one(i):
        if not hasattr(local, "stream"):
            drv.check(cu.cuCtxSetCurrent(ctx), "context")
            local.stream = drv.check(cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING), "stream")
        n = ce.CHUNK_SIZE
        fd = os.open(paths[i], os.O_RDONLY if to_device else os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if not to_device:
                os.ftruncate(fd, n)
            prot = mmap.PROT_READ | (0 if to_device else mmap.PROT_WRITE)
            addr = memory.map_pages(n, prot, mmap.MAP_SHARED, fd)
            try:
                drv.check(cu.cuMemHostRegister(addr, n, READ_ONLY if to_device else 0), "register")
                dev = int(ptr) + i * n
                copy = (cu.cuMemcpyHtoDAsync(dev, addr, n, local.stream) if to_device
                        else cu.cuMemcpyDtoHAsync(addr, dev, n, local.stream))
                drv.check(copy, "copy")
                drv.check(cu.cuStreamSynchronize(local.stream), "sync")
                drv.check(cu.cuMemHostUnregister(addr), "unregister")
            finally:
                memory.unmap_pages(addr, n)
            if not to_device:
                os.fdatasync(fd)
        finally:
            os.close(fd)

    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        list(pool.map(one, range(len(paths))))


if __name__ == "__main__":
    main()
