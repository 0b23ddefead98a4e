"""Whether files live in memory (tmpfs, ramfs) and, on tmpfs, in which pages.

A store on tmpfs keeps every chunk's bytes in memory already: a load can hand the chunk files'
own pages to the driver (gpu/file_pages.py) instead of copying them into pinned buffers, where
the pages are huge (2 MiB) ones. CRIU's page images on tmpfs need no read-ahead and no write-back
(criu/images.py). `criu-gpushare doctor` warns of a tmpfs store of small pages.
"""
import ctypes
import os
import re

MEMORY_FILE_SYSTEMS = {0x01021994, 0x858458F6}  # TMPFS_MAGIC, RAMFS_MAGIC
SHMEM_ENABLED = "/sys/kernel/mm/transparent_hugepage/shmem_enabled"
MOUNTINFO = "/proc/self/mountinfo"

_libc = ctypes.CDLL(None, use_errno=True)


def file_system_type(path):
    """statfs(2)'s f_type of the file system that holds path (OSError if it cannot be asked)."""
    buf = ctypes.create_string_buffer(256)  # struct statfs is 120 bytes on 64-bit Linux
    if _libc.statfs(os.fsencode(path), buf) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path)
    return ctypes.c_long.from_buffer(buf).value & 0xFFFFFFFF


def on_disk(path):
    """Whether a disk is behind the file system that holds path: not tmpfs or ramfs, whose pages
    are in memory already (False too where it cannot be asked)."""
    try:
        return file_system_type(path) not in MEMORY_FILE_SYSTEMS
    except OSError:
        return False


def mount_of(path, mountinfo=MOUNTINFO):
    """(mount point, file system type, super options) of the mount that holds path, or None."""
    path = os.path.realpath(path)
    best = None
    with open(mountinfo) as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields, rest = left.split(), right.split()
            if len(fields) < 5 or len(rest) < 3:
                continue
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
            inside = path == point or path.startswith(point.rstrip("/") + "/")
            if inside and (best is None or len(point) >= len(best[0])):  # the last mount over it wins
                best = (point, rest[0], rest[2])
    return best


def tmpfs_huge_pages(options, shmem_enabled=SHMEM_ENABLED):
    """Whether the kernel gives a tmpfs with these super options 2 MiB pages as files are written:
    shmem_enabled's choice ([force], [deny]) is for every tmpfs, else the mount's huge=always."""
    try:
        with open(shmem_enabled) as f:
            chosen = re.search(r"\[(\w+)\]", f.read())
    except OSError:
        chosen = None
    if chosen and chosen.group(1) in ("force", "deny"):
        return chosen.group(1) == "force"
    return "huge=always" in options.split(",")


def pages_of(path, mountinfo=MOUNTINFO, shmem_enabled=SHMEM_ENABLED):
    """Where the files written under the directory `path` keep their bytes: "huge" (a tmpfs that
    gives them 2 MiB pages), "small" (another tmpfs, or ramfs), None (a disk, or not known)."""
    if not os.path.isdir(path) or on_disk(path):
        return None
    try:
        mount = mount_of(path, mountinfo)
    except OSError:
        return None
    if mount is not None and mount[1] == "tmpfs" and tmpfs_huge_pages(mount[2], shmem_enabled):
        return "huge"
    return "small"
