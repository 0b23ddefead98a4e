"""Names and places inside a chunk store (store/FORMAT.md, "Layout" and "Chunks").

Everything here is pure: no I/O. The rest of the package builds paths only through these helpers,
so the on-disk layout lives in one place.
"""
import os
import re

import xxhash

#: The store format this code writes; it reads any version up to this one.
STORE_VERSION = 1
STORE_FORMAT = "criu-gpushare-store"
#: The largest chunk the format allows (a FORMAT.md MUST); writers may choose smaller ones.
CHUNK_SIZE_MAX = 64 << 20
HASH_NAME = "xxh3-128"

STORE_FILE = "store.json"
CHUNKS_DIR = "chunks"
MANIFESTS_DIR = "manifests"
REFS_DIR = "refs"
LEASES_DIR = "leases"
HOLDS_DIR = "holds"
GC_DIR = "gc"
GC_LOCK = "gc.lock"
TEMP_SUFFIX = ".tmp"
MANIFEST_SUFFIX = ".json"
LEASE_SUFFIX = ".lease"
HOLD_SUFFIX = ".hold"

_ID_RE = re.compile(r"[0-9a-f]{32}\Z")
_REF_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,199}\Z")
_TEMP_RE = re.compile(r"\..+\.[0-9a-f]{16}\.tmp\Z")


def chunk_id(data):
    """The chunk id of `data`: the XXH3-128 digest as 32 lowercase hex digits, as `xxh128sum` prints.

    xxhash releases the GIL while hashing, so threads hash in parallel.
    """
    return xxhash.xxh3_128_hexdigest(data)


_zero_ids = {}


def zero_chunk_id(length):
    """The chunk id of `length` zero bytes (cached: one hash per distinct length)."""
    cid = _zero_ids.get(length)
    if cid is None:
        cid = _zero_ids[length] = chunk_id(bytes(length))
    return cid


def is_chunk_id(name):
    return isinstance(name, str) and _ID_RE.match(name) is not None


def fanout(cid):
    """The fan-out directory of a chunk (its first two hex digits)."""
    return cid[:2]


def manifest_name(mid):
    return mid + MANIFEST_SUFFIX


def is_ref_name(name):
    """Ref (checkpoint) names: 1-200 of [A-Za-z0-9._-], not starting with '.' or '-'."""
    return isinstance(name, str) and _REF_RE.match(name) is not None


def temp_name(final_name):
    """A fresh temporary name for `final_name` in the same directory: hidden, random, `.tmp`.

    Random (not pid-based) because writers in other pid namespaces share a store.
    """
    return f".{final_name}.{os.urandom(8).hex()}{TEMP_SUFFIX}"


def is_temp_name(name):
    return _TEMP_RE.match(name) is not None
