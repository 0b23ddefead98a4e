"""Allocations' bytes loaded from the store into this process's own GPU memory, in a thread, ahead of
the memory they belong in: the copy engine later moves them device to device (LoadItem.staged).

What for (engine/ahead.py decides when): a restore's load is bound by reading the store (40 GiB
from tmpfs in 1.2-1.8 s on the H200), yet it could only start once CRIU, the driver and the shims
had brought the processes and their memory back (about 1 s). Read into spare GPU memory first, the
bytes need then only a copy at HBM speed.

Best effort: a failure (no memory for a buffer, a damaged chunk, a driver error) is kept, every
buffer is freed, and wait() answers {} so the load reads the store itself, as without this (and
raises the chunk's own error where there is one). Buffers are made one allocation at a time until
one fails: those made are filled, the rest load as before.
"""
import contextlib
import logging

from . import driver as drv
from .aside import Aside
from .copy_engine import CopyEngine, LoadItem
from .memory import use_device
from ..errors import DriverError

log = logging.getLogger(__name__)


class _Stopped(Exception):
    """close() before the loading ended: the engine stops at its next chunk."""


class StagedLoad(Aside):
    """start() loads placements() ([(manifest Allocation, GPU ordinal)], asked in its thread)
    from open_store() (a context manager giving a store) into new buffers on those GPUs, checked
    against their names when verify; wait() -> {allocation key: device pointer}; close() frees
    the buffers. registered: chunk files' pages registered ahead (CopyEngine's `registered`)."""

    thread_name = "load-ahead"

    def __init__(self, placements, open_store, verify=True, registered=None):
        self.placements, self.open_store, self.verify = placements, open_store, verify
        self.registered = registered
        self.buffers = {}  # key -> (device pointer, GPU ordinal)
        self.error = None  # what stopped it, once it ended
        self.bytes = 0  # what it loaded, once it ended without error
        self.in_place = 0  # of which copied from the chunk files' own pages (CopyStats.in_place)
        super().__init__()

    def run(self):
        try:
            placements = self.placements()
            self._allocate(placements)
            items = [LoadItem(a, dev, lambda p=self.buffers[a.key][0]: contextlib.nullcontext(p))
                     for a, dev in placements if a.key in self.buffers]
            total = sum(item.allocation.size for item in items)
            if items:
                with self.open_store() as store, \
                        CopyEngine(store, verify_loads=self.verify, total_bytes=total,
                                   progress=self._check_stop, registered=self.registered) as engine:
                    self.in_place = sum(s.in_place for s in engine.load_all(items))
            self.bytes = total
        except BaseException as e:  # noqa: BLE001 - kept for wait(); the load reads the store
            self.error = e
            self._free()

    def _allocate(self, placements):
        cu = drv.driver()
        for allocation, device in placements:
            if self.stopping():
                return
            use_device(device)
            try:
                ptr = drv.check(cu.cuMemAlloc(allocation.size), f"allocate {allocation.size} bytes")
            except DriverError as e:  # e.g. out of memory: what is made is loaded, the rest later
                log.info("loading ahead stops at %s on GPU %d: %s", allocation.key, device, e)
                return
            self.buffers[allocation.key] = (ptr, device)

    def _check_stop(self, _nbytes):
        if self.stopping():
            raise _Stopped()

    def wait(self):
        """{allocation key: device pointer holding its bytes}, once the loading ended; {} after a
        failure (self.error says which)."""
        self.join()
        return {} if self.error is not None else {k: ptr for k, (ptr, _) in self.buffers.items()}

    def close(self):
        """Stop the loading (at its next chunk) and free every buffer."""
        self.halt()
        self._free()

    def _free(self):
        cu = drv.driver()
        for ptr, device in self.buffers.values():
            use_device(device)
            cu.cuMemFree(ptr)
        self.buffers = {}
