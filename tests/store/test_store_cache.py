"""The node cache (FORMAT.md section 9); prefetch on its own: test_store_prefetch.py."""
import os

import pytest

from criu_gpushare.errors import StoreError
from criu_gpushare.store import NodeCache, Source, open_from_settings, prefetch

from store_helpers import age, chunk_bytes, chunk_path, commit_checkpoint


def cached_path(cache, cid):
    return os.path.join(cache.path, "chunks", cid[:2], cid)


def test_a_miss_reads_the_store_and_does_not_fill_the_cache(store, cache):
    cid = store.put(chunk_bytes(1)).chunk_id
    store.cache = cache
    out = bytearray(4096)
    assert store.get(cid, out, verify=True) is Source.STORE
    assert out == chunk_bytes(1) and not cache.contains(cid)
    store.cache = None


def test_prefetch_fills_the_cache_and_a_hit_refreshes_its_lru_time(store, cache):
    results = commit_checkpoint(store, "ck", [chunk_bytes(2), chunk_bytes(3), bytes(4096)])
    report = prefetch(store, cache)
    assert (report.fetched, report.already_cached, report.failed) == (2, 0, [])
    cid = results[0].chunk_id
    os.unlink(chunk_path(store, cid))  # proves the bytes come from the cache
    age(cached_path(cache, cid), 3600)
    before = os.stat(cached_path(cache, cid)).st_mtime
    store.cache = cache
    out = bytearray(4096)
    assert store.get(cid, out, verify=True) is Source.CACHE and out == chunk_bytes(2)
    assert os.stat(cached_path(cache, cid)).st_mtime > before + 1800
    store.cache = None
    assert prefetch(store, cache, ["ck"], threads=2).already_cached == 2


def test_a_damaged_cache_entry_is_dropped_and_the_store_is_read(store, cache):
    cid = commit_checkpoint(store, "ck", [chunk_bytes(5)])[0].chunk_id
    prefetch(store, cache)
    with open(cached_path(cache, cid), "r+b") as f:
        f.write(b"\xde\xad")
    store.cache = cache
    out = bytearray(4096)
    assert store.get(cid, out, verify=True) is Source.STORE and out == chunk_bytes(5)
    assert not cache.contains(cid)
    store.cache = None


def test_the_cache_read_path_verifies_by_default(store, cache):
    """A cached copy damaged without a size change is caught by a plain get (verify is the
    default) and the store is read instead."""
    cid = commit_checkpoint(store, "ck", [chunk_bytes(6)])[0].chunk_id
    prefetch(store, cache)
    with open(cached_path(cache, cid), "r+b") as f:
        f.write(b"\xde\xad")
    store.cache = cache
    out = bytearray(4096)
    assert store.get(cid, out) is Source.STORE and out == chunk_bytes(6)
    assert not cache.contains(cid)
    store.cache = None


def test_eviction_removes_least_recently_used_first(cache, store):
    ids = []
    for i in range(4):
        data = chunk_bytes(10 + i)
        ids.append(store.put(data).chunk_id)
        cache.insert(ids[-1], memoryview(data))
        age(cached_path(cache, ids[-1]), 1000 - 100 * i)  # ids[0] is the oldest
    removed, freed = cache.evict(2 * 4096)
    assert (removed, freed) == (2, 8192)
    assert [cache.contains(c) for c in ids] == [False, False, True, True]


def test_cache_dir_ownership_rules_apply(tmp_path):
    d = tmp_path / "c"
    d.mkdir(mode=0o777)
    os.chmod(d, 0o777)
    with pytest.raises(StoreError, match=f"{d}: writable by group or others"):
        NodeCache.open(str(d))


def test_a_store_opened_from_settings_reads_through_the_configured_cache(store, tmp_path):
    from criu_gpushare.config import load_settings
    from criu_gpushare.store import Store
    cid = commit_checkpoint(store, "ck", [chunk_bytes(30)])[0].chunk_id
    settings = load_settings({"store": store.path, "cache": str(tmp_path / "c")},
                             environ={"CRIU_GPUSHARE_CONFIG": os.devnull})
    with open_from_settings(settings, use_cache=True) as st:
        prefetch(st, st.cache)
        assert st.get(cid, bytearray(4096), verify=True) is Source.CACHE
    with open_from_settings(settings) as st:  # a dump: no cache
        assert st.cache is None and st.get(cid, bytearray(4096)) is Source.STORE
