"""Write ordering and what a failed write leaves behind (FORMAT.md sections 1, 3, 4 and 7)."""
import errno
import fcntl
import json
import os
import stat

import pytest

from criu_gpushare.errors import StoreError
from criu_gpushare.store import Store, fsutil, layout

from store_helpers import chunk_bytes, chunk_path, commit_checkpoint


def test_chunk_data_is_synced_before_it_gets_its_name(store, monkeypatch):
    events = []
    for name in ("fdatasync", "link", "rename"):
        real = getattr(os, name)
        monkeypatch.setattr(os, name, lambda *a, _n=name, _r=real, **k: (events.append(_n),
                                                                         _r(*a, **k))[1])
    store.put(chunk_bytes(1))
    assert events == ["fdatasync", "link"]


def test_a_chunk_published_by_another_writer_meanwhile_is_kept(store, monkeypatch):
    data = chunk_bytes(7)
    path = chunk_path(store, layout.chunk_id(data))
    real_sync = os.fdatasync

    def other_writer_wins(fd):
        real_sync(fd)
        with open(path, "wb") as f:  # another process published the same chunk first
            f.write(data)
    monkeypatch.setattr(os, "fdatasync", other_writer_wins)
    result = store.put(data)
    assert result.status.value == "present"
    inode = os.stat(path).st_ino
    assert os.listdir(os.path.dirname(path)) == [os.path.basename(path)]
    monkeypatch.undo()
    assert store.put(data).status.value == "present" and os.stat(path).st_ino == inode


def test_one_chunk_put_by_many_threads_at_once_is_written_once(store):
    import threading
    data = chunk_bytes(8, 1 << 20)
    barrier = threading.Barrier(8)
    results = []

    def put():
        barrier.wait()
        results.append(store.put(data).status.value)
    threads = [threading.Thread(target=put) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == ["new"] + ["present"] * 7


def test_an_io_error_mid_chunk_removes_the_temp_file_and_names_the_chunk(store, monkeypatch):
    def failing_write(fd, data):
        raise OSError(errno.EIO, "Input/output error")
    monkeypatch.setattr(fsutil.os, "write", failing_write)
    data = chunk_bytes(2)
    path = chunk_path(store, layout.chunk_id(data))
    with pytest.raises(StoreError, match=f"{path}: write failed: Input/output error"):
        store.put(data)
    assert os.listdir(os.path.dirname(path)) == []


def test_an_interrupt_mid_chunk_removes_the_temp_file(store, monkeypatch):
    def interrupted(fd, data):
        raise KeyboardInterrupt
    monkeypatch.setattr(fsutil.os, "write", interrupted)
    data = chunk_bytes(3)
    with pytest.raises(KeyboardInterrupt):
        store.put(data)
    assert os.listdir(os.path.dirname(chunk_path(store, layout.chunk_id(data)))) == []


def test_nothing_in_a_store_is_writable_by_group_or_others_even_under_umask_0(store_dir):
    old = os.umask(0)
    try:
        with Store.open(store_dir, create=True) as st:
            commit_checkpoint(st, "ck", [chunk_bytes(4)])
    finally:
        os.umask(old)
    for root, dirs, files in os.walk(store_dir):
        for name in [root] + [os.path.join(root, f) for f in files]:
            mode = stat.S_IMODE(os.lstat(name).st_mode)
            assert mode & 0o022 == 0, f"{name} has mode {mode:04o}"


def test_store_json_names_format_version_and_hash(store):
    with open(os.path.join(store.path, "store.json")) as f:
        assert json.load(f) == {"format": "criu-gpushare-store", "version": 1,
                                "hash": "xxh3-128", "chunk_size_max": 64 << 20}


def test_a_store_hashed_otherwise_is_refused(store_dir):
    Store.open(store_dir, create=True).close()
    path = os.path.join(store_dir, "store.json")
    with open(path) as f:
        doc = json.load(f)
    doc["hash"] = "sha256"
    with open(path, "w") as f:
        json.dump(doc, f)
    with pytest.raises(StoreError, match=f"{path}: chunks hashed with 'sha256'"):
        Store.open(store_dir)


def test_a_lease_is_locked_before_it_has_its_name(store, monkeypatch):
    seen = []
    real_rename = os.rename

    def check_locked(src, dst, **kw):
        if dst.endswith(".lease"):
            fd = os.open(src, os.O_RDONLY, dir_fd=kw["src_dir_fd"])
            try:
                with pytest.raises(BlockingIOError):
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                seen.append(dst)
            finally:
                os.close(fd)
        return real_rename(src, dst, **kw)

    monkeypatch.setattr(os, "rename", check_locked)
    with store.begin_write("x") as session:
        assert seen == [session.name]
        with open(os.path.join(store.path, "leases", session.name)) as f:
            info = json.load(f)
        assert info["pid"] == os.getpid() and info["started_ns"] == session.started_ns
    assert os.listdir(os.path.join(store.path, "leases")) == []  # removed at the end


def test_a_symlinked_ref_or_manifest_is_refused(store, tmp_path):
    commit_checkpoint(store, "real", [chunk_bytes(5)])
    fake = tmp_path / "fake-ref"
    fake.write_text(open(os.path.join(store.path, "refs", "real")).read())
    os.symlink(fake, os.path.join(store.path, "refs", "planted"))
    with pytest.raises(StoreError, match="refs/planted: is a symlink"):
        store.read_ref("planted")
    mid = store.read_ref("real").manifest
    mpath = os.path.join(store.path, "manifests", mid + ".json")
    os.rename(mpath, tmp_path / "m.json")
    os.symlink(tmp_path / "m.json", mpath)
    with pytest.raises(StoreError, match=f"{mpath}: is a symlink"):
        store.read_manifest(mid)


def test_a_chunk_file_longer_than_expected_is_refused(store):
    cid = store.put(chunk_bytes(6)).chunk_id
    with open(chunk_path(store, cid), "ab") as f:
        f.write(b"extra")
    with pytest.raises(StoreError, match="4101 bytes, expected 4096"):
        store.get(cid, bytearray(4096))


def test_a_taken_temp_name_is_retried_with_a_fresh_one(store, monkeypatch):
    data = chunk_bytes(9)
    cid = layout.chunk_id(data)
    fan = os.path.dirname(chunk_path(store, cid))
    os.makedirs(fan, exist_ok=True)
    taken = f".{cid}.{'0' * 16}.tmp"
    open(os.path.join(fan, taken), "wb").close()  # another writer's temp file
    names = iter([taken, f".{cid}.{'1' * 16}.tmp"])
    monkeypatch.setattr(fsutil, "temp_name", lambda final: next(names))
    assert store.put(data).status.value == "new"
    assert os.path.getsize(os.path.join(fan, taken)) == 0  # the other writer's file untouched
    assert sorted(os.listdir(fan)) == sorted([taken, cid])


def test_a_directory_store_names_the_file_system_its_sync_makes_durable(store):
    """post-dump syncs CRIU's image's file system too, unless it is this one (engine/dump.py)."""
    store.sync()
    assert store.synced_device() == os.stat(store.path).st_dev
