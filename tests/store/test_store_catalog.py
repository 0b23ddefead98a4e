"""criu_gpushare/store/catalog.py: manifest files and refs (FORMAT.md sections 5 and 6).

What a user relies on: a ref names one checkpoint and points at one manifest, is replaced
atomically, and is refused (naming its file) when it is not a ref this tool can read; a manifest
file is named by the hash of its bytes, written once and refreshed when written again."""
import json
import os

import pytest

from criu_gpushare.errors import StoreError
from criu_gpushare.store import Allocation, Manifest, ProcessEntry
from criu_gpushare.store.catalog import REF_FORMAT, RefMissing, list_manifests, ref_path
from criu_gpushare.store.layout import temp_name

from store_helpers import age, chunk_bytes, commit_checkpoint


def manifest(pid):
    return Manifest([ProcessEntry(pid, [Allocation("a0", 0, [])])])


def test_refs_point_at_manifests_and_can_be_removed(store):
    commit_checkpoint(store, "ck-a", [chunk_bytes(1)])
    ref = store.read_ref("ck-a")
    assert store.read_manifest(ref.manifest).processes[0].allocations[0].size == 4096
    assert store.list_refs() == ["ck-a"]
    store.remove_ref("ck-a")
    assert store.list_refs() == []
    with pytest.raises(StoreError, match="refs/ck-a: no such checkpoint"):
        store.read_ref("ck-a")
    with pytest.raises(StoreError, match="bad checkpoint name"):
        store.set_ref("../escape", "ab" * 16)


def test_a_ref_is_replaced_whole_and_keeps_its_meta(store):
    first, second = store.write_manifest(manifest(1)), store.write_manifest(manifest(2))
    store.set_ref("ck", first, {"pid": 1})
    store.set_ref("ck", second, {"pid": 2})
    ref = store.read_ref("ck")
    assert (ref.name, ref.manifest, ref.meta) == ("ck", second, {"pid": 2})
    doc = json.loads(open(ref_path(store, "ck")).read())
    assert doc["format"] == REF_FORMAT and doc["version"] == 1 and doc["manifest"] == second
    assert os.listdir(os.path.join(store.path, "refs")) == ["ck"]  # no temp file left


@pytest.mark.parametrize("content,message", [
    (b"not json", "bad ref: not a criu-gpushare-ref JSON file"),
    (json.dumps({"format": REF_FORMAT, "version": 2, "manifest": "ab" * 16}).encode(),
     r"ref format version 2 is newer than this tool reads \(version 1\); upgrade criu-gpushare"),
    (json.dumps({"format": REF_FORMAT, "version": 1, "manifest": "../x"}).encode(),
     "bad ref: manifest '../x' is not a manifest id"),
])
def test_a_ref_this_tool_cannot_read_is_refused_naming_its_file(store, content, message):
    os.makedirs(os.path.join(store.path, "refs"), exist_ok=True)
    path = ref_path(store, "bad")
    with open(path, "wb") as f:
        f.write(content)
    with pytest.raises(StoreError, match=f"{path}: {message}"):
        store.read_ref("bad")


def test_a_ref_to_something_that_is_not_a_manifest_id_is_never_written(store):
    with pytest.raises(StoreError, match="is not a manifest id"):
        store.set_ref("ck", "not-an-id")
    assert store.list_refs() == []


def test_removing_a_missing_ref_says_so(store):
    with pytest.raises(RefMissing, match="refs/nothing: no such checkpoint"):
        store.remove_ref("nothing")


def test_the_same_manifest_written_again_is_one_file_with_a_fresh_time(store):
    mid = store.write_manifest(manifest(3))
    path = os.path.join(store.path, "manifests", f"{mid}.json")
    age(path, 3600)
    before = os.stat(path).st_mtime
    assert store.write_manifest(manifest(3)) == mid
    assert os.stat(path).st_mtime > before  # gc's grace starts again, as for a chunk
    assert [m[0] for m in list_manifests(store) if not m[3]] == [mid]


def test_listings_skip_temp_files_and_foreign_names(store):
    mid = store.write_manifest(manifest(4))
    store.set_ref("ck", mid)
    for sub, name in (("refs", temp_name("ck")), ("refs", ".hidden"), ("manifests", "notes.txt")):
        open(os.path.join(store.path, sub, name), "w").close()
    assert store.list_refs() == ["ck"]
    listed = {(m[0], m[3]) for m in list_manifests(store)}
    assert (mid, False) in listed and all(m[0] is not None or m[3] for m in list_manifests(store))
