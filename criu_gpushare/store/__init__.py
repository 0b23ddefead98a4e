"""The chunk store: GPU memory of checkpoints, content-addressed and deduplicated.

The format is store/FORMAT.md. Entry points:
  open_store(location, create=..., cache=NodeCache.open(...))  an open store: a directory
      (Store) or s3://BUCKET/PREFIX (S3Store, store/s3store.py); base.ChunkStore is the interface
  store.put(view) -> PutResult / store.get(chunk_id, buf, verify=...) -> Source
  store.begin_write(purpose) -> WriteSession (put under a lease, then commit(ref, manifest))
  Manifest / ProcessEntry / Allocation / ChunkRef        what a checkpoint references
  store.check_chunks(manifest) -> [Problem]          a fast pre-restore check (stat only)
  store.hold(ref, kind, pid) -> Hold / store.holds(ref) -> [HoldInfo]   keep a ref from rm
  collect_garbage, verify_store, disk_usage, prefetch  the maintenance commands
"""
# The package's names are imported from their modules when first used, not here: the engine needs
# a few of them, and every command's start would otherwise pay for gc, verify, du, holds and the
# node cache. prefetch is imported at once: its module has the same name, and whichever a later
# `import criu_gpushare.store.prefetch` left here would win otherwise.
from .prefetch import prefetch

_WHERE = {
    "open_from_settings": "backend", "open_store": "backend", "NodeCache": "cache",
    "ChunkDamaged": "chunkdir", "ChunkMissing": "chunkdir", "disk_usage": "du",
    "DEFAULT_GRACE_S": "gc", "collect_garbage": "gc", "Hold": "holds", "HoldInfo": "holds",
    "RefHeld": "holds", "CHUNK_SIZE_MAX": "layout", "STORE_VERSION": "layout", "chunk_id": "layout",
    "WriteSession": "leases", "MANIFEST_VERSION": "manifest", "Allocation": "manifest",
    "ChunkRef": "manifest", "Manifest": "manifest", "ProcessEntry": "manifest",
    "PutResult": "results", "PutStatus": "results", "Source": "results", "Store": "store",
    "Problem": "verify", "check_chunks": "verify", "check_present": "verify", "verify_store": "verify",
}


def __getattr__(name):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib
    value = getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    globals()[name] = value
    return value


__all__ = [
    "Allocation", "CHUNK_SIZE_MAX", "ChunkDamaged", "ChunkMissing", "ChunkRef", "DEFAULT_GRACE_S",
    "Hold", "HoldInfo", "MANIFEST_VERSION", "Manifest", "NodeCache", "Problem", "ProcessEntry",
    "PutResult", "PutStatus", "RefHeld", "STORE_VERSION", "Source", "Store", "WriteSession",
    "check_chunks", "check_present", "chunk_id", "open_from_settings", "open_store",
    "collect_garbage",
    "disk_usage", "prefetch", "verify_store",
]
