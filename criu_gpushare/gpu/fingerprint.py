"""Chunk ids computed on the GPU: the XXH3-128 of each chunk, exactly the store's content address.

The copy engine asks for the ids of an allocation's chunks before it copies anything, and copies
device->host only the chunks the store lacks (store/FORMAT.md section 13). The kernel is
`xxh3.cu`, shipped as a fatbin (`xxh3.fatbin`: machine code for sm_90 and sm_100, and the PTX)
and as PTX (`xxh3.ptx`), both made by scripts/build-ptx.sh. A GpuHasher loads the fatbin: on those
GPUs the driver runs its machine code as it is, where the PTX alone costs a JIT compile (0.7 s on
an H200 whose driver has no cached copy: a fresh node or container); other GPUs take the fatbin's
PTX. Should the driver refuse the fatbin, the PTX is loaded instead.

    hasher = GpuHasher.create(device)        # None when disabled or unavailable (see below)
    ids = hasher.chunk_ids(ptr, size, chunk_size, stream)   # ['3b0c...', ...], as chunk_id() gives

GpuHasher.create returns None, after one debug line, when CRIU_GPUSHARE_GPU_HASH=0, when the
driver cannot load the module (the fake driver of the tests runs no kernels) or when the
self-test (the kernel's ids of a few inputs against the CPU's) fails.
"""
import ctypes
import logging
import os
import random

from ..config import env_switch
from ..errors import DriverError, NoGpuError
from ..store.layout import chunk_id
from . import driver as drv
from .memory import use_device

log = logging.getLogger(__name__)

ENV_SWITCH = "CRIU_GPUSHARE_GPU_HASH"
PTX_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "xxh3.ptx")
FATBIN_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "xxh3.fatbin")
KERNEL = b"xxh3_128_chunks"
THREADS = 288  # xxh3.cu: XXH_THREADS, (8 compute warps + 1 chain warp) * 32
ALIGN = 16  # the kernel's 16-byte loads: chunk starts must be multiples of this
# Lengths the self-test checks: each short path and its edges, the block and tile edges.
SELF_TEST_LENGTHS = (0, 1, 3, 4, 8, 9, 16, 17, 128, 129, 240, 241, 1024, 1025, 65 * 1024 + 7)


def enabled():
    """False when CRIU_GPUSHARE_GPU_HASH says 0/no/false/off (then every chunk crosses the link)."""
    return env_switch(ENV_SWITCH) is not False


def load_ptx():
    """The committed PTX as the NUL-terminated bytes cuModuleLoadData wants."""
    with open(PTX_PATH, "rb") as f:
        return f.read() + b"\0"


def load_module():
    """(the XXH3 module loaded in the current context, the file it came from): the fatbin, else
    (missing, or refused by the driver) the PTX."""
    cu = drv.driver()
    try:
        with open(FATBIN_PATH, "rb") as f:
            image = f.read()
        return drv.check(cu.cuModuleLoadData(image), "load the XXH3 kernel (xxh3.fatbin)"), FATBIN_PATH
    except (OSError, DriverError) as e:
        log.debug("xxh3.fatbin not loaded (%s): loading the PTX", e)
    return drv.check(cu.cuModuleLoadData(load_ptx()), "load the XXH3 kernel (xxh3.ptx)"), PTX_PATH


class GpuHasher:
    """XXH3-128 of device memory, one CUDA block per chunk, on one device's primary context."""

    def __init__(self, device):
        cu = drv.driver()
        self.device = device
        use_device(device)
        self.module, self.loaded_from = load_module()
        try:
            self.function = drv.check(cu.cuModuleGetFunction(self.module, KERNEL), "find the XXH3 kernel")
        except BaseException:
            cu.cuModuleUnload(self.module)
            raise
        self._out, self._out_bytes = None, 0
        try:
            # ids of up to 1024 chunks (64 GiB in 64 MiB chunks) without an allocation per call:
            # by suspend time the workload may have taken nearly all GPU memory
            self._reserve(16 * 1024)
        except BaseException:
            self.close()
            raise

    @classmethod
    def create(cls, device, self_test=True):
        """A checked GpuHasher for `device`, or None (disabled, no kernel support, self-test failed)."""
        if not enabled():
            log.debug("GPU chunk hashing off (%s=%s)", ENV_SWITCH, os.environ.get(ENV_SWITCH))
            return None
        try:
            hasher = cls(device)
        except (DriverError, NoGpuError, OSError) as e:
            log.debug("GPU chunk hashing unavailable on GPU %s, every chunk is copied: %s", device, e)
            return None
        if self_test:
            try:
                problem = hasher.self_test()
            except DriverError as e:
                problem = str(e)
            if problem:
                hasher.close()
                log.warning("GPU chunk hashing disabled on GPU %s: %s", device, problem)
                return None
        return hasher

    def close(self):
        cu = drv.driver()
        use_device(self.device)
        if self._out is not None:
            cu.cuMemFree(self._out)
            self._out = None
        if self.module is not None:
            cu.cuModuleUnload(self.module)
            self.module = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @staticmethod
    def supports(ptr, chunk_size):
        """Whether chunk_ids can hash chunks of `chunk_size` starting at `ptr` (alignment)."""
        return chunk_size > 0 and int(ptr) % ALIGN == 0 and chunk_size % ALIGN == 0

    def chunk_ids(self, dev_ptr, size, chunk_size, stream=0):
        """The ids of the chunks [i*chunk_size, min((i+1)*chunk_size, size)) at `dev_ptr`, in
        order, as 32 lowercase hex digits (store.layout.chunk_id of the same bytes); [] for size 0.

        The kernel runs on `stream` (ordered after work already queued there); returns when done.
        """
        if size == 0:
            return []
        return self._launch(dev_ptr, size, chunk_size, stream)

    def start_ids(self, dev_ptr, size, chunk_size, stream, first=0):
        """chunk_ids() begun, not waited for: the kernel is queued on `stream`, its ids go to the
        id buffer's slots from `first` on (regions hashed at once each take their own slots, all
        of them reserve()d first); -> PendingIds, whose result() waits for this kernel alone.

        One kernel runs a block per chunk, so a region of a few chunks keeps a few SMs busy:
        several regions hashed at once, on several streams, keep the GPU busy (forty 1 GiB
        regions one after the other: 0.16 s on the H200; all at once: about 0.015 s)."""
        count = -(-size // chunk_size) if size else 0
        if count:
            self._start(dev_ptr, size, chunk_size, stream, first, count)
        return PendingIds(self, first, count, stream)

    def hash_region(self, dev_ptr, length, stream=0):
        """The id of `length` bytes at `dev_ptr` (any length, 0 too): one chunk."""
        return self._launch(dev_ptr, length, max(ALIGN, -(-length // ALIGN) * ALIGN), stream)[0]

    def _launch(self, dev_ptr, size, chunk_size, stream):
        count = max(1, -(-size // chunk_size))
        self.reserve(count)
        self._start(dev_ptr, size, chunk_size, stream, 0, count)
        return PendingIds(self, 0, count, stream).result()

    def _start(self, dev_ptr, size, chunk_size, stream, first, count):
        if not self.supports(dev_ptr, chunk_size):
            raise ValueError(f"GPU hashing needs {ALIGN}-byte aligned chunks: pointer {int(dev_ptr):#x}, "
                             f"chunk size {chunk_size}")
        if 16 * (first + count) > self._out_bytes:
            raise ValueError(f"ids {first}..{first + count} do not fit the id buffer: reserve() them")
        cu = drv.driver()
        use_device(self.device)
        params = ((int(dev_ptr), size, chunk_size, int(self._out) + 16 * first),
                  (ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_void_p))
        drv.check(cu.cuLaunchKernel(self.function, count, 1, 1, THREADS, 1, 1, 0, stream, params, 0),
                  "launch the XXH3 kernel")

    def _read(self, first, count, stream):
        """The ids in slots first..first+count, once the work queued on `stream` is done."""
        cu = drv.driver()
        use_device(self.device)
        host = (ctypes.c_uint64 * (2 * count))()
        drv.check(cu.cuMemcpyDtoHAsync(host, int(self._out) + 16 * first, 16 * count, stream),
                  "copy the chunk ids to the host")
        drv.check(cu.cuStreamSynchronize(stream), "hash chunks on the GPU")
        return [f"{host[2 * i + 1]:016x}{host[2 * i]:016x}" for i in range(count)]

    def reserve(self, count):
        """Room for `count` ids in the id buffer (grown only while no kernel is pending)."""
        self._reserve(16 * count)

    def _reserve(self, need):
        """A device buffer of at least `need` bytes for the ids."""
        if need <= self._out_bytes:
            return
        cu = drv.driver()
        if self._out is not None:
            cu.cuMemFree(self._out)
            self._out, self._out_bytes = None, 0
        self._out = drv.check(cu.cuMemAlloc(need), "allocate the chunk id buffer")
        self._out_bytes = need

    def self_test(self):
        """Hash a few inputs of the lengths in SELF_TEST_LENGTHS on the GPU and on the CPU;
        None when all agree, else what differed."""
        cu = drv.driver()
        use_device(self.device)
        data = random.Random(0x5eed).randbytes(max(SELF_TEST_LENGTHS) + ALIGN)
        buf = drv.check(cu.cuMemAlloc(len(data)), "allocate the self-test buffer")
        try:
            host = (ctypes.c_char * len(data)).from_buffer_copy(data)
            drv.check(cu.cuMemcpyHtoD(buf, host, len(data)), "fill the self-test buffer")
            for n in SELF_TEST_LENGTHS:
                for shift in (0, ALIGN):  # a 16-aligned start other than the allocation's
                    got = self.hash_region(int(buf) + shift, n)
                    want = chunk_id(data[shift:shift + n])
                    if got != want:
                        return f"{n} bytes: GPU {got}, CPU {want}"
            total = 65 * 1024 + 7
            ids = self.chunk_ids(buf, total, 4096)
            want = [chunk_id(data[o:min(o + 4096, total)]) for o in range(0, total, 4096)]
            if ids != want:
                return "chunked hashing differs from the CPU's"
        finally:
            cu.cuMemFree(buf)
        return None


class PendingIds:
    """The ids of one GpuHasher.start_ids(): result() waits for its kernel and reads them."""

    def __init__(self, hasher, first, count, stream):
        self.hasher, self.first, self.count, self.stream = hasher, first, count, stream

    def result(self):
        return self.hasher._read(self.first, self.count, self.stream) if self.count else []
