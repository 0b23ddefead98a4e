"""criu_gpushare/store/verify.py: `store verify`, which re-hashes what checkpoints reference (or
every chunk file) and names each one that is missing, truncated or corrupted, with the checkpoints
that use it. (The stat-only pre-restore check, check_chunks, is test_store_check_chunks.py.)"""
import os

from criu_gpushare.store import verify_store

from store_helpers import chunk_bytes, chunk_path, commit_checkpoint


def damage(store, results):
    missing, truncated, corrupt = (r.chunk_id for r in results)
    os.unlink(chunk_path(store, missing))
    with open(chunk_path(store, truncated), "r+b") as f:
        f.truncate(100)
    with open(chunk_path(store, corrupt), "r+b") as f:
        f.write(b"\xff" * 8)
    return missing, truncated, corrupt


def test_a_healthy_store_verifies_every_byte(store):
    commit_checkpoint(store, "ck", [chunk_bytes(1), chunk_bytes(2), bytes(4096)])
    report = verify_store(store)
    assert report.ok and (report.refs, report.chunks_checked, report.bytes_hashed) == (1, 2, 8192)


def test_each_damaged_chunk_is_named_with_its_kind_file_and_checkpoints(store):
    results = commit_checkpoint(store, "ck-a", [chunk_bytes(i) for i in (3, 4, 5)])
    commit_checkpoint(store, "ck-b", [chunk_bytes(5)])
    missing, truncated, corrupt = damage(store, results)
    report = verify_store(store, threads=2)
    assert not report.ok
    got = {(p.kind, p.chunk, p.path, tuple(p.refs)) for p in report.problems}
    assert got == {("missing", missing, chunk_path(store, missing), ("ck-a",)),
                   ("truncated", truncated, chunk_path(store, truncated), ("ck-a",)),
                   ("corrupt", corrupt, chunk_path(store, corrupt), ("ck-a", "ck-b"))}


def test_quick_checks_sizes_without_hashing(store):
    results = commit_checkpoint(store, "ck", [chunk_bytes(i) for i in (6, 7, 8)])
    missing, truncated, corrupt = damage(store, results)
    report = verify_store(store, quick=True)
    assert {p.kind for p in report.problems} == {"missing", "truncated"}  # corrupt: same size
    assert report.bytes_hashed == 0


def test_all_chunks_also_checks_files_no_checkpoint_references(store):
    commit_checkpoint(store, "ck", [chunk_bytes(9)])
    loose = store.put(chunk_bytes(10)).chunk_id
    with open(chunk_path(store, loose), "r+b") as f:
        f.write(b"\0")
    assert verify_store(store).ok
    (problem,) = verify_store(store, all_chunks=True).problems
    assert (problem.kind, problem.chunk, problem.refs) == ("corrupt", loose, [])


def test_an_unreadable_ref_is_a_problem_naming_it(store):
    commit_checkpoint(store, "ck", [chunk_bytes(11)])
    with open(os.path.join(store.path, "refs", "ck"), "w") as f:
        f.write("{}")
    (problem,) = verify_store(store).problems
    assert problem.kind == "ref" and problem.refs == ["ck"] and problem.path.endswith("refs/ck")
    assert problem.as_dict()["kind"] == "ref"
