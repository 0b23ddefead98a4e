"""du: what a store holds, what its checkpoints reference, and what gc could reclaim."""
from dataclasses import asdict, dataclass

from .references import walk_refs


@dataclass
class Usage:
    refs: int = 0
    chunks: int = 0
    chunk_bytes: int = 0
    referenced_chunks: int = 0
    referenced_bytes: int = 0
    unreferenced_chunks: int = 0
    unreferenced_bytes: int = 0
    missing_chunks: int = 0
    logical_bytes: int = 0       # every allocation byte of every checkpoint (zeros, repeats)
    zero_bytes: int = 0
    manifests: int = 0
    manifest_bytes: int = 0
    temp_files: int = 0
    temp_bytes: int = 0
    leases: int = 0
    unreadable_refs: int = 0
    held_refs: int = 0           # refs with hold files (live or not yet swept by gc)

    @property
    def dedup_ratio(self):
        """Logical bytes per stored referenced byte (how much dedup and zero-skipping saved)."""
        return self.logical_bytes / self.referenced_bytes if self.referenced_bytes else 0.0

    def as_dict(self):
        d = asdict(self)
        d["dedup_ratio"] = round(self.dedup_ratio, 3)
        return d


def disk_usage(store):
    walked = walk_refs(store)
    u = Usage(refs=len(walked.refs), logical_bytes=walked.logical_bytes,
              zero_bytes=walked.zero_bytes, unreadable_refs=len(walked.problems))
    present = set()
    for f in store.scan_chunks():
        if f.is_temp:
            u.temp_files += 1
            u.temp_bytes += f.size
            continue
        if not f.is_regular:
            continue
        present.add(f.name)
        u.chunks += 1
        u.chunk_bytes += f.size
        if f.name in walked.chunks:
            u.referenced_chunks += 1
            u.referenced_bytes += f.size
        else:
            u.unreferenced_chunks += 1
            u.unreferenced_bytes += f.size
    u.missing_chunks = sum(1 for cid in walked.chunks if cid not in present)
    for _mid, size, _mtime, temp, _name in store.list_manifest_files():
        if temp:
            u.temp_files += 1
            u.temp_bytes += size
        else:
            u.manifests += 1
            u.manifest_bytes += size
    u.leases = store.live_writers()
    u.held_refs = len(store.held_refs())
    return u
