"""criu_gpushare/store/prefetch.py: a checkpoint's chunks copied into the node cache ahead of a
restore (FORMAT.md section 9).

What an operator relies on: every chunk of the named checkpoints (all by default) is in the cache
afterwards, or named in the report with why not; only chunks whose bytes match their name enter;
the cache stays under its limit; the store is only read."""
import os

import pytest

from criu_gpushare.errors import StoreError
from criu_gpushare.store import NodeCache, prefetch

from store_helpers import chunk_bytes, chunk_path, commit_checkpoint


def test_prefetch_refuses_to_cache_a_corrupted_store_chunk(store, cache):
    cid = commit_checkpoint(store, "ck", [chunk_bytes(4)])[0].chunk_id
    with open(chunk_path(store, cid), "r+b") as f:
        f.write(b"\x00\x01\x02")
    report = prefetch(store, cache)
    assert report.fetched == 0 and len(report.failed) == 1
    assert chunk_path(store, cid) in report.failed[0] and "corrupted" in report.failed[0]
    assert not cache.contains(cid)



def test_prefetch_keeps_the_cache_under_its_limit(store, tmp_path):
    commit_checkpoint(store, "old", [chunk_bytes(20), chunk_bytes(21)])
    commit_checkpoint(store, "new", [chunk_bytes(22), chunk_bytes(23), chunk_bytes(24)])
    with NodeCache.open(str(tmp_path / "c"), limit_bytes=3 * 4096) as cache:
        prefetch(store, cache, ["old"])
        report = prefetch(store, cache, ["new"])
        assert report.evicted == 2 and report.fetched == 3
        assert cache.usage() == (3, 3 * 4096)
        report = prefetch(store, cache)  # all five cannot fit: some are skipped, none fail
        assert report.skipped_for_limit == 2 and report.failed == []
        assert cache.usage()[1] <= 3 * 4096


def test_only_the_named_checkpoints_are_fetched_and_counted(store, cache):
    a = commit_checkpoint(store, "ck-a", [chunk_bytes(1), chunk_bytes(2), bytes(4096)])
    b = commit_checkpoint(store, "ck-b", [chunk_bytes(2), chunk_bytes(3)])
    report = prefetch(store, cache, ["ck-b"])
    assert (report.refs, report.chunks, report.fetched, report.bytes_fetched) == (1, 2, 2, 8192)
    assert [cache.contains(r.chunk_id) for r in b] == [True, True]
    assert not cache.contains(a[0].chunk_id)
    report = prefetch(store, cache)  # every ref; what is there is not fetched again
    assert (report.refs, report.chunks, report.already_cached, report.fetched) == (2, 3, 2, 1)


def test_a_missing_chunk_is_named_and_the_others_still_come(store, cache):
    results = commit_checkpoint(store, "ck", [chunk_bytes(5), chunk_bytes(6)])
    os.unlink(chunk_path(store, results[0].chunk_id))
    report = prefetch(store, cache)
    assert report.fetched == 1 and cache.contains(results[1].chunk_id)
    assert len(report.failed) == 1 and results[0].chunk_id in report.failed[0]


def test_a_checkpoint_that_does_not_exist_is_an_error_naming_it(store, cache):
    commit_checkpoint(store, "ck", [chunk_bytes(7)])
    with pytest.raises(StoreError, match="refs/nope: no such checkpoint"):
        prefetch(store, cache, ["ck", "nope"])
    assert cache.usage() == (0, 0)  # refused before anything is copied


def test_the_store_is_only_read(store, cache):
    results = commit_checkpoint(store, "ck", [chunk_bytes(8)])
    path = chunk_path(store, results[0].chunk_id)
    os.utime(path, (1000, 1000))
    prefetch(store, cache)
    assert os.stat(path).st_mtime == 1000  # a prefetch does not keep chunks from gc
