"""GPU memory in the tool's own CUDA context: contexts per device, fd imports, pinned host buffers.

The tool reaches a workload's allocation by importing the POSIX fd the workload's shim exported:
the driver maps the same physical memory into the tool, so copies run at link speed and never go
through the workload process.
"""
import ctypes
import threading

from . import driver as drv

_contexts = {}
_contexts_lock = threading.Lock()


def _fd_handle_type():
    cu = drv.driver()
    return cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR


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


class ImportedAllocation:
    """A workload's allocation, imported from its exported fd and mapped read-write in the tool."""

    def __init__(self, fd, size, device):
        cu = drv.driver()
        use_device(device)
        self.size, self.device = size, device
        self.handle = drv.check(cu.cuMemImportFromShareableHandle(fd, _fd_handle_type()),
                                f"import fd {fd} ({size} bytes) on GPU {device}")
        try:
            self.ptr = drv.check(cu.cuMemAddressReserve(size, 0, 0, 0), f"reserve {size} bytes of VA")
            try:
                drv.check(cu.cuMemMap(self.ptr, size, 0, self.handle, 0), "map the imported memory")
                desc = cu.CUmemAccessDesc()
                desc.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
                desc.location.id = device
                desc.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
                drv.check(cu.cuMemSetAccess(self.ptr, size, [desc], 1), "set access to the imported memory")
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


class PinnedBuffer:
    """Page-locked host memory with a memoryview over it (allocation is slow: keep and reuse)."""

    def __init__(self, size):
        cu = drv.driver()
        self.size = size
        self.ptr = drv.check(cu.cuMemHostAlloc(size, 0), f"allocate {size} bytes of pinned host memory")
        self.view = memoryview((ctypes.c_char * size).from_address(int(self.ptr))).cast("B")

    def free(self):
        cu = drv.driver()
        self.view.release()
        cu.cuMemFreeHost(self.ptr)



# Pinning runs at about 2 GB/s (the H200 host): a 1 GiB ring costs 0.5 s, paid once by the save
# and again by the load of one suspend/resume in the same holder. A ring that a CopyEngine is done
# with is kept here for the next one in this process instead; the process's exit frees it.
_kept = []
_kept_lock = threading.Lock()
_pinning = []  # pin_ahead threads not yet joined


def pin_ahead(size, count, device):
    """Pin what the next take_pinned(size, count) of this process lacks, in a thread, now: for a
    holder whose save copied nothing (so kept no ring) and that waits for the resume's load. Best
    effort: a failure leaves the load to pin its own."""
    def pin():
        try:
            use_device(device)
            with _kept_lock:
                have = sum(1 for b in _kept if b.size == size)
            keep_pinned([PinnedBuffer(size) for _ in range(count - have)])
        except Exception as e:  # noqa: BLE001 - an optimisation only
            print(f"pinning the ring ahead of the load failed: {e}", flush=True)

    thread = threading.Thread(target=pin, name="pin-ahead", daemon=True)
    _pinning.append(thread)
    thread.start()


def take_pinned(size, count):
    """count PinnedBuffers of size bytes: kept ones first (after any pin_ahead ends), new ones for
    the rest."""
    while _pinning:
        _pinning.pop().join()
    with _kept_lock:
        reuse = [b for b in _kept if b.size == size][:count]
        for b in reuse:
            _kept.remove(b)
    try:
        return reuse + [PinnedBuffer(size) for _ in range(count - len(reuse))]
    except BaseException:
        keep_pinned(reuse)
        raise


def keep_pinned(buffers):
    """Buffers a caller is done with, for the next take_pinned of this process."""
    with _kept_lock:
        _kept.extend(buffers)
