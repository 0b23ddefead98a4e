"""Manifests (FORMAT.md sections 4-6): format, versioning, ids, write order. Refs on their own:
test_store_catalog.py."""
import json
import os

import pytest

from criu_gpushare.errors import StoreError
from criu_gpushare.store import (Allocation, ChunkRef, Manifest, ProcessEntry, chunk_id)
from criu_gpushare.store.manifest import MANIFEST_VERSION, parse_manifest

from store_helpers import chunk_bytes


def sample_manifest():
    return Manifest(
        [ProcessEntry(7, [Allocation("0x7f00", 12, [ChunkRef("ab" * 16, 8), ChunkRef(None, 4)],
                                     {"device": 1})], {"comm": "python"})],
        meta={"tool": "test"})


def test_manifest_round_trip_keeps_order_zero_chunks_and_meta():
    m = parse_manifest(sample_manifest().to_json(), "m.json")
    a = m.processes[0].allocations[0]
    assert (m.processes[0].pid, a.key, a.size) == (7, "0x7f00", 12)
    assert a.chunks == [ChunkRef("ab" * 16, 8), ChunkRef(None, 4)]
    assert a.chunks[1].is_zero and a.meta == {"device": 1}
    assert m.processes[0].meta == {"comm": "python"} and m.meta == {"tool": "test"}


def test_manifest_from_a_newer_version_is_refused_naming_file_and_versions():
    doc = json.loads(sample_manifest().to_json())
    doc["version"] = MANIFEST_VERSION + 1
    with pytest.raises(StoreError, match=f"/x/m.json: manifest format version "
                                         f"{MANIFEST_VERSION + 1} is newer than this tool reads "
                                         f"\\(version {MANIFEST_VERSION}\\)"):
        parse_manifest(json.dumps(doc).encode(), "/x/m.json")


def test_unknown_keys_are_ignored():
    doc = json.loads(sample_manifest().to_json())
    doc["future"] = 1
    doc["processes"][0]["allocations"][0]["future"] = [1, 2]
    m = parse_manifest(json.dumps(doc).encode(), "m.json")
    assert m.processes[0].allocations[0].size == 12


@pytest.mark.parametrize("damage,message", [
    (lambda d: d["processes"][0]["allocations"][0].update(size=13), "add up to 12, not to its size 13"),
    (lambda d: d["processes"][0]["allocations"][0]["chunks"][0].update(id="XYZ"), "not 32 lowercase hex"),
    (lambda d: d["processes"][0]["allocations"][0]["chunks"][0].update(len=0), "outside 1.."),
    (lambda d: d["processes"][0]["allocations"][0]["chunks"][0].update(len=(64 << 20) + 1), "outside 1.."),
    (lambda d: d["processes"][0]["allocations"].append(d["processes"][0]["allocations"][0]), "not a unique"),
    (lambda d: d.pop("processes"), "missing or mistyped"),
    (lambda d: d.update(format="other"), '"format" is not'),
])
def test_malformed_manifests_are_refused_naming_the_file(damage, message):
    doc = json.loads(sample_manifest().to_json())
    damage(doc)
    with pytest.raises(StoreError, match=f"m.json: bad manifest: .*{message}"):
        parse_manifest(json.dumps(doc).encode(), "m.json")


def test_not_json_is_refused():
    with pytest.raises(StoreError, match="m.json: bad manifest: not JSON"):
        parse_manifest(b"\x00garbage", "m.json")


def test_manifest_file_is_named_by_the_hash_of_its_bytes(store):
    mid = store.write_manifest(sample_manifest())
    path = os.path.join(store.path, "manifests", mid + ".json")
    with open(path, "rb") as f:
        assert chunk_id(f.read()) == mid
    assert store.read_manifest(mid).processes[0].pid == 7


def test_corrupted_or_missing_manifest_is_an_error_naming_it(store):
    mid = store.write_manifest(sample_manifest())
    path = os.path.join(store.path, "manifests", mid + ".json")
    with open(path, "r+b") as f:
        f.seek(10)
        f.write(b"#")
    with pytest.raises(StoreError, match=f"{path}: content hashes to"):
        store.read_manifest(mid)
    os.unlink(path)
    with pytest.raises(StoreError, match=f"{path}: manifest missing"):
        store.read_manifest(mid)


def test_commit_order_is_chunks_synced_then_manifest_then_ref(store, monkeypatch):
    calls = []
    for name in ("sync", "write_manifest", "set_ref"):
        real = getattr(store, name)
        monkeypatch.setattr(store, name,
                            lambda *a, _n=name, _r=real: (calls.append(_n), _r(*a))[1])
    with store.begin_write("order") as session:
        results = [session.put(chunk_bytes(9))]
        session.commit("order", Manifest([ProcessEntry(1, [Allocation.from_puts("k", results)])]))
    assert calls == ["sync", "write_manifest", "set_ref", "sync"]


def test_session_counts_bytes_by_outcome(store):
    with store.begin_write("count") as session:
        for data in (chunk_bytes(1), chunk_bytes(1), bytes(4096), chunk_bytes(2, 100)):
            session.put(data)
    counts = {status.value: n for status, n in session.bytes.items()}
    assert counts == {"new": 4196, "present": 4096, "zero": 4096}
