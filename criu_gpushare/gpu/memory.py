"""GPU memory in the tool's own CUDA context: contexts per device, fd imports, pinned host buffers.

The tool reaches a workload's allocation by importing the POSIX fd the workload's shim exported:
the driver maps the same physical memory into the tool, so copies run at link speed and never go
through the workload process.
"""
import concurrent.futures
import ctypes
import logging
import mmap
import os
import threading
import time

from . import driver as drv
from ..errors import DriverError

log = logging.getLogger(__name__)

_contexts = {}
_contexts_lock = threading.Lock()


def fd_handle_type():
    """The shareable handle type of the memory the shims export: a POSIX fd."""
    cu = drv.driver()
    return cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR


def set_read_write(ptr, size, device):
    """Read-write access from `device` to the mapped range [ptr, ptr + size) (one mapping or
    several side by side)."""
    cu = drv.driver()
    desc = cu.CUmemAccessDesc()
    desc.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    desc.location.id = device
    desc.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    drv.check(cu.cuMemSetAccess(ptr, size, [desc], 1), "set access to the imported memory")


def use_device(ordinal):
    """Make the device's primary context current in this thread (retained once per process)."""
    cu = drv.driver()
    with _contexts_lock:
        ctx = _contexts.get(ordinal)
        if ctx is None:
            dev = drv.check(cu.cuDeviceGet(ordinal), f"cuDeviceGet({ordinal})")
            ctx = drv.check(cu.cuDevicePrimaryCtxRetain(dev), f"retain the context of GPU {ordinal}")
            _contexts[ordinal] = ctx
    drv.check(cu.cuCtxSetCurrent(ctx), f"make GPU {ordinal} current")
    return ctx


def retain_ahead(ordinals):
    """The primary contexts of `ordinals` made in a thread, now: the driver takes about 0.1 s for
    each, which the first use_device would otherwise wait for whole (it waits for what is left:
    the lock is held while one is made). Best effort: a failure here is met again, and reported,
    where the context is needed."""
    def retain():
        for ordinal in ordinals:
            try:
                use_device(ordinal)
            except Exception as e:  # noqa: BLE001 - an optimisation only
                log.debug("the context of GPU %s was not made ahead: %s", ordinal, e)

    threading.Thread(target=retain, name="context-ahead", daemon=True).start()


def free_memory(ordinal):
    """Free bytes on GPU `ordinal` now, read in this process's primary context of it, which stays
    retained (use_device) for the work that follows: retained and released around the read alone,
    the driver would make the context and destroy it, and the next user make it again (0.3 s).
    release_device gives it back where nothing follows."""
    use_device(ordinal)
    free, _ = drv.check(drv.driver().cuMemGetInfo(), "cuMemGetInfo")
    return int(free)


def release_device(ordinal):
    """Give back the device's primary context use_device retained: with nothing else holding it,
    the driver destroys it and frees its GPU memory."""
    with _contexts_lock:
        ctx = _contexts.pop(ordinal, None)
    if ctx is not None:
        cu = drv.driver()
        cu.cuDevicePrimaryCtxRelease(drv.check(cu.cuDeviceGet(ordinal), f"cuDeviceGet({ordinal})"))


class ImportedAllocation:
    """A workload's allocation, imported from its exported fd and mapped read-write in the tool."""

    def __init__(self, fd, size, device):
        cu = drv.driver()
        use_device(device)
        self.size, self.device = size, device
        self.handle = drv.check(cu.cuMemImportFromShareableHandle(fd, fd_handle_type()),
                                f"import fd {fd} ({size} bytes) on GPU {device}")
        try:
            self.ptr = drv.check(cu.cuMemAddressReserve(size, 0, 0, 0), f"reserve {size} bytes of VA")
            try:
                drv.check(cu.cuMemMap(self.ptr, size, 0, self.handle, 0), "map the imported memory")
                set_read_write(self.ptr, size, device)
            except BaseException:
                cu.cuMemUnmap(self.ptr, size)
                cu.cuMemAddressFree(self.ptr, size)
                raise
        except BaseException:
            cu.cuMemRelease(self.handle)
            raise

    def close(self):
        cu = drv.driver()
        use_device(self.device)
        cu.cuMemUnmap(self.ptr, self.size)
        cu.cuMemAddressFree(self.ptr, self.size)
        cu.cuMemRelease(self.handle)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# cuMemHostRegister's flags (cuda.h CU_MEMHOSTREGISTER_*)
REGISTER_PORTABLE = 0x01  # pinned for every context of this process
REGISTER_READ_ONLY = 0x08  # the driver never writes them


class RegisteredPages:
    """Host pages this process mapped (map_pages), registered with the driver so that copies run
    at link speed: .ptr, .size, .view (a memoryview over them); free() unregisters and unmaps
    them. `flags`: cuMemHostRegister's; a failure to register unmaps them and raises DriverError
    naming `what`."""

    def __init__(self, ptr, size, flags, what):
        try:  # whole pages: a chunk file's last page may be short
            drv.check(drv.driver().cuMemHostRegister(ptr, -(-size // mmap.PAGESIZE) * mmap.PAGESIZE, flags), what)
        except BaseException:
            unmap_pages(ptr, size)
            raise
        self.ptr, self.size = ptr, size
        self.view = memoryview((ctypes.c_char * size).from_address(ptr)).cast("B")

    def free(self):
        self.view.release()
        drv.driver().cuMemHostUnregister(self.ptr)
        unmap_pages(self.ptr, self.size)


class PinnedBuffer(RegisteredPages):
    """Page-locked host memory with a memoryview over it (pinning is slow: keep and reuse).

    Not cuMemHostAlloc: the driver zeroes that memory 4 KiB page by page in the calling thread
    (1.6 GB/s measured on the H200 host: 0.6 s for the 1 GiB ring, paid by every cold save). Here
    the buffer is this process's own anonymous mapping, asked for in 2 MiB pages
    (MADV_HUGEPAGE), faulted in by the kernel (MADV_POPULATE_WRITE; pin_buffers does many buffers
    on many threads, fault_in_ahead before they are asked for) and then registered with the
    driver (cuMemHostRegister): 1 GiB in 0.22 s on one thread. MADV_DONTFORK: a child (CRIU, a
    holder) gets no copy of pinned pages. Registered portable: one ring serves every GPU of a
    group, each copying from its own context (pinned for the registering context alone, the
    others' copies would be staged through pageable memory).
    """

    def __init__(self, size):
        # with unified addressing, the host address is also the one copies take
        ptr = _pages_for(size)
        super().__init__(ptr, size, REGISTER_PORTABLE, f"pin {size} bytes of host memory")


def _faulted_in(size):
    """A new private mapping of size bytes, its pages faulted in (MADV_POPULATE_WRITE) -> its
    address."""
    ptr = map_pages(size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    for advice in (_MADV_HUGEPAGE, _MADV_DONTFORK, _MADV_POPULATE_WRITE):
        _libc.madvise(ptr, size, advice)  # best effort: registering faults in the rest
    return ptr


_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                       ctypes.c_long]
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_MADV_DONTFORK, _MADV_HUGEPAGE, _MADV_POPULATE_WRITE = 10, 14, 23  # <asm-generic/mman-common.h>


def map_pages(size, prot, flags, fd=-1):
    """mmap(2) of size bytes -> its address, which the driver's calls take (Python's mmap gives
    none for a read-only mapping); DriverError naming the error."""
    addr = _libc.mmap(None, size, prot, flags, fd, 0)
    if addr in (None, ctypes.c_void_p(-1).value):
        raise DriverError(f"cannot map {size} bytes of host memory: {os.strerror(ctypes.get_errno())}")
    return addr


def unmap_pages(addr, size):
    _libc.munmap(addr, size)


# Threads that pin buffers side by side. The driver registers one buffer at a time: on the H200,
# 16 buffers of 64 MiB on 2 threads were ready from 0.014 s to 0.188 s, on 16 threads from 0.058 s
# to 0.231 s (bench/save_stages_bench.py). Two keep the page faulting of one beside the
# registering of another, and the first buffers come soonest.
PIN_THREADS = 2


def pin_pool(size, count, threads=None):
    """(a pool of `threads` threads (PIN_THREADS where None), [count futures of new PinnedBuffers
    of size bytes, in order]), each made in the caller's current context; the caller shuts the
    pool down."""
    ctx = drv.check(drv.driver().cuCtxGetCurrent(), "get the current context")
    prefix = f"{threading.current_thread().name}-pin"  # whose pinning it is, e.g. pin-ahead-pin_1
    pool = concurrent.futures.ThreadPoolExecutor(min(count, threads or PIN_THREADS),
                                                 thread_name_prefix=prefix)
    return pool, [pool.submit(_pinned_in, ctx, size) for _ in range(count)]


def _pinned_in(context, size):
    """A new PinnedBuffer of size bytes, made with `context` current in the calling thread."""
    drv.check(drv.driver().cuCtxSetCurrent(context), "make the context current")
    return PinnedBuffer(size)


def pin_buffers(size, count):
    """count new PinnedBuffers of size bytes, made on PIN_THREADS threads; on a failure, those
    made are freed and the first error raised."""
    if count <= 1:
        return [PinnedBuffer(size) for _ in range(count)]
    pool, futures = pin_pool(size, count)
    with pool:
        concurrent.futures.wait(futures)
    made = [f.result() for f in futures if f.exception() is None]
    failed = [f.exception() for f in futures if f.exception() is not None]
    if failed:
        for b in made:
            b.free()
        raise failed[0]
    return made


# Pinning a ring still costs (0.1-0.3 s for 1 GiB): paid once by the save and again by the load of
# one suspend/resume in the same holder. A ring that a CopyEngine is done with is kept here for the
# next one in this process instead (PinnedRing takes it); the process's exit frees it. Buffers
# being pinned ahead (pin_ahead) wait in _ahead, each as a future, for the next ring to take.
_kept = []
_ahead = []  # (size, future of a PinnedBuffer) pinned ahead and not yet taken by a ring
_kept_lock = threading.Lock()


def pin_ahead(size, count, device):
    """Begin pinning now, on PIN_THREADS threads of GPU `device`'s context, what the next
    PinnedRing(size, count) of this process lacks (what is kept or pinned ahead already counts):
    that ring takes each buffer as it is pinned, so a save or load that starts meanwhile waits for
    its first buffers only. For a suspend's holder from its save's start (CopyEngine's
    pin_ahead), for a restore while CRIU restores the processes. Best effort: a failure is
    printed, and the ring that took a buffer that failed pins that one itself when it is asked
    for."""
    with _kept_lock:
        futures = [concurrent.futures.Future() for _ in range(count - _pinned_or_pinning(size))]
        _ahead.extend((size, f) for f in futures)
    if not futures:
        return

    def pin():
        try:
            use_device(device)
            pool, made = pin_pool(size, len(futures))
        except Exception as e:  # noqa: BLE001 - the ring that takes them pins them itself
            print(f"pinning the ring ahead failed: {e}", flush=True)
            for future in futures:
                future.set_exception(e)
            return
        pool.shutdown(wait=False)  # its threads end once the last buffer is pinned
        for future, pinned in zip(futures, made):
            pinned.add_done_callback(lambda f, to=future: _pass_on(f, to))

    threading.Thread(target=pin, name="pin-ahead", daemon=True).start()


def _pinned_or_pinning(size):
    """How many buffers of size bytes the next ring takes without pinning them: kept, or being
    pinned ahead (the caller holds _kept_lock)."""
    return sum(1 for b in _kept if b.size == size) + sum(1 for n, _ in _ahead if n == size)


def _pass_on(done, to):
    error = done.exception()
    if error is None:
        to.set_result(done.result())
    else:
        print(f"pinning a ring buffer ahead failed: {error}", flush=True)
        to.set_exception(error)


# Most of pinning a new buffer is the kernel faulting its pages in (zeroing them): 0.2-0.3 s of
# the 1 GiB ring, against 0.02 s to register pages that are there already (bench/RESULTS.md
# "nineteenth"). That part needs no CUDA, so a suspend's holder has it done from its discovery on
# (fault_in_ahead), and the buffers pinned later take those pages.
_faulted = []  # (size, future of the address of a mapping faulted in ahead) not yet taken


def fault_in_ahead(size, count):
    """Begin faulting in, on PIN_THREADS threads, the pages of the PinnedBuffers of size bytes that
    the next PinnedRing(size, count) of this process lacks (what is kept, pinned ahead or faulted
    in ahead already counts) -> the futures of the addresses begun now. A buffer made later takes
    them, waiting for them if they are still being faulted in; drop_faulted unmaps those that none
    took."""
    with _kept_lock:
        lacking = count - _pinned_or_pinning(size) - sum(1 for n, _ in _faulted if n == size)
        if lacking <= 0:
            return []
        pool = concurrent.futures.ThreadPoolExecutor(min(lacking, PIN_THREADS),
                                                     thread_name_prefix="fault-ahead")
        futures = [pool.submit(_faulted_in, size) for _ in range(lacking)]
        _faulted.extend((size, f) for f in futures)
    pool.shutdown(wait=False)  # its threads end once the last mapping is faulted in
    return futures


def _pages_for(size):
    """The address of a faulted-in mapping of size bytes: one faulted in ahead where there is one,
    else a new one (also where faulting that one in failed)."""
    with _kept_lock:
        ahead = next((f for n, f in _faulted if n == size), None)
        if ahead is not None:
            _faulted.remove((size, ahead))
    if ahead is not None and ahead.exception() is None:
        return ahead.result()
    return _faulted_in(size)


def drop_faulted():
    """Unmap what fault_in_ahead faulted in and no buffer took (once it is faulted in)."""
    with _kept_lock:
        left = list(_faulted)
        _faulted.clear()
    for size, future in left:
        if future.exception() is None:
            unmap_pages(future.result(), size)


class PinnedRing:
    """A copy engine's ring: `count` PinnedBuffers of `size` bytes, those kept by earlier engines
    of this process first, then those being pinned ahead (pin_ahead), the rest pinned in the
    background in slot order. ring[i] waits for buffer i alone, so the first copies start once
    the first buffers are pinned, not the whole ring (0.2 s for 1 GiB on the H200); the seconds the
    thread that made the ring waited go to on_wait(seconds) (other threads wait beside it: theirs
    would count the same stretch many times). A buffer pinned ahead that failed is pinned here when
    asked for; one that could not be pinned here raises its error where it is asked for."""

    def __init__(self, size, count, on_wait=None):
        with _kept_lock:
            reuse = [b for b in _kept if b.size == size][:count]
            for b in reuse:
                _kept.remove(b)
            ahead = [f for n, f in _ahead if n == size][:count - len(reuse)]
            _ahead[:] = [(n, f) for n, f in _ahead if f not in ahead]
        self._futures = []
        for b in reuse:
            done = concurrent.futures.Future()
            done.set_result(b)
            self._futures.append(done)
        self._futures += ahead
        self._ahead = set(ahead)  # pinned again here if they failed (pin_ahead is best effort)
        self._context = drv.check(drv.driver().cuCtxGetCurrent(), "get the current context")
        self._again = threading.Lock()
        if count > len(self._futures):
            try:
                pool, made = pin_pool(size, count - len(self._futures))
            except BaseException:
                keep_pinned(reuse)
                raise
            pool.shutdown(wait=False)  # its threads end once the last buffer is pinned
            self._futures += made
        self._size = size
        self._on_wait = on_wait or (lambda seconds: None)
        self._owner = threading.get_ident()

    def __len__(self):
        return len(self._futures)

    def __getitem__(self, i):
        future = self._futures[i]
        if not future.done():
            t = time.monotonic()
            concurrent.futures.wait([future])
            if threading.get_ident() == self._owner:
                self._on_wait(time.monotonic() - t)
        if future in self._ahead and future.exception() is not None:
            with self._again:
                if self._futures[i] is future:  # the first thread to ask pins it again
                    self._futures[i] = _pinned_now(self._size, self._context)
            future = self._futures[i]
        return future.result()

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def release(self):
        """Every buffer pinned, once the pinning ended (for keep_pinned); none is left in use."""
        concurrent.futures.wait(self._futures)
        buffers = [f.result() for f in self._futures if f.exception() is None]
        self._futures = []
        return buffers


def _pinned_now(size, context):
    """A finished future of a PinnedBuffer of size bytes pinned now in `context`, or of its error."""
    future = concurrent.futures.Future()
    try:
        future.set_result(_pinned_in(context, size))
    except Exception as e:  # noqa: BLE001 - raised where the buffer is asked for
        future.set_exception(e)
    return future


def keep_pinned(buffers):
    """Buffers a caller is done with, for the next PinnedRing of this process."""
    with _kept_lock:
        _kept.extend(buffers)


def take_kept():
    """The buffers kept for the next PinnedRing, taken (none is kept after): the caller frees them
    or gives them back with keep_pinned."""
    with _kept_lock:
        taken = list(_kept)
        _kept.clear()
    return taken
