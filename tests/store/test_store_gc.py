"""Garbage collection (FORMAT.md sections 7 and 8): what goes, what stays, and why."""
import fcntl
import os

import pytest

from criu_gpushare.errors import BusyError, StoreError
from criu_gpushare.store import Store, collect_garbage

from store_helpers import age, age_store, chunk_bytes, chunk_path, commit_checkpoint

HOUR = 3600


def stored(store, seed, size=4096, age_s=2 * HOUR):
    """An unreferenced chunk written `age_s` ago."""
    cid = store.put(chunk_bytes(seed, size)).chunk_id
    age(chunk_path(store, cid), age_s)
    return cid


def test_unreferenced_chunks_go_after_the_grace_period_only(store):
    old, young = stored(store, 1), stored(store, 2, age_s=60)
    report = collect_garbage(store, grace_s=HOUR)
    assert (report.chunks_removed, report.chunks_kept_young) == (1, 1)
    assert not store.has_chunk(old) and store.has_chunk(young)


def test_referenced_chunks_stay_however_old(store):
    results = commit_checkpoint(store, "keep", [chunk_bytes(3), chunk_bytes(4)])
    for r in results:
        age(chunk_path(store, r.chunk_id), 100 * HOUR)
    report = collect_garbage(store, grace_s=0)
    assert report.chunks_kept == 2 and report.chunks_removed == 0
    assert all(store.has_chunk(r.chunk_id) for r in results)


def test_removing_a_ref_frees_its_chunks_and_manifest(store):
    results = commit_checkpoint(store, "gone", [chunk_bytes(5)])
    shared = commit_checkpoint(store, "other", [chunk_bytes(5), chunk_bytes(6)])
    store.remove_ref("gone")
    age_store(store.path)
    report = collect_garbage(store, grace_s=0)
    assert report.manifests_removed == 1 and report.chunks_removed == 0  # chunk 5 still shared
    store.remove_ref("other")
    report = collect_garbage(store, grace_s=0)
    assert report.chunks_removed == 2 and report.manifests_removed == 1
    assert not store.has_chunk(results[0].chunk_id) and not store.has_chunk(shared[1].chunk_id)
    assert os.listdir(os.path.join(store.path, "manifests")) == []


def test_a_live_session_keeps_what_it_deduplicated_and_wrote(store):
    reused, untouched = stored(store, 7), stored(store, 8)
    with store.begin_write("running") as session:
        assert session.put(chunk_bytes(7)).status.value == "present"  # dedup refreshes the mtime
        fresh = session.put(chunk_bytes(9)).chunk_id
        report = collect_garbage(store, grace_s=0)
        assert report.live_leases == 1
        assert store.has_chunk(reused) and store.has_chunk(fresh)
        assert not store.has_chunk(untouched)


def test_a_live_lease_lowers_the_cutoff_to_its_start(store):
    with store.begin_write("long dump") as session:
        cid = stored(store, 10, age_s=0)  # written during the session, by a writer without lease
        report = collect_garbage(store, grace_s=0)
        assert report.cutoff_ns <= session.started_ns
        assert store.has_chunk(cid)


def test_a_stale_lease_is_removed_and_protects_nothing(store):
    session = store.begin_write("crashed dump")
    lease = os.path.join(store.path, "leases", session.name)
    os.close(session._fd)  # the writer died: its flock is gone, its file stays
    session._fd = -1
    age(lease, 2 * HOUR)
    old = stored(store, 11)
    report = collect_garbage(store, grace_s=HOUR)
    assert report.stale_leases_removed == 1 and report.live_leases == 0
    assert not os.path.exists(lease) and not store.has_chunk(old)


def test_an_unlocked_lease_younger_than_grace_still_counts(store):
    # Another node's writer whose flock this node cannot see: its fresh mtime keeps it live.
    session = store.begin_write("remote dump")
    os.close(session._fd)
    session._fd = -1
    report = collect_garbage(store, grace_s=HOUR)
    assert report.live_leases == 1 and report.stale_leases_removed == 0


def test_a_chunk_touched_between_check_and_removal_is_put_back(store):
    cid = stored(store, 12)

    def writer_dedups_now(name):
        assert name == cid
        assert store.put(chunk_bytes(12)).status.value == "present"

    report = collect_garbage(store, grace_s=0, before_condemn=writer_dedups_now)
    assert report.restored_after_touch == 1 and report.chunks_removed == 0
    out = bytearray(4096)
    store.get(cid, out, verify=True)


def test_a_chunk_gone_when_the_writer_touches_it_is_written_again(store, monkeypatch):
    cid = stored(store, 13)
    real_touch = store.chunks.touch

    def gc_wins_the_race(name):
        os.unlink(chunk_path(store, name))  # gc renamed it away just before the touch
        return real_touch(name)

    monkeypatch.setattr(store.chunks, "touch", gc_wins_the_race)
    assert store.put(chunk_bytes(13)).status.value == "new"
    assert store.has_chunk(cid)


def test_files_left_by_an_interrupted_gc_are_put_back(store):
    cid = commit_checkpoint(store, "live", [chunk_bytes(14)])[0].chunk_id
    run = os.path.join(store.path, "gc", "run-crashed")
    os.makedirs(run)
    os.rename(chunk_path(store, cid), os.path.join(run, cid))
    collect_garbage(store, grace_s=0)
    assert store.has_chunk(cid) and os.listdir(os.path.join(store.path, "gc")) == []


def test_gc_stops_before_removing_anything_when_a_manifest_is_unreadable(store):
    old = stored(store, 15)
    commit_checkpoint(store, "broken", [chunk_bytes(16)])
    mid = store.read_ref("broken").manifest
    os.unlink(os.path.join(store.path, "manifests", mid + ".json"))
    with pytest.raises(StoreError, match=f"gc stopped before removing anything: .*{mid}.json: "
                                         f"manifest missing.*store rm broken"):
        collect_garbage(store, grace_s=0)
    assert store.has_chunk(old)


def test_only_one_gc_at_a_time(store):
    fd = os.open(os.path.join(store.path, "gc.lock"), os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        with pytest.raises(BusyError, match="gc.lock: another gc of this store is running"):
            collect_garbage(store)
    finally:
        os.close(fd)


def test_dry_run_removes_nothing(store):
    old = stored(store, 17)
    report = collect_garbage(store, grace_s=0, dry_run=True)
    assert report.chunks_removed == 1 and store.has_chunk(old)


def test_old_temp_files_go_young_ones_stay(store):
    cid = store.put(chunk_bytes(18)).chunk_id
    fan = os.path.dirname(chunk_path(store, cid))
    old_tmp, young_tmp = (os.path.join(fan, f".{cid}.{n:016x}.tmp") for n in (1, 2))
    for p in (old_tmp, young_tmp):
        open(p, "wb").close()
    age(old_tmp, 2 * HOUR)
    assert collect_garbage(store, grace_s=HOUR).temps_removed == 1
    assert not os.path.exists(old_tmp) and os.path.exists(young_tmp)


def test_fanout_dirs_and_foreign_entries_are_left_alone(store, tmp_path):
    cid = stored(store, 19)
    fan = os.path.dirname(chunk_path(store, cid))
    target = tmp_path / "target"
    target.write_bytes(b"keep me")
    link = os.path.join(fan, "ab" * 16 if cid[:2] == "ab" else cid[:2] + "0" * 30)
    os.symlink(target, link)
    foreign = [os.path.join(fan, "notes.txt"), os.path.join(store.path, "manifests", "x.txt")]
    os.makedirs(os.path.dirname(foreign[1]), exist_ok=True)
    for p in foreign:
        open(p, "w").close()
        age(p, 7200)
    report = collect_garbage(store, grace_s=0)
    assert report.ignored == [link] and os.path.islink(link) and target.read_bytes() == b"keep me"
    assert os.path.isdir(fan) and all(os.path.exists(p) for p in foreign)


def test_a_read_only_open_of_an_empty_new_store_has_nothing_to_collect(store_dir):
    Store.open(store_dir, create=True).close()
    with Store.open(store_dir) as st:
        assert collect_garbage(st, grace_s=0).chunks_removed == 0
