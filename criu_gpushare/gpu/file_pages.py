"""A suspended group's chunk files registered with the driver while it stays suspended, so that its
resume copies them from their own pages: for a store whose chunk files live in memory
(Store.chunk_pages, store/memfs.py).

A resume reads the whole checkpoint back, and through the pinned ring that is bound by the CPU's
copy from the page cache into the ring's buffers: 30-33 GB/s from a huge-page tmpfs on two H100
hosts, 28-36 GB/s on the H200s. Mapped read-only and registered, the same chunk files registered
at 30-51 GB/s on one thread, and then the GPU read them at 52-54 GB/s with no CPU copy at all
(bench/save_stages_bench.py, "chunk files registered ahead" and "load, from the registered chunk
files"). Registered during the load itself they gained nothing (the registrations and the copies
wait for each other in the driver: bench/RESULTS.md, "nineteenth"), so the holder of a suspended
group registers them once the suspend is done, in a thread (RegisteredAhead), and its resume
takes what is registered by then (CopyEngine's `registered`) and reads the rest as before. On a
tmpfs of 4 KiB pages registering ran at 8-21 GB/s, so by default only huge pages are registered
(CRIU_GPUSHARE_PAGES_IN_PLACE: 0 never, 1 on small pages too).

Undoing a registration costs too (0.37 s for 40 GiB): the resume hands the pages to release_later,
a thread that releases them while the holder answers; the holder waits for it before it ends
(wait_released), another process at its exit. A registration the driver refuses ends the
registering (what was made is kept) with one warning. While registered, the pages hold about 2 MiB
of GPU memory per GiB (80 MiB for 40 GiB on an H100).
"""
import atexit
import logging
import mmap
import os
import threading
import time

from ..config import env_switch
from .aside import Aside
from .memory import REGISTER_PORTABLE, REGISTER_READ_ONLY, RegisteredPages, map_pages, use_device

log = logging.getLogger(__name__)

ENV_SWITCH = "CRIU_GPUSHARE_PAGES_IN_PLACE"
# copies from any of this process's contexts (every GPU) may read them; the driver never writes them
_FLAGS = REGISTER_PORTABLE | REGISTER_READ_ONLY


def wanted(pages, environ=None):
    """Whether to register chunk files, given where the store keeps their bytes
    (Store.chunk_pages: "huge", "small" or None): on huge pages unless CRIU_GPUSHARE_PAGES_IN_PLACE
    says 0/no/false/off, on small pages only where it says 1/yes/true/on."""
    switch = env_switch(ENV_SWITCH, environ)
    return pages is not None and switch is not False and (pages == "huge" or switch is True)


class FilePages(RegisteredPages):
    """Chunk `cid` of `store` (its file checked by Store.open_chunk) mapped read-only, its pages
    mapped in now, and registered with the driver (RegisteredPages: .ptr to copy from, .view to
    hash on the host, free())."""

    def __init__(self, store, cid, length):
        fd = store.open_chunk(cid, length)
        try:
            ptr = map_pages(length, mmap.PROT_READ, mmap.MAP_SHARED | mmap.MAP_POPULATE, fd)
        finally:
            os.close(fd)  # the mapping keeps the file's pages
        super().__init__(ptr, length, _FLAGS, f"register the pages of chunk file {store.chunk_path(cid)}")


class RegisteredAhead(Aside):
    """The chunk files of `chunks` ([(chunk id, length)], in the order a load reads them; each
    distinct one once) registered in a thread from start() on, with GPU `device`'s context
    current; open_store() gives the store, kept open while it runs. take() stops it and hands
    over what it registered. Best effort: a failure (a chunk gone, the driver refusing) ends it
    with one line, keeping what it made."""

    thread_name = "register-ahead"

    def __init__(self, open_store, chunks, device):
        self.open_store, self.chunks, self.device = open_store, chunks, device
        self.pages = {}  # chunk id -> FilePages
        super().__init__()

    def run(self):
        t0 = time.monotonic()
        try:
            use_device(self.device)
            with self.open_store() as store:
                for cid, length in self.chunks:
                    if self.stopping():
                        break
                    if cid not in self.pages:
                        self.pages[cid] = FilePages(store, cid, length)
            done = sum(p.size for p in self.pages.values()) / 2**30
            print(f"registered {len(self.pages)} of {len(self.chunks)} chunk files ({done:.2f} GiB) "
                  f"for the resume in {time.monotonic() - t0:.2f} s", flush=True)
        except Exception as e:  # noqa: BLE001 - what is registered is used, the rest read as before
            log.warning("registering the checkpoint's chunk files ahead of the resume stopped at %d "
                        "of %d: %s", len(self.pages), len(self.chunks), e)

    def take(self):
        """Stop (the chunk being registered is finished) -> {chunk id: FilePages}, now the
        caller's to release (release_later)."""
        self.halt()
        pages, self.pages = self.pages, {}
        return pages


class _Release(Aside):
    """`pages` (FilePages) unregistered and unmapped, GPU `device`'s context current."""

    thread_name = "release-file-pages"

    def __init__(self, pages, device):
        self.pages, self.device = pages, device
        super().__init__()

    def run(self):
        t0 = time.monotonic()
        use_device(self.device)
        for p in self.pages:
            try:
                p.free()
            except Exception as e:  # noqa: BLE001 - the process's exit frees what is left
                log.warning("releasing a chunk file's pages failed: %s", e)
        print(f"released {len(self.pages)} registered chunk files in {time.monotonic() - t0:.2f} s",
              flush=True)


_releasing = []  # release_later's releases not yet waited for
_releasing_lock = threading.Lock()


def release_later(pages, device):
    """Release `pages` (FilePages whose copies have ended) in a thread, GPU `device`'s context
    current there; wait_released waits for it (and Python's exit does)."""
    if not pages:
        return
    release = _Release(pages, device)
    with _releasing_lock:
        _releasing.append(release)
    release.start()


def wait_released(timeout=None):
    """Wait for every release_later of this process (at most `timeout` seconds each)."""
    with _releasing_lock:
        releases, _releasing[:] = list(_releasing), []
    for release in releases:
        release.join(timeout)


atexit.register(wait_released, 60)
