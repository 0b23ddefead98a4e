"""The node cache: a node-local copy of some chunks, read before the (maybe remote) store.

Same chunks/ layout as the store. Filled only by prefetch (never by a restore: that would put cache
writes on its critical path), and every chunk is verified before it enters. A read hit refreshes
the chunk's mtime, which is its LRU time; eviction removes the least recently used chunks until the
cache fits its size limit. A damaged cache entry is dropped and the read falls back to the store,
so evicting or losing cache entries is always safe.
"""
import os

from .chunkdir import ChunkDamaged, ChunkDir, open_root


class NodeCache:
    def __init__(self, path, root_fd, limit_bytes=None):
        self.path = path
        self.root_fd = root_fd
        self.limit_bytes = limit_bytes
        self.chunks = ChunkDir(root_fd, path, create=True)

    @classmethod
    def open(cls, path, limit_bytes=None, create=True):
        """Open (or make) a cache directory; the same ownership rules as a store apply."""
        path = os.path.abspath(path)
        return open_root(path, create, "cache", lambda fd: cls(path, fd, limit_bytes))

    def close(self):
        self.chunks.close()
        if self.root_fd >= 0:
            os.close(self.root_fd)
            self.root_fd = -1

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def read(self, cid, view, verify):
        """Read a chunk on a hit (refreshing its LRU time) and return True; False on a miss."""
        try:
            self.chunks.read(cid, view)
            if verify:
                self.chunks.check(cid, view)
        except FileNotFoundError:
            return False
        except ChunkDamaged:
            self.chunks.remove(cid, cid[:2])  # damaged copy: drop it, the store has the chunk
            return False
        self.chunks.touch(cid)
        return True

    def contains(self, cid):
        return self.chunks.stat(cid) is not None

    def insert(self, cid, view):
        """Add a chunk the caller has verified (temp, data, fdatasync, rename)."""
        self.chunks.write(cid, view, self.path)

    def usage(self):
        """(chunk count, bytes) of the cached chunks."""
        count = size = 0
        for f in self.chunks.scan():
            if not f.is_temp and f.is_regular:
                count += 1
                size += f.size
        return count, size

    def evict(self, limit_bytes, keep=frozenset()):
        """Remove least recently used chunks (not in `keep`) until the cache holds <= limit_bytes.

        Also removes temp files left by interrupted fills. Returns (chunks removed, bytes removed).
        """
        entries, total = [], 0
        for f in self.chunks.scan():
            if f.is_temp:
                self.chunks.remove(f.name, f.fanout)
            elif f.is_regular:
                entries.append(f)
                total += f.size
        entries.sort(key=lambda f: f.mtime_ns)
        removed = freed = 0
        for f in entries:
            if total <= limit_bytes:
                break
            if f.name in keep:
                continue
            self.chunks.remove(f.name, f.fanout)
            total -= f.size
            removed += 1
            freed += f.size
        return removed, freed
