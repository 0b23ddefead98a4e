"""criu_gpushare/engine/dump.py on its own, on trees without CUDA (no workload, no CRIU): what a
dump leaves in the image and the state directory, the post-dump check, and what happens to the
dump's ref once CRIU exits. Dumps of GPU trees under CRIU are tests/hook/test_gpu_dump.py."""
import os
import random
import subprocess
import time

import pytest

from criu_gpushare.engine import dump, journal as jn, record, statedir
from criu_gpushare.engine.steps import Options
from criu_gpushare.errors import StoreError
from criu_gpushare.shimctl import processes
from criu_gpushare.store import Allocation, Manifest, ProcessEntry, Store


@pytest.fixture
def tree():
    """A parent shell and its sleeping child: a tree without libcuda."""
    p = subprocess.Popen(["sh", "-c", "sleep 60 & wait"])
    yield p
    p.kill()
    p.wait()


@pytest.fixture
def store_dir(tmp_path):
    path = str(tmp_path / "store")
    Store.open(path, create=True).close()
    return path


def dump_job(pid, images_dir, store_dir):
    """A DumpJob with the options engine/jobs.py gives a dump."""
    return dump.DumpJob(pid, images_dir, Options(store=store_dir, ref=f"dump-{pid}-test", hold_kind="dump"))


def commit_ref(store_dir, name):
    with Store.open(store_dir) as store, store.begin_write(name) as session:
        puts = [session.put(random.Random(1).randbytes(4096))]
        session.commit(name, Manifest([ProcessEntry(1, [Allocation.from_puts("a", puts)])]))


def test_a_tree_without_cuda_gets_a_record_saying_so_and_leaves_no_state(run_dir, tree, tmp_path,
                                                                          store_dir):
    assert processes.cuda_pids(tree.pid) == []
    images = tmp_path / "images"
    images.mkdir()
    job = dump_job(tree.pid, str(images), store_dir)
    assert job.begin() is False
    rec = record.read(str(images))
    assert rec["gpu_state"] is False and rec["processes"][0]["pid"] == tree.pid
    assert os.listdir(run_dir) == []  # the journal and every pid claim are gone
    with Store.open(store_dir) as store:
        assert store.list_refs() == []


def test_a_dump_that_cannot_write_its_record_leaves_nothing(run_dir, tree, tmp_path, store_dir):
    job = dump_job(tree.pid, str(tmp_path / "no-such-dir"), store_dir)
    with pytest.raises(OSError):
        job.begin()
    assert os.listdir(run_dir) == [] and jn.owner_of(tree.pid) is None


def test_post_dump_fails_when_the_checkpoint_is_not_in_the_store(run_dir, tree, tmp_path,
                                                                 store_dir):
    job = dump_job(tree.pid, str(tmp_path), store_dir)
    job.journal = jn.Journal.create("dump", job.pids, jn.DUMPED, store=store_dir, ref=job.ref)
    with pytest.raises(StoreError, match=f"refs/{job.ref}: no such checkpoint"):
        job.complete()
    assert job.completed is False
    commit_ref(store_dir, job.ref)
    job.complete()
    assert job.completed and job.journal.data["completed"] is True


@pytest.mark.parametrize("completed", [False, True])
def test_once_criu_killed_the_tree_only_a_completed_dump_keeps_its_ref(run_dir, tree, tmp_path,
                                                                       store_dir, completed):
    job = dump_job(tree.pid, str(tmp_path), store_dir)
    job.journal = jn.Journal.create("dump", job.pids, jn.DUMPED, store=store_dir, ref=job.ref)
    job.group = dump.Group(job.pids, job.options)
    commit_ref(store_dir, job.ref)
    job.completed = completed
    for pid in job.pids:  # CRIU's dump killed the tree
        os.kill(pid, 9)
    tree.wait()
    deadline = time.monotonic() + 10
    while any(statedir.start_time(p) for p in job.pids) and time.monotonic() < deadline:
        time.sleep(0.01)  # a killed process is dead once it is a zombie
    job.after_criu()
    with Store.open(store_dir) as store:
        assert store.list_refs() == ([job.ref] if completed else [])
    assert os.listdir(run_dir) == []


def test_post_dump_makes_the_image_durable_unless_the_store_sync_already_did(tmp_path, monkeypatch):
    """CRIU syncs none of its image files: post-dump syncs their file system too, once (not again
    where the store's sync covered it)."""
    synced = []
    monkeypatch.setattr(dump.fsutil, "syncfs", lambda fd, path: synced.append(path))
    images = str(tmp_path)
    dump.sync_image(images, skip_dev=os.stat(images).st_dev)
    assert synced == []
    dump.sync_image(images, skip_dev=None)
    assert synced == [images]


def test_post_dump_stops_sending_the_image_to_the_disk_before_it_syncs(run_dir, tree, tmp_path,
                                                                      store_dir, monkeypatch):
    """From begin() on CRIU's image goes to the disk as CRIU writes it (criu/images.py WriteBack);
    post-dump stops that first, then syncs the store and the image, so what it waits for is all
    that is left. A dump that ends without post-dump (CRIU failed) stops it too."""
    events = []

    class Recorder:
        def stop(self):
            events.append("writeback stopped")
    monkeypatch.setattr(dump.fsutil, "syncfs", lambda fd, path: events.append("synced"))
    job = dump_job(tree.pid, str(tmp_path), store_dir)
    job.journal = jn.Journal.create("dump", job.pids, jn.DUMPED, store=store_dir, ref=job.ref)
    job.group = dump.Group(job.pids, job.options)
    job.writeback = Recorder()
    commit_ref(store_dir, job.ref)
    events.clear()  # the commit's own syncs
    job.complete()
    assert events[0] == "writeback stopped" and "synced" in events[1:], events
    events.clear()
    job.after_criu(criu_succeeded=False)
    assert events == ["writeback stopped"]
