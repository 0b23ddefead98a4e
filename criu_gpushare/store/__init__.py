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
from .backend import open_from_settings, open_store
from .cache import NodeCache
from .chunkdir import ChunkDamaged, ChunkMissing
from .du import disk_usage
from .gc import DEFAULT_GRACE_S, collect_garbage
from .holds import Hold, HoldInfo, RefHeld
from .layout import CHUNK_SIZE_MAX, STORE_VERSION, chunk_id
from .leases import WriteSession
from .manifest import MANIFEST_VERSION, Allocation, ChunkRef, Manifest, ProcessEntry
from .prefetch import prefetch
from .results import PutResult, PutStatus, Source
from .store import Store
from .verify import Problem, check_chunks, check_present, verify_store

__all__ = [
    "Allocation", "CHUNK_SIZE_MAX", "ChunkDamaged", "ChunkMissing", "ChunkRef", "DEFAULT_GRACE_S",
    "Hold", "HoldInfo", "MANIFEST_VERSION", "Manifest", "NodeCache", "Problem", "ProcessEntry",
    "PutResult", "PutStatus", "RefHeld", "STORE_VERSION", "Source", "Store", "WriteSession",
    "check_chunks", "check_present", "chunk_id", "open_from_settings", "open_store",
    "collect_garbage",
    "disk_usage", "prefetch", "verify_store",
]
