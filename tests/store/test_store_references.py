"""criu_gpushare/store/references.py: the walk from refs to manifests to chunks that verify, du and
prefetch start from.

What they rely on: every chunk a checkpoint needs is listed once, with its length and every
checkpoint that uses it; zero chunks are counted but never listed; a ref that cannot be read is
reported (or raised, when asked for strictly) without hiding the others."""
import os

import pytest

from criu_gpushare.errors import StoreError
from criu_gpushare.store.references import walk_refs

from store_helpers import chunk_bytes, commit_checkpoint


@pytest.fixture
def two(store):
    a = commit_checkpoint(store, "ck-a", [chunk_bytes(1), chunk_bytes(2), bytes(4096)])
    b = commit_checkpoint(store, "ck-b", [chunk_bytes(2), chunk_bytes(3), chunk_bytes(3)])
    return store, [r.chunk_id for r in a], [r.chunk_id for r in b]


def test_every_chunk_once_with_its_users_in_first_use_order(two):
    store, a, b = two
    walked = walk_refs(store)
    assert walked.refs == ["ck-a", "ck-b"] and len(walked.manifests) == 2
    assert list(walked.chunks) == [a[0], a[1], b[1]]
    assert walked.chunks[a[1]] == (4096, ["ck-a", "ck-b"])
    assert walked.chunks[b[1]] == (4096, ["ck-b"])
    assert walked.logical_bytes == 6 * 4096 and walked.zero_bytes == 4096
    assert walked.unique_bytes == 3 * 4096
    assert walked.problems == []


def test_only_the_named_refs(two):
    store, a, b = two
    walked = walk_refs(store, ["ck-b"])
    assert walked.refs == ["ck-b"] and set(walked.chunks) == {b[0], b[1]}


def test_an_unreadable_ref_is_reported_and_the_others_walked(two):
    store, a, b = two
    with open(os.path.join(store.path, "refs", "ck-a"), "w") as f:
        f.write("garbage")
    walked = walk_refs(store)
    assert walked.refs == ["ck-b"]
    ((name, err),) = walked.problems
    assert name == "ck-a" and "refs/ck-a: bad ref" in str(err)
    with pytest.raises(StoreError, match="refs/ck-a: bad ref"):
        walk_refs(store, strict=True)


def test_a_named_ref_that_is_missing_is_a_problem_unless_strict(two):
    store, _, _ = two
    walked = walk_refs(store, ["ck-a", "gone"])
    assert walked.refs == ["ck-a"] and [n for n, _ in walked.problems] == ["gone"]
    with pytest.raises(StoreError, match="refs/gone: no such checkpoint"):
        walk_refs(store, ["gone"], strict=True)


def test_a_ref_whose_manifest_is_gone_is_a_problem(two):
    store, _, _ = two
    mid = store.read_ref("ck-b").manifest
    os.unlink(os.path.join(store.path, "manifests", f"{mid}.json"))
    walked = walk_refs(store)
    assert walked.refs == ["ck-a"]
    assert "manifest missing" in str(walked.problems[0][1])
