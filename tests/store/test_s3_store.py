"""An s3:// chunk store against a real S3-compatible server on 127.0.0.1 (tests/s3server.py): puts
and gets, two dumps at once, gc during a dump, an upload killed half-way, damaged and missing
objects, a missing bucket, bad credentials, the server stopped part-way, two nodes restoring one
checkpoint through their own caches (store/FORMAT.md section 14)."""
import os
import subprocess
import sys
import threading
import time

import pytest

from criu_gpushare.errors import BusyError, StoreError
from criu_gpushare.store import (Allocation, ChunkDamaged, ChunkMissing, Manifest, NodeCache,
                                 ProcessEntry, PutStatus, Source, chunk_id, open_store, prefetch,
                                 verify_store)
from criu_gpushare.store import s3client, s3gc
from criu_gpushare.store.s3store import S3Store, chunk_key

from store_helpers import chunk_bytes

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def s3(s3_env, s3_store_url):
    store = open_store(s3_store_url, create=True)
    yield store
    store.close()


def commit(store, name, datas, pid=100):
    with store.begin_write(name) as session:
        results = [session.put(d) for d in datas]
        session.commit(name, Manifest([ProcessEntry(pid, [Allocation.from_puts("a0", results)])]))
    return results


def read_all(store, name):
    m = store.read_manifest(store.read_ref(name).manifest)
    out = []
    for c in m.processes[0].allocations[0].chunks:
        buf = bytearray(c.length)
        if c.id is not None:
            store.get(c.id, buf)
        out.append(bytes(buf))
    return out


def next_second():
    """Object times have 1 s resolution and gc keeps what is as young as its own "now": a gc
    with grace 0 sees what was written before this as old."""
    time.sleep(1.1)


def raw(server):
    return server.client()


def bucket_of(url):
    return s3client.parse_url(url)


# -- put and get --------------------------------------------------------------------------------

def test_put_get_dedup_and_zero_chunks(s3):
    data = chunk_bytes(1, 100_000)
    r1, r2, rz = s3.put(data), s3.put(data), s3.put(bytes(5000))
    assert (r1.status, r2.status, rz.status) == (PutStatus.NEW, PutStatus.PRESENT, PutStatus.ZERO)
    assert r1.chunk_id == chunk_id(data) and rz.chunk_id is None
    buf = bytearray(len(data))
    assert s3.get(r1.chunk_id, buf) is Source.STORE and bytes(buf) == data
    assert [f.name for f in s3.scan_chunks()] == [r1.chunk_id]


def test_a_large_chunk_moves_in_parallel_parts(s3, monkeypatch):
    monkeypatch.setattr(s3client, "MULTIPART_THRESHOLD", 6 << 20)
    monkeypatch.setattr(s3client, "PART_SIZE", 5 << 20)
    data = chunk_bytes(2, (11 << 20) + 12345)
    r = s3.put(data)
    buf = bytearray(len(data))
    s3.get(r.chunk_id, buf)
    assert bytes(buf) == data


def test_a_checkpoint_round_trips_and_every_store_verb_sees_it(s3):
    datas = [chunk_bytes(i, 70_000) for i in range(3)] + [bytes(70_000)]
    commit(s3, "ck1", datas)
    assert s3.list_refs() == ["ck1"]
    assert read_all(s3, "ck1") == datas
    report = verify_store(s3)
    assert report.ok and report.chunks_checked == 3
    assert s3.check_chunks(s3.read_manifest(s3.read_ref("ck1").manifest)) == []


# -- damaged and missing objects -----------------------------------------------------------------

def test_a_corrupted_or_truncated_or_missing_object_is_named(s3, s3_server, s3_store_url):
    datas = [chunk_bytes(i, 50_000) for i in range(3)]
    results = commit(s3, "ck", datas)
    bucket, prefix = bucket_of(s3_store_url)
    c = raw(s3_server)
    bad, short, gone = (r.chunk_id for r in results)
    c.put_object(Bucket=bucket, Key=f"{prefix}/{chunk_key(bad)}", Body=b"\1" * 50_000)
    c.put_object(Bucket=bucket, Key=f"{prefix}/{chunk_key(short)}", Body=datas[1][:100])
    c.delete_object(Bucket=bucket, Key=f"{prefix}/{chunk_key(gone)}")
    with pytest.raises(ChunkDamaged, match=f"{bad} is corrupted"):
        s3.get(bad, bytearray(50_000))
    with pytest.raises(ChunkDamaged, match="100 bytes, expected 50000"):
        s3.get(short, bytearray(50_000))
    with pytest.raises(ChunkMissing, match=f"{s3_store_url}/chunks/{gone[:2]}/{gone}: chunk"):
        s3.get(gone, bytearray(50_000))
    kinds = {p.chunk: p.kind for p in verify_store(s3).problems}
    assert kinds == {bad: "corrupt", short: "truncated", gone: "missing"}
    assert {p.kind for p in s3.check_chunks(s3.read_manifest(s3.read_ref("ck").manifest))} == \
        {"truncated", "missing"}
    # the next dump of the same bytes rewrites the missing and the short one (a damaged object
    # of the right size is found only by reading it, as in a directory store)
    commit(s3, "ck2", datas)
    assert [(p.chunk, p.kind) for p in verify_store(s3, ["ck"]).problems] == [(bad, "corrupt")]


def test_a_missing_bucket_and_bad_credentials_are_clear_errors(s3_env, s3_server, monkeypatch):
    with pytest.raises(StoreError, match="no such bucket nosuchbucket-here"):
        open_store("s3://nosuchbucket-here/x", create=True)
    bucket = s3_server.new_bucket("creds-test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret-value")
    with pytest.raises(StoreError, match="access denied") as e:
        open_store(f"s3://{bucket}/x", create=True)
    assert "wrong-secret-value" not in str(e.value)
    with pytest.raises(StoreError, match="not an S3 bucket name"):
        open_store("s3://Bad_Bucket/x")


def test_a_prefix_without_a_store_is_not_read_as_one(s3_env, s3_server):
    bucket = s3_server.new_bucket("not-a-store")
    s3_server.client().put_object(Bucket=bucket, Key="p/other", Body=b"x")
    with pytest.raises(StoreError, match="not a criu-gpushare store"):
        open_store(f"s3://{bucket}/p")
    with pytest.raises(StoreError, match="not empty and not a criu-gpushare store"):
        open_store(f"s3://{bucket}/p", create=True)


# -- concurrency: two dumps, gc during a dump ------------------------------------------------------

def test_a_first_dump_that_finds_the_store_made_meanwhile_uses_it(s3_env, s3_store_url, monkeypatch):
    """Two first dumps at once: one looks for the store file, finds none, and by the time it lists
    the prefix the other has made the store and written into it. It uses that store (a prefix
    holding something else is still refused: test_a_prefix_without_a_store_is_not_read_as_one)."""
    real = S3Store._store_file
    looks = []

    def the_other_dump_comes_first(self):
        looks.append(1)
        if len(looks) == 1:
            with open_store(s3_store_url, create=True) as other:
                commit(other, "other", [chunk_bytes(1, 60_000)])
            return None  # what this dump saw before the other one wrote
        return real(self)
    monkeypatch.setattr(S3Store, "_store_file", the_other_dump_comes_first)
    with open_store(s3_store_url, create=True) as st:
        commit(st, "mine", [chunk_bytes(2, 60_000)])
    monkeypatch.setattr(S3Store, "_store_file", real)
    with open_store(s3_store_url) as st:
        assert st.list_refs() == ["mine", "other"]


def test_two_dumps_at_once_share_chunks(s3_env, s3_store_url):
    shared = [chunk_bytes(i, 60_000) for i in range(6)]
    errors = []

    def dump(name, extra):
        try:
            with open_store(s3_store_url, create=True) as st:
                commit(st, name, shared + [chunk_bytes(extra, 60_000)])
        except BaseException as e:  # reported below
            errors.append(e)
    threads = [threading.Thread(target=dump, args=(f"ck{i}", 100 + i)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    with open_store(s3_store_url) as st:
        assert st.list_refs() == ["ck0", "ck1"]
        assert read_all(st, "ck0")[:6] == shared == read_all(st, "ck1")[:6]
        assert len(list(st.scan_chunks())) == 8


def test_gc_removes_only_what_nothing_needs(s3, s3_server, s3_store_url):
    keep = [chunk_bytes(i, 40_000) for i in range(2)]
    commit(s3, "keep", keep)
    commit(s3, "drop", [chunk_bytes(9, 40_000)])
    s3.remove_ref("drop")
    r = s3.collect_garbage(grace_s=3600)
    assert r.chunks_removed == 0 and r.chunks_kept_young == 1  # in the grace period
    next_second()
    r = s3.collect_garbage(grace_s=0)
    assert (r.chunks_removed, r.manifests_removed, r.refs) == (1, 1, 1)
    assert read_all(s3, "keep") == keep
    assert list(s3_server.client().list_objects_v2(
        Bucket=bucket_of(s3_store_url)[0], Prefix=bucket_of(s3_store_url)[1] + "/gc/")
        .get("Contents", [])) == []  # its marker is gone


def test_gc_during_a_dump_keeps_what_the_dump_deduplicated(s3):
    """An old unreferenced chunk that a running dump found present is claimed: gc keeps it."""
    old = chunk_bytes(5, 40_000)
    commit(s3, "old", [old])
    s3.remove_ref("old")
    next_second()
    with s3.begin_write("new") as session:
        r = session.put(old)
        assert r.status is PutStatus.PRESENT
        fresh = session.put(chunk_bytes(6, 40_000))
        report = s3.collect_garbage(grace_s=0)  # the dump runs on
        assert report.live_leases == 1 and report.chunks_removed == 0
        session.commit("new", Manifest([ProcessEntry(1, [Allocation.from_puts("a", [r, fresh])])]))
    assert read_all(s3, "new") == [old, chunk_bytes(6, 40_000)]
    # the lease is gone with the session: a later gc keeps the chunks for the ref alone
    assert s3.collect_garbage(grace_s=0).chunks_kept == 2


def test_a_commit_after_a_gc_removed_a_deduplicated_chunk_fails_and_commits_nothing(s3,
                                                                                   monkeypatch):
    """The other order: gc read the leases before the claim; the commit sees the chunk gone."""
    old = chunk_bytes(7, 40_000)
    commit(s3, "old", [old])
    s3.remove_ref("old")
    next_second()
    real = s3gc.read_leases
    monkeypatch.setattr(s3gc, "read_leases", lambda store, now, read_claims=True: [])
    with s3.begin_write("new") as session:
        r = session.put(old)
        assert r.status is PutStatus.PRESENT
        assert s3.collect_garbage(grace_s=0).chunks_removed == 1  # did not see the claim
        monkeypatch.setattr(s3gc, "read_leases", real)
        with pytest.raises(StoreError, match="removed by a gc that ran meanwhile; nothing was "
                                             "committed"):
            session.commit("new", Manifest([ProcessEntry(1, [Allocation.from_puts("a", [r])])]))
    assert s3.list_refs() == []


def test_a_commit_waits_for_a_running_gc(s3, monkeypatch):
    monkeypatch.setattr(s3gc, "POLL_S", 0.05)
    s3.client.put("gc/run-someone-else", b"{}")
    with s3.begin_write("w") as session:
        r = session.put(chunk_bytes(8, 1000))
        done = threading.Event()
        t = threading.Thread(target=lambda: (session.commit(
            "w", Manifest([ProcessEntry(1, [Allocation.from_puts("a", [r])])])), done.set()))
        t.start()
        assert not done.wait(1.0)  # the marker is live: the commit waits
        with pytest.raises(BusyError, match="another gc"):
            s3.collect_garbage(grace_s=0)
        s3.client.delete(["gc/run-someone-else"])
        t.join(10)
        assert done.is_set()
    assert s3.list_refs() == ["w"]


def test_an_upload_killed_half_way_leaves_no_chunk_and_gc_aborts_it(s3, s3_server, s3_store_url):
    """A writer SIGKILLed between the parts of a multipart upload: the chunk never appears, a
    later put writes it whole, and gc aborts the upload left behind."""
    code = f"""
import os, signal, sys
from criu_gpushare.store import open_store, s3client
s3client.MULTIPART_THRESHOLD, s3client.PART_SIZE = 6 << 20, 5 << 20
st = open_store({s3_store_url!r})
real = st.client.client.upload_part
calls = []
def upload_part(**kw):
    calls.append(1)
    if len(calls) == 3:
        os.kill(os.getpid(), signal.SIGKILL)
    return real(**kw)
st.client.client.upload_part = upload_part
st.client.pool._max_workers = 1
st.put(bytes(range(256)) * 65536)
"""
    r = subprocess.run([sys.executable, "-c", code], env=s3_server.env(), capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == -9, r.stderr
    data = bytes(range(256)) * 65536
    assert list(s3.scan_chunks()) == []
    assert len(list(s3.client.multipart_uploads())) == 1
    next_second()
    assert s3.collect_garbage(grace_s=0).temps_removed == 1
    assert list(s3.client.multipart_uploads()) == []
    assert s3.put(data).status is PutStatus.NEW


# -- the server gone, the cache in front, two nodes ------------------------------------------------

def test_the_server_stopped_mid_read_is_a_clear_error_and_a_retry_works(s3, s3_server):
    datas = [chunk_bytes(i, 30_000) for i in range(4)]
    commit(s3, "ck", datas)
    s3_server.stop()
    try:
        with pytest.raises(StoreError, match="cannot reach the S3 server .* retry once it is back"):
            read_all(s3, "ck")
    finally:
        s3_server.start()
    assert read_all(s3, "ck") == datas


def test_two_nodes_restore_one_checkpoint_through_their_own_caches(s3_env, s3_store_url,
                                                                    tmp_path):
    datas = [chunk_bytes(i, 80_000) for i in range(5)]
    with open_store(s3_store_url, create=True) as st:
        commit(st, "ck", datas)
    for node in ("a", "b"):
        cache = NodeCache.open(str(tmp_path / f"cache-{node}"), limit_bytes=3 * 80_000)
        with S3Store.open(s3_store_url, cache=cache) as st:
            r = prefetch(st, cache, ["ck"])
            assert (r.fetched, r.skipped_for_limit, r.failed) == (3, 2, [])
            m = st.read_manifest(st.read_ref("ck").manifest)
            sources = [st.get(c.id, bytearray(c.length))
                       for c in m.processes[0].allocations[0].chunks]
            assert sorted(s.value for s in sources) == ["cache"] * 3 + ["store"] * 2
            assert read_all(st, "ck") == datas
