"""Helpers for the chunk-store tests: reproducible chunk bytes, paths, ageing files, a dump."""
import os
import random

from criu_gpushare.store import Allocation, Manifest, ProcessEntry


def chunk_bytes(seed, size=4096):
    """Reproducible non-zero bytes."""
    return random.Random(seed).randbytes(size)


def chunk_path(store, cid):
    return os.path.join(store.path, "chunks", cid[:2], cid)


def age(path, seconds):
    """Move a file's mtime `seconds` into the past (lstat times, no symlink follow)."""
    st = os.lstat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns - int(seconds * 1e9)),
             follow_symlinks=False)


def commit_checkpoint(store, name, datas, pid=100):
    """Dump `datas` (a list of bytes, one chunk each) as one allocation; returns the PutResults."""
    with store.begin_write(name) as session:
        results = [session.put(d) for d in datas]
        manifest = Manifest([ProcessEntry(pid, [Allocation.from_puts("a0", results)])])
        session.commit(name, manifest)
    return results


def age_store(store_dir, seconds=7200):
    """Age every chunk and manifest, so that a gc with a short grace period sees them as old
    (file times have coarse, clock-tick granularity: "just written" may equal gc's "now")."""
    for sub in ("chunks", "manifests"):
        for root, _, files in os.walk(os.path.join(store_dir, sub)):
            for f in files:
                age(os.path.join(root, f), seconds)
