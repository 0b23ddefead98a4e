"""Manifests: what one checkpoint holds, per process and per allocation, as ordered chunk lists.

A manifest is JSON (store/FORMAT.md, "Manifests"), versioned by MANIFEST_VERSION. Readers refuse a
newer version, naming the file and both versions; they ignore keys they do not know. `meta` objects
are free-form and belong to the writer (e.g. the copy engine puts the device and the VA there).
"""
import json
import time
from dataclasses import dataclass, field

from ..errors import StoreError
from . import docs
from .layout import CHUNK_SIZE_MAX, is_chunk_id

MANIFEST_FORMAT = "criu-gpushare-manifest"
MANIFEST_VERSION = 1


@dataclass(frozen=True)
class ChunkRef:
    """One chunk of an allocation: its id, or None for an all-zero chunk (never stored)."""
    id: object  # str or None
    length: int

    @property
    def is_zero(self):
        return self.id is None


@dataclass
class Allocation:
    """One allocation's bytes: `size` bytes, the concatenation of `chunks` in order."""
    key: str
    size: int
    chunks: list
    meta: dict = field(default_factory=dict)

    @classmethod
    def from_puts(cls, key, put_results, meta=None):
        """Build from the PutResults of the allocation's chunks, in order."""
        chunks = [ChunkRef(r.chunk_id, r.length) for r in put_results]
        return cls(key, sum(c.length for c in chunks), chunks, dict(meta or {}))


@dataclass
class ProcessEntry:
    pid: int
    allocations: list
    meta: dict = field(default_factory=dict)


@dataclass
class Manifest:
    processes: list
    meta: dict = field(default_factory=dict)
    created: str = ""
    chunk_size: int = CHUNK_SIZE_MAX

    def chunk_ids(self):
        """Every stored chunk id the manifest references (zero chunks excluded), with repeats."""
        for p in self.processes:
            for a in p.allocations:
                for c in a.chunks:
                    if c.id is not None:
                        yield c.id, c.length

    def to_json(self):
        doc = {
            "format": MANIFEST_FORMAT,
            "version": MANIFEST_VERSION,
            "created": self.created or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "chunk_size": self.chunk_size,
            "meta": self.meta,
            "processes": [{
                "pid": p.pid,
                "meta": p.meta,
                "allocations": [{
                    "key": a.key,
                    "size": a.size,
                    "meta": a.meta,
                    "chunks": [{"id": c.id, "len": c.length} for c in a.chunks],
                } for a in p.allocations],
            } for p in self.processes],
        }
        return json.dumps(doc, indent=1, sort_keys=True).encode() + b"\n"


def parse_manifest(data, path):
    """Decode and check manifest bytes read from `path`; every problem names the path."""
    def bad(why):
        return StoreError(f"{path}: bad manifest: {why}")

    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise bad(f"not JSON ({e})") from e
    if not isinstance(doc, dict) or doc.get("format") != MANIFEST_FORMAT:
        raise bad(f'"format" is not "{MANIFEST_FORMAT}"')
    docs.check_version(doc, MANIFEST_VERSION, path, "manifest")
    try:
        procs = []
        for p in _list(doc, "processes"):
            allocs, keys = [], set()
            for a in _list(p, "allocations"):
                chunks = []
                for c in _list(a, "chunks"):
                    cid, length = c["id"], c["len"]
                    if cid is not None and not is_chunk_id(cid):
                        raise bad(f"chunk id {cid!r} is not 32 lowercase hex digits")
                    if not isinstance(length, int) or not 0 < length <= CHUNK_SIZE_MAX:
                        raise bad(f"chunk length {length!r} outside 1..{CHUNK_SIZE_MAX}")
                    chunks.append(ChunkRef(cid, length))
                key, size = a["key"], a["size"]
                if not isinstance(key, str) or key in keys:
                    raise bad(f"allocation key {key!r} of pid {p['pid']} is not a unique string")
                keys.add(key)
                if sum(c.length for c in chunks) != size:
                    raise bad(f"allocation {key} of pid {p['pid']}: chunk lengths add up to "
                              f"{sum(c.length for c in chunks)}, not to its size {size}")
                allocs.append(Allocation(key, size, chunks, _dict(a.get("meta", {}))))
            pid = p["pid"]
            if not isinstance(pid, int):
                raise bad(f"pid {pid!r} is not an integer")
            procs.append(ProcessEntry(pid, allocs, _dict(p.get("meta", {}))))
        return Manifest(procs, _dict(doc.get("meta", {})), str(doc.get("created", "")),
                        int(doc.get("chunk_size", CHUNK_SIZE_MAX)))
    except (KeyError, TypeError, ValueError) as e:
        raise bad(f"missing or mistyped field {e}") from e


def _list(obj, key):
    value = obj[key]
    if not isinstance(value, list):
        raise TypeError(key)
    return value


def _dict(value):
    if not isinstance(value, dict):
        raise TypeError("meta")
    return value
