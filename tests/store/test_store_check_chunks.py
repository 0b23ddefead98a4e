"""store.check_chunks(manifest): the stat-only check a resume runs before it changes anything.
Every problem names the chunk id and its file; no chunk byte is read."""
import os

import pytest

from criu_gpushare.store import check_present

from store_helpers import chunk_bytes, chunk_path, commit_checkpoint


def manifest_of(store, name):
    return store.read_manifest(store.read_ref(name).manifest)


@pytest.fixture
def three(store):
    results = commit_checkpoint(store, "ck", [chunk_bytes(1), chunk_bytes(2), chunk_bytes(3),
                                              bytes(4096), chunk_bytes(1)])
    return [r.chunk_id for r in results[:3]]


def test_an_intact_checkpoint_has_no_problems(store, three):
    assert store.check_chunks(manifest_of(store, "ck")) == []
    assert check_present is not None  # the older name stays


def test_missing_truncated_and_foreign_chunks_are_each_named(store, three):
    missing, truncated, foreign = three
    os.unlink(chunk_path(store, missing))
    with open(chunk_path(store, truncated), "r+b") as f:
        f.truncate(100)
    if os.geteuid() == 0:
        os.chown(chunk_path(store, foreign), 1001, 1001)
    problems = {p.chunk: p for p in store.check_chunks(manifest_of(store, "ck"))}
    assert problems[missing].kind == "missing"
    assert problems[missing].path == chunk_path(store, missing)
    assert missing in problems[missing].detail
    assert problems[truncated].kind == "truncated"
    assert problems[truncated].detail == "100 bytes, expected 4096"
    if os.geteuid() == 0:
        assert problems[foreign].kind == "foreign"
        assert "owned by uid 1001" in problems[foreign].detail
        assert len(problems) == 3
    else:
        assert len(problems) == 2


def test_a_world_writable_chunk_or_a_symlink_is_reported(store, three):
    a, b, _ = three
    os.chmod(chunk_path(store, a), 0o666)
    os.unlink(chunk_path(store, b))
    os.symlink("/etc/passwd", chunk_path(store, b))
    problems = {p.chunk: p for p in store.check_chunks(manifest_of(store, "ck"))}
    assert problems[a].kind == "foreign" and "mode 0666" in problems[a].detail
    assert problems[b].kind == "bad-file" and "symlink" in problems[b].detail


def test_a_foreign_fanout_directory_is_reported(store, three):
    if os.geteuid() != 0:
        pytest.skip("needs root to chown")
    cid = three[0]
    os.chown(os.path.dirname(chunk_path(store, cid)), 1001, 1001)
    problems = {p.chunk: p for p in store.check_chunks(manifest_of(store, "ck"))}
    assert problems[cid].kind == "foreign" and "owned by uid 1001" in problems[cid].detail


def test_check_chunks_reads_no_chunk_bytes(store, three, monkeypatch):
    def no_read(*a, **k):
        raise AssertionError("check_chunks read a chunk")
    monkeypatch.setattr(store.chunks, "read", no_read)
    assert store.check_chunks(manifest_of(store, "ck")) == []
