"""Holds (FORMAT.md "Holds"): a live suspension or dump keeps its checkpoint from `store rm` and
gc; a stale hold (its holder gone) protects nothing and gc removes it."""
import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from criu_gpushare.cli import main
from criu_gpushare.errors import StoreError
from criu_gpushare.store import RefHeld, collect_garbage
from criu_gpushare.store import holds as holds_mod

from store_helpers import age_store, chunk_bytes, chunk_path, commit_checkpoint


def dead_pid():
    """A pid that existed and is gone (its start time no longer matches anything)."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def hold_files(store, ref):
    d = os.path.join(store.path, "holds", ref)
    return sorted(n for n in os.listdir(d) if n.endswith(".hold")) if os.path.isdir(d) else []


def test_a_hold_is_a_durable_file_naming_its_holder(store, sleeper):
    commit_checkpoint(store, "ck", [chunk_bytes(1)])
    h = store.hold("ck", "suspension", pid=sleeper.pid)
    assert os.path.dirname(h.path) == os.path.join(store.path, "holds", "ck")
    doc = json.load(open(h.path))
    start = int(open(f"/proc/{sleeper.pid}/stat").read().rsplit(")", 1)[1].split()[19])
    assert (doc["format"], doc["kind"], doc["pid"], doc["starttime"]) == (
        "criu-gpushare-hold", "suspension", sleeper.pid, start)
    assert doc["host"] and doc["created"] and doc["manifest"] == store.read_ref("ck").manifest
    [info] = store.holds("ck")
    assert (info.alive, info.kind, info.pid) == (True, "suspension", sleeper.pid)
    h.release()
    h.release()  # idempotent
    assert store.holds("ck") == []


def test_rm_refuses_a_live_hold_naming_the_holder(store):
    commit_checkpoint(store, "ck", [chunk_bytes(2)])
    with store.hold("ck", "dump"):
        with pytest.raises(RefHeld, match=f"checkpoint ck is held.*dump by pid {os.getpid()}"):
            store.remove_ref("ck")
        assert store.list_refs() == ["ck"]
    store.remove_ref("ck")  # released: removable
    assert store.list_refs() == []


def test_rm_then_gc_keeps_the_chunks_of_a_live_suspension(store, store_dir):
    """The issue: `store rm REF` then `store gc --grace 0` deleted a live suspension's chunks."""
    cid = commit_checkpoint(store, "ck", [chunk_bytes(3)])[0].chunk_id
    store.hold("ck", "suspension")
    age_store(store_dir)
    with pytest.raises(RefHeld):
        store.remove_ref("ck")
    report = collect_garbage(store, grace_s=0)
    assert report.chunks_removed == 0 and os.path.exists(chunk_path(store, cid))
    assert store.list_refs() == ["ck"]


def test_a_live_hold_keeps_its_manifest_even_without_the_ref(store, store_dir):
    """A ref deleted behind the tool's back (or replaced) still leaves the held data alone."""
    cid = commit_checkpoint(store, "ck", [chunk_bytes(4)])[0].chunk_id
    store.hold("ck", "suspension")
    os.unlink(os.path.join(store_dir, "refs", "ck"))
    age_store(store_dir)
    report = collect_garbage(store, grace_s=0)
    assert report.chunks_removed == 0 and os.path.exists(chunk_path(store, cid))


def test_force_removes_ref_and_holds_and_cli_warns(store, store_dir):
    commit_checkpoint(store, "ck", [chunk_bytes(5)])
    store.hold("ck", "suspension")
    runner = CliRunner()
    r = runner.invoke(main, ["store", "--store", store_dir, "rm", "ck"])
    assert r.exit_code == 6 and f"suspension by pid {os.getpid()}" in r.output + str(r.exception)
    r = runner.invoke(main, ["store", "--store", store_dir, "rm", "--force", "ck"])
    assert r.exit_code == 0, r.output
    assert f"warning: ck was held: suspension by pid {os.getpid()}" in r.output
    assert store.list_refs() == [] and hold_files(store, "ck") == []


def test_stale_holds_do_not_block_rm_and_gc_removes_them(store, monkeypatch):
    commit_checkpoint(store, "a", [chunk_bytes(6)])
    commit_checkpoint(store, "b", [chunk_bytes(7)])
    store.hold("a", "suspension", pid=os.getpid())
    store.hold("b", "dump")
    # the holders die: pid gone, or the pid reused by another process (other start time)
    for ref, fake in (("a", {"pid": dead_pid()}), ("b", {"starttime": 1})):
        [name] = hold_files(store, ref)
        path = os.path.join(store.path, "holds", ref, name)
        doc = json.load(open(path))
        doc.update(fake)
        open(path, "w").write(json.dumps(doc))
    [a] = store.holds("a")
    [b] = store.holds("b")
    assert not a.alive and "is gone" in a.why
    assert not b.alive and "another process" in b.why
    store.remove_ref("a")  # not blocked; the ref's stale hold goes with it
    assert hold_files(store, "a") == []
    report = collect_garbage(store, grace_s=3600)
    assert report.stale_holds_removed == 1  # b's; and a's empty directory
    assert hold_files(store, "b") == [] and not os.path.exists(os.path.join(store.path, "holds", "a"))
    assert store.list_refs() == ["b"]  # gc never removes a ref


def test_holds_from_another_host_or_pid_namespace_count_as_live(store):
    commit_checkpoint(store, "ck", [chunk_bytes(8)])
    h = store.hold("ck", "suspension")
    doc = json.load(open(h.path))
    for change, why in (({"host": "elsewhere", "pid": dead_pid()}, "another host"),
                        ({"pid_ns": "pid:[1]", "pid": dead_pid()}, "another pid namespace")):
        d = dict(doc, **change)
        open(h.path, "w").write(json.dumps(d))
        [info] = store.holds("ck")
        assert info.alive and why in info.why
        with pytest.raises(RefHeld):
            store.remove_ref("ck")


def test_an_unreadable_hold_counts_as_live(store):
    commit_checkpoint(store, "ck", [chunk_bytes(9)])
    h = store.hold("ck", "dump")
    open(h.path, "w").write("{not json")
    [info] = store.holds("ck")
    assert info.alive and "unreadable" in info.why
    collect_garbage(store, grace_s=0)
    assert os.path.exists(h.path)


def test_a_hold_may_come_before_its_ref_and_bad_input_is_refused(store):
    h = store.hold("later", "dump")  # a writer holds the name before it commits
    assert h.info.manifest is None and store.holds("later")[0].alive
    with pytest.raises(ValueError, match="hold kind"):
        store.hold("later", "nap")
    with pytest.raises(StoreError, match="bad checkpoint name"):
        store.hold("../x", "dump")
    with pytest.raises(StoreError, match="no such process"):
        store.hold("later", "dump", pid=dead_pid())


def test_a_store_without_holds_dir_has_no_holds(store):
    commit_checkpoint(store, "ck", [chunk_bytes(10)])
    assert not os.path.exists(os.path.join(store.path, "holds"))
    assert store.holds("ck") == [] and holds_mod.held_refs(store) == set()
    store.remove_ref("ck")


def test_ls_shows_held_refs(store, store_dir):
    commit_checkpoint(store, "ck", [chunk_bytes(11)])
    commit_checkpoint(store, "free", [chunk_bytes(12)])
    store.hold("ck", "suspension")
    r = CliRunner().invoke(main, ["store", "--store", store_dir, "ls", "--json"])
    assert r.exit_code == 0, r.output
    rows = {c["name"]: c for c in json.loads(r.output)["checkpoints"]}
    assert rows["ck"]["held_by"] == [f"suspension by pid {os.getpid()} on {os.uname().nodename}"]
    assert rows["free"]["held_by"] == []
    r = CliRunner().invoke(main, ["store", "--store", store_dir, "ls"])
    assert "HELD" in r.output and f"suspension (pid {os.getpid()})" in r.output
    r = CliRunner().invoke(main, ["store", "--store", store_dir, "du", "--json"])
    assert json.loads(r.output)["held_refs"] == 1
