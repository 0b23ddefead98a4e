"""Facts about a CRIU image directory, read with pycriu.images: what a restore will need (the
plugins recorded in the inventory) and whether a GPU process went into the image without our hook
(GPU device files, libcuda mappings), so dump and restore can refuse such images early; and what
the memory CRIU wrote belongs to (the benchmarks' account of an image's size). Also the page
images read into the page cache ahead of CRIU's restore (read_pages_ahead), and sent to the disk
while CRIU writes them at a dump (WriteBack).

A missing or undecodable image file raises ImageError naming it; a missing pycriu, CriuError.
"""
from __future__ import annotations

import bisect
import ctypes
import glob
import os
import threading

from ..errors import ImageError
from ..store import memfs
from . import _pycriu

GPU_DEVICE_PREFIX = "/dev/nvidia"
LIBCUDA_PREFIX = "libcuda.so"
# criu/include/image.h: what a VMA is (a file's: its shmid is the file's id in files.img).
_VMA_AREA_STACK = 1 << 1
_VMA_AREA_HEAP = 1 << 5
_VMA_FILE_PRIVATE = 1 << 6
_VMA_FILE_SHARED = 1 << 7
_VMA_ANON_PRIVATE = 1 << 9
_PE_PRESENT = 1 << 2  # CRIU's pagemap entry flag: the pages are in this image's pages-*.img
PAGE = 4096


def inventory_plugins(images_dir: str) -> list[str]:
    """The plugins CRIU recorded in inventory.img (e.g. "cuda_plugin"); a restore loads each of
    them and fails if one is missing from its plugin directory."""
    inventory = _entries(images_dir, "inventory.img")[0]
    return list(inventory.get("plugins_entry", {}).get("plugins", []))


def device_files(images_dir: str) -> list[str]:
    """The /dev/nvidia* paths among the files the image holds (open or mapped), sorted."""
    return sorted({name for name in _regular_files(images_dir).values()
                   if name.startswith(GPU_DEVICE_PREFIX)})


def maps_libcuda(images_dir: str) -> bool:
    """Whether a dumped process had libcuda.so* mapped: a GPU process dumped without our hook."""
    files = _regular_files(images_dir)
    mm_images = sorted(glob.glob(os.path.join(glob.escape(images_dir), "mm-*.img")))
    if not mm_images:
        raise ImageError(os.path.join(images_dir, "mm-<pid>.img"), "no memory image in the directory")
    for path in mm_images:
        for mm in _entries(images_dir, os.path.basename(path)):
            for vma in mm.get("vmas", []):
                if vma["status"] & (_VMA_FILE_PRIVATE | _VMA_FILE_SHARED):
                    name = files.get(vma.get("shmid"), "")
                    if os.path.basename(name).startswith(LIBCUDA_PREFIX):
                        return True
    return False


def stats(images_dir: str, action: str) -> dict:
    """CRIU's own timings of a dump or restore (stats-dump / stats-restore), in seconds, with the
    pages it moved; {} when CRIU wrote none (an older CRIU, a failed run)."""
    name = f"stats-{action}"
    if not os.path.exists(os.path.join(images_dir, name)):
        return {}
    try:
        entry = _entries(images_dir, name)[0].get(action, {})
    except ImageError:
        return {}
    return {k[:-5] if k.endswith("_time") else k: (v / 1e6 if k.endswith("_time") else v)
            for k, v in entry.items() if k.endswith("_time") or k.startswith("pages_")}


def pages_by_mapping(images_dir: str, largest: int = 5) -> dict:
    """What the memory CRIU wrote into the image belongs to, in bytes:
      "kinds": {kind: bytes}, biggest first, kind one of "anonymous private", "heap", "stack",
               "file <name> (private)" / "(shared)" (the dirty pages of a mapped file), "shared
               memory" (anonymous shared, memfd, SysV: CRIU dumps them apart) or "other";
      "largest": the `largest` mappings that hold the most, [{"pid", "start", "end", "kind",
               "bytes"}]: which regions make a big image big (e.g. a runtime's own allocations)."""
    files = _regular_files(images_dir)
    kinds, regions = {}, []
    for path in sorted(glob.glob(os.path.join(glob.escape(images_dir), "pagemap-*.img"))):
        name = os.path.basename(path)
        runs = [e for e in _entries(images_dir, name)[1:] if e.get("flags", 0) & _PE_PRESENT]
        present = sum(e["nr_pages"] for e in runs) * PAGE
        if name.startswith("pagemap-shmem-"):
            kinds["shared memory"] = kinds.get("shared memory", 0) + present
            continue
        pid = name[len("pagemap-"):-len(".img")]
        vmas = _entries(images_dir, f"mm-{pid}.img")[0].get("vmas", [])
        held = _pages_per_vma(runs, vmas)
        for vma, n in zip(vmas, held):
            if n:
                kind = _vma_kind(vma, files)
                kinds[kind] = kinds.get(kind, 0) + n
                regions.append({"pid": int(pid), "start": vma["start"], "end": vma["end"],
                                "kind": kind, "bytes": n})
        unplaced = present - sum(held)
        if unplaced:
            kinds["other"] = kinds.get("other", 0) + unplaced
    regions.sort(key=lambda r: -r["bytes"])
    return {"kinds": dict(sorted(kinds.items(), key=lambda kv: -kv[1])), "largest": regions[:largest]}


def _pages_per_vma(runs, vmas):
    """Bytes of the page runs (vaddr, nr_pages) that fall in each VMA, in the VMAs' order."""
    held = [0] * len(vmas)
    order = sorted(range(len(vmas)), key=lambda i: vmas[i]["start"])
    starts = [vmas[i]["start"] for i in order]
    for run in runs:
        begin, end = run["vaddr"], run["vaddr"] + run["nr_pages"] * PAGE
        k = bisect.bisect_right(starts, begin) - 1
        while begin < end and 0 <= k < len(order):
            vma = vmas[order[k]]
            top = min(end, vma["end"])
            if top > begin:
                held[order[k]] += top - begin
                begin = top
            k += 1
            if k < len(order) and vmas[order[k]]["start"] > begin:
                break  # a hole: CRIU dumps no page outside a VMA
    return held


def _vma_kind(vma, files):
    status = vma["status"]
    if status & (_VMA_FILE_PRIVATE | _VMA_FILE_SHARED):
        name = os.path.basename(files.get(vma.get("shmid"), "?"))
        return f"file {name} ({'private' if status & _VMA_FILE_PRIVATE else 'shared'})"
    if status & _VMA_AREA_HEAP:
        return "heap"
    if status & _VMA_AREA_STACK:
        return "stack"
    if status & _VMA_ANON_PRIVATE:
        return "anonymous private"
    return "other"


_READ_BLOCK = 8 << 20


def read_pages_ahead(images_dir: str) -> threading.Thread | None:
    """The process memory CRIU will restore (its pages-*.img) read into the page cache now, in a
    thread, in large sequential reads. CRIU reads those files piece by piece as it restores each
    mapping, which from a disk with a cold page cache ran at 0.16 GB/s (746 MiB in 4.7 s, on a disk
    that reads 3.85 GB/s in large blocks); the kernel's own read-ahead hint (POSIX_FADV_WILLNEED)
    reads no more than its read-ahead window. Not done on tmpfs (the pages are in memory), nor
    where they would take more than half the memory available now (they would push each other out
    before CRIU reads them). Best effort: a file that cannot be read is left to CRIU, which names
    it. -> the thread (started; a restore need not wait for it), or None."""
    paths = sorted(glob.glob(os.path.join(glob.escape(images_dir), "pages-*.img")))
    try:
        total = sum(os.stat(p).st_size for p in paths)
        if not paths or not memfs.on_disk(images_dir) or total > _available_memory() // 2:
            return None
    except OSError:
        return None

    def read_all():
        block = bytearray(_READ_BLOCK)
        for path in paths:
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
            except OSError:
                continue
            try:
                while os.readv(fd, [block]) > 0:
                    pass
            except OSError:
                pass
            finally:
                os.close(fd)

    thread = threading.Thread(target=read_all, name="criu-pages-ahead", daemon=True)
    thread.start()
    return thread


WRITE_BACK_EVERY_S = 0.02  # CRIU writes about 1 GiB in 0.25-0.3 s: a dozen rounds of queueing


class WriteBack:
    """CRIU's page images sent to the disk while CRIU writes them (its dump), so that the sync at
    post-dump (engine/dump.py) waits for the last of them only. CRIU writes through the page cache
    and syncs nothing; a sync at the end then writes the whole image, about 1 GiB for a torch
    process, after CRIU's dump. Every WRITE_BACK_EVERY_S each page image (pages-*.img: the bulk of
    an image; the other files are small) that grew has its dirty pages queued for writing
    (sync_file_range(2) SYNC_FILE_RANGE_WRITE: it does not wait, and the sync after it still makes
    them durable), opened and closed each time (a tree of many processes has many files, and this
    process keeps its descriptors for its own work). Nothing on tmpfs (no disk behind it). Best
    effort: a file it cannot open is left to the sync."""

    def __init__(self, images_dir: str):
        self.images_dir = images_dir
        self._stop = threading.Event()
        self._thread = None

    def start(self) -> WriteBack:
        """Its thread started, where the image is on a disk; -> itself."""
        if _sync_file_range is not None and memfs.on_disk(self.images_dir):
            self._thread = threading.Thread(target=self._run, name="criu-image-writeback", daemon=True)
            self._thread.start()
        return self

    @property
    def running(self) -> bool:
        return self._thread is not None

    def stop(self) -> None:
        """Stop queueing writes (those queued go on); not started, or again, it does nothing."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
        queued = {}  # page image -> its size when last queued
        while not self._stop.wait(WRITE_BACK_EVERY_S):
            try:
                grown = [(e.path, e.stat(follow_symlinks=False).st_size) for e in os.scandir(self.images_dir)
                         if e.name.startswith("pages-") and e.is_file(follow_symlinks=False)]
            except OSError:
                continue  # a file gone between the listing and its stat: the next round
            for path, size in grown:
                if size <= queued.get(path, 0):
                    continue
                try:
                    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
                except OSError:
                    continue
                try:
                    _sync_file_range(fd, 0, 0, _SYNC_FILE_RANGE_WRITE)
                finally:
                    os.close(fd)
                queued[path] = size


def _available_memory() -> int:
    """MemAvailable of /proc/meminfo, in bytes."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise OSError("no MemAvailable in /proc/meminfo")


_libc = ctypes.CDLL(None, use_errno=True)
_SYNC_FILE_RANGE_WRITE = 2  # the kernel header's value
try:
    _sync_file_range = _libc.sync_file_range
    _sync_file_range.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
except AttributeError:  # a C library without it: the sync at post-dump writes everything
    _sync_file_range = None


def image_bytes(images_dir: str) -> int:
    """The bytes of the image's files (those directly in images_dir)."""
    return sum(e.stat().st_size for e in os.scandir(images_dir) if e.is_file())


def dump_succeeded(images_dir: str, since: float) -> bool:
    """Whether a CRIU dump begun at `since` (time.time()) succeeded: CRIU writes stats-dump only
    once the dump is done and every action script has passed, after letting the tasks go."""
    try:
        return os.stat(os.path.join(images_dir, "stats-dump")).st_mtime >= since
    except OSError:
        return False


def pids(images_dir: str) -> list[int]:
    """The pids of the dumped processes (not threads), root first, from pstree.img."""
    return [task["pid"] for task in _entries(images_dir, "pstree.img")]


def _regular_files(images_dir: str) -> dict[int, str]:
    """id -> path of every regular file in the image: files.img, and reg-files.img where an older
    CRIU wrote one."""
    files = {}
    found = False
    for name, is_file_entry in (("files.img", True), ("reg-files.img", False)):
        if not os.path.exists(os.path.join(images_dir, name)):
            continue
        found = True
        for entry in _entries(images_dir, name):
            if is_file_entry:
                if entry.get("type") != "REG":
                    continue
                entry = entry["reg"]
            files[entry["id"]] = entry["name"]
    if not found:
        raise ImageError(os.path.join(images_dir, "files.img"), "missing (and no reg-files.img)")
    return files


def _entries(images_dir: str, name: str) -> list[dict]:
    images = _pycriu.load("images")
    path = os.path.join(images_dir, name)
    try:
        with open(path, "rb") as f:
            entries = images.load(f)["entries"]
    except OSError as e:
        raise ImageError(path, e.strerror) from None
    except Exception as e:  # noqa: BLE001 - pycriu raises assorted errors on bad bytes
        raise ImageError(path, f"cannot be decoded ({type(e).__name__}: {e})") from None
    if not entries:
        raise ImageError(path, "holds no entries")
    return entries
