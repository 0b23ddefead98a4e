"""Manifest files and refs: what a checkpoint is made of, and the names that keep it alive.

manifests/<id>.json holds a manifest; its id is the XXH3-128 of the file's bytes, so a manifest is
immutable and checkable. refs/<name> names a checkpoint and points at one manifest. gc keeps
exactly what refs reach (store/FORMAT.md, "Garbage collection").
"""
import json
import os
import time
from dataclasses import dataclass, field

from ..errors import StoreError
from . import docs, fsutil
from .layout import (MANIFESTS_DIR, MANIFEST_SUFFIX, REFS_DIR, chunk_id, is_chunk_id, is_ref_name,
                     is_temp_name, manifest_name)
from .manifest import parse_manifest

REF_FORMAT = "criu-gpushare-ref"
REF_VERSION = 1


class RefMissing(StoreError):
    """chunk store: {}"""


@dataclass(frozen=True)
class Ref:
    name: str
    manifest: str
    created: str
    meta: dict = field(default_factory=dict)


def manifest_path(store, mid):
    return os.path.join(store.path, MANIFESTS_DIR, manifest_name(mid))


def write_manifest(store, manifest):
    """Write a manifest durably (temp, fsync, rename, fsync of manifests/); returns its id.

    An identical manifest already there is kept and its time refreshed, like a chunk.
    """
    data = manifest.to_json()
    mid = chunk_id(data)
    dfd = store.dir_fd(MANIFESTS_DIR, create=True)
    name = manifest_name(mid)
    try:
        os.utime(name, dir_fd=dfd, follow_symlinks=False)
        return mid
    except FileNotFoundError:
        pass
    except OSError as e:
        raise StoreError(f"{manifest_path(store, mid)}: {fsutil.describe(e)}") from e
    fsutil.write_file_atomic(dfd, os.path.join(store.path, MANIFESTS_DIR), name, data)
    return mid


def read_manifest(store, mid, verify=True):
    """Read and check a manifest; with verify, its bytes must hash to its id."""
    if not is_chunk_id(mid):
        raise StoreError(f"{store.path}: {mid!r} is not a manifest id")
    path = manifest_path(store, mid)
    dfd = store.dir_fd(MANIFESTS_DIR)
    try:
        if dfd is None:
            raise FileNotFoundError
        data = fsutil.read_small_file(dfd, os.path.dirname(path), manifest_name(mid))
    except FileNotFoundError:
        raise StoreError(f"{path}: manifest missing") from None
    if verify and chunk_id(data) != mid:
        raise StoreError(f"{path}: content hashes to {chunk_id(data)}, not to its name "
                         f"(corrupted manifest)")
    return parse_manifest(data, path)


def list_manifests(store):
    """(id, size, mtime_ns, is_temp, name) of every file in manifests/ that is ours."""
    dfd = store.dir_fd(MANIFESTS_DIR)
    if dfd is None:
        return []
    out = []
    for e in os.scandir(dfd):
        mid = e.name[:-len(MANIFEST_SUFFIX)] if e.name.endswith(MANIFEST_SUFFIX) else None
        temp = is_temp_name(e.name)
        if not temp and not is_chunk_id(mid):
            continue
        try:
            st = e.stat(follow_symlinks=False)
        except FileNotFoundError:
            continue
        out.append((mid, st.st_size, st.st_mtime_ns, temp, e.name))
    return out


def ref_path(store, name):
    return os.path.join(store.path, REFS_DIR, name)


def _check_ref_name(store, name):
    check_ref_name(ref_path(store, str(name)), name)


def check_ref_name(path, name):
    """A StoreError naming `path` unless `name` is a valid ref name."""
    if not is_ref_name(name):
        raise StoreError(f"{path}: bad checkpoint name {name!r}: use 1-200 of A-Z a-z 0-9 . _ -, "
                         f"not starting with . or -")


def set_ref(store, name, mid, meta=None):
    """Point ref `name` at manifest `mid` (atomically replacing an older ref of that name)."""
    data = ref_bytes(ref_path(store, str(name)), name, mid, meta)
    fsutil.write_file_atomic(store.dir_fd(REFS_DIR, create=True),
                             os.path.join(store.path, REFS_DIR), name, data)


def ref_bytes(path, name, mid, meta=None):
    """A ref file's bytes (checked: the name and the manifest id); `path` names it in errors."""
    check_ref_name(path, name)
    if not is_chunk_id(mid):
        raise StoreError(f"{path}: {mid!r} is not a manifest id")
    doc = {"format": REF_FORMAT, "version": REF_VERSION, "manifest": mid,
           "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "meta": meta or {}}
    return json.dumps(doc, indent=1, sort_keys=True).encode() + b"\n"


def read_ref(store, name):
    _check_ref_name(store, name)
    path = ref_path(store, name)
    dfd = store.dir_fd(REFS_DIR)
    try:
        if dfd is None:
            raise FileNotFoundError
        data = fsutil.read_small_file(dfd, os.path.dirname(path), name, limit=1 << 20)
    except FileNotFoundError:
        raise RefMissing(f"{path}: no such checkpoint") from None
    return parse_ref(data, path, name)


def parse_ref(data, path, name):
    """A Ref from a ref file's bytes; every problem names `path`."""
    doc = docs.load(data, REF_FORMAT)
    if doc is None:
        raise StoreError(f"{path}: bad ref: not a {REF_FORMAT} JSON file")
    docs.check_version(doc, REF_VERSION, path, "ref")
    mid = doc.get("manifest")
    if not is_chunk_id(mid):
        raise StoreError(f"{path}: bad ref: manifest {mid!r} is not a manifest id")
    meta = doc.get("meta") if isinstance(doc.get("meta"), dict) else {}
    return Ref(name, mid, str(doc.get("created", "")), meta)


def list_refs(store):
    """Names of all refs, sorted (temp files and foreign names are skipped)."""
    dfd = store.dir_fd(REFS_DIR)
    if dfd is None:
        return []
    return sorted(n for n in fsutil.list_dir(dfd) if is_ref_name(n))


def list_ref_temps(store):
    dfd = store.dir_fd(REFS_DIR)
    if dfd is None:
        return []
    out = []
    for e in os.scandir(dfd):
        if is_temp_name(e.name):
            try:
                out.append((e.name, e.stat(follow_symlinks=False).st_mtime_ns))
            except FileNotFoundError:
                pass
    return out


def remove_ref(store, name):
    """Delete a checkpoint's ref; its chunks go at the next gc after the grace period."""
    _check_ref_name(store, name)
    dfd = store.dir_fd(REFS_DIR)
    try:
        if dfd is None:
            raise FileNotFoundError
        os.unlink(name, dir_fd=dfd)
    except FileNotFoundError:
        raise RefMissing(f"{ref_path(store, name)}: no such checkpoint") from None
    fsutil.fsync_dir(dfd, os.path.join(store.path, REFS_DIR))
