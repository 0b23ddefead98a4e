"""A chunk file's own pages, mapped and registered with the driver, so that a load's DMA reads them
where they are: for a store whose chunk files live in memory (Store.chunk_pages, store/memfs.py).

Through the pinned ring a load is bound by the CPU's copy from the page cache into the ring's
buffers: 40 GiB from a huge-page tmpfs in 1.27-1.30 s on an H100's host (33 GB/s), 1.2-1.4 s on
the H200s. The same chunk files mapped read-only and registered took 0.94-1.13 s to register
(38-46 GB/s), and the DMA read them at 55 GB/s with no CPU copy at all (bench/save_stages_bench.py,
"load, chunk files in place"). On a tmpfs of 4 KiB pages registering ran at 8-21 GB/s, slower than
the ring, so by default only huge pages are loaded in place (CRIU_GPUSHARE_PAGES_IN_PLACE: 0 never,
1 on small pages too).

Undoing a registration costs too (0.37 s for 40 GiB), so a load hands its pages to release_later
once its copies are done: a thread releases them while the process goes on, and the process's
exit waits for that thread. A registration the driver refuses is no error: the copy then reads
the mapped pages through the driver's own staging buffers, slower, and a warning says so once.
"""
import atexit
import ctypes
import logging
import mmap
import os
import threading

from . import driver as drv
from .memory import map_pages, unmap_pages
from ..errors import DriverError

log = logging.getLogger(__name__)

ENV_SWITCH = "CRIU_GPUSHARE_PAGES_IN_PLACE"
_READ_ONLY = 0x08  # CU_MEMHOSTREGISTER_READ_ONLY: the driver never writes these pages
_PAGE = mmap.PAGESIZE


def wanted(pages, environ=None):
    """Whether a load copies chunk files in place, given where the store keeps their bytes
    (Store.chunk_pages: "huge", "small" or None): on huge pages unless CRIU_GPUSHARE_PAGES_IN_PLACE
    says 0/no/false/off, on small pages only where it says 1/yes/true/on."""
    value = (os.environ if environ is None else environ).get(ENV_SWITCH, "").strip().lower()
    if pages is None or value in ("0", "no", "false", "off"):
        return False
    return pages == "huge" or value in ("1", "yes", "true", "on")


class FilePages:
    """Chunk `cid` of `store` (its file checked by Store.open_chunk) mapped read-only, its pages
    mapped in now, and registered with the driver of the calling thread's context: .ptr to copy
    from, .view to hash on the host; release() undoes both."""

    def __init__(self, store, cid, length):
        fd = store.open_chunk(cid, length)
        try:
            self.ptr = map_pages(length, mmap.PROT_READ, mmap.MAP_SHARED | mmap.MAP_POPULATE, fd)
        finally:
            os.close(fd)  # the mapping keeps the file's pages
        self.length, self.registered = length, False
        try:
            drv.check(drv.driver().cuMemHostRegister(self.ptr, -(-length // _PAGE) * _PAGE, _READ_ONLY),
                      f"register the pages of chunk file {store.chunk_path(cid)}")
            self.registered = True
        except DriverError as e:
            _warn_unregistered(e)
        except BaseException:
            unmap_pages(self.ptr, length)
            raise
        self.view = memoryview((ctypes.c_char * length).from_address(self.ptr)).cast("B")

    def release(self):
        self.view.release()
        if self.registered:
            drv.driver().cuMemHostUnregister(self.ptr)
        unmap_pages(self.ptr, self.length)


_warned = threading.Event()


def _warn_unregistered(error):
    if not _warned.is_set():
        _warned.set()
        log.warning("%s; such chunks are copied through the driver's own buffers, which is slower "
                    "(CRIU_GPUSHARE_PAGES_IN_PLACE=0 reads them into pinned buffers instead)", error)


_releasing = []  # threads of release_later not yet joined
_releasing_lock = threading.Lock()


def release_later(pages, context=None):
    """Release `pages` (FilePages whose copies have ended) in a thread, with `context` current
    there (the driver's registrations belong to it); the exit of the process waits for it."""
    if not pages:
        return

    def release():
        if context is not None:
            drv.driver().cuCtxSetCurrent(context)
        for p in pages:
            try:
                p.release()
            except Exception as e:  # noqa: BLE001 - the process's exit frees what is left
                log.warning("releasing a chunk file's pages failed: %s", e)

    thread = threading.Thread(target=release, name="release-file-pages", daemon=True)
    with _releasing_lock:
        _releasing.append(thread)
    thread.start()


def wait_released(timeout=None):
    """Wait for every release_later thread of this process (at most `timeout` seconds each)."""
    with _releasing_lock:
        threads, _releasing[:] = list(_releasing), []
    for thread in threads:
        thread.join(timeout)


atexit.register(wait_released, 60)
