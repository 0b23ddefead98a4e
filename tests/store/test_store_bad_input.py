"""Bad input (issue #3): each gives a clear StoreError naming the path, never a wrong byte, never a
torn chunk under its final name."""
import errno
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from criu_gpushare.errors import StoreError
from criu_gpushare.store import ChunkDamaged, ChunkMissing, Store
from criu_gpushare.store import fsutil, layout

from store_helpers import age, chunk_bytes, chunk_path


def test_truncated_chunk_is_an_error_naming_it(store):
    cid = store.put(chunk_bytes(1)).chunk_id
    path = chunk_path(store, cid)
    with open(path, "r+b") as f:
        f.truncate(1000)
    out = bytearray(4096)
    with pytest.raises(ChunkDamaged, match=f"{path}: 1000 bytes, expected 4096"):
        store.get(cid, out)
    assert out == bytearray(4096)  # nothing handed out


def test_corrupted_chunk_fails_verification_naming_it(store):
    cid = store.put(chunk_bytes(2)).chunk_id
    path = chunk_path(store, cid)
    with open(path, "r+b") as f:
        f.seek(100)
        f.write(b"\xff\xfe")
    with pytest.raises(ChunkDamaged, match=f"{path}: chunk {cid} is corrupted: its content "
                                           f"hashes to [0-9a-f]{{32}}") as info:
        store.get(cid, bytearray(4096), verify=True)
    assert (info.value.kind, info.value.chunk, info.value.path) == ("corrupt", cid, path)


def test_a_get_verifies_by_default_and_verify_false_opts_out(store):
    """Point 5: every chunk a restore reads is checked against its name unless told not to."""
    cid = store.put(chunk_bytes(2)).chunk_id
    path = chunk_path(store, cid)
    with open(path, "r+b") as f:
        f.seek(100)
        f.write(b"\xff\xfe")
    out = bytearray(4096)
    with pytest.raises(ChunkDamaged, match=f"chunk {cid} is corrupted"):
        store.get(cid, out)
    with pytest.raises(ChunkDamaged, match=f"chunk {cid} is corrupted"):
        store.read_chunk(cid, memoryview(out))
    store.get(cid, out, verify=False)  # the explicit opt-out: sizes checked, bytes not hashed
    assert out[100:102] == b"\xff\xfe"


def test_missing_chunk_is_an_error_naming_it(store):
    cid = store.put(chunk_bytes(3)).chunk_id
    os.unlink(chunk_path(store, cid))
    with pytest.raises(ChunkMissing, match=f"{chunk_path(store, cid)}: chunk {cid} missing") as info:
        store.get(cid, bytearray(4096))
    assert (info.value.chunk, info.value.path) == (cid, chunk_path(store, cid))
    with pytest.raises(ChunkMissing, match=f"chunk {'ab' * 16} missing"):
        store.get("ab" * 16, bytearray(10))  # fan-out directory absent too


def test_store_from_a_newer_format_is_refused(store_dir):
    Store.open(store_dir, create=True).close()
    path = os.path.join(store_dir, "store.json")
    with open(path) as f:
        doc = json.load(f)
    doc["version"] = 99
    with open(path, "w") as f:
        json.dump(doc, f)
    with pytest.raises(StoreError, match=f"{path}: store format version 99 is newer than this "
                                         f"tool reads \\(version 1\\)"):
        Store.open(store_dir)


def test_a_directory_that_is_not_a_store(tmp_path):
    with pytest.raises(StoreError, match="not a criu-gpushare store"):
        Store.open(str(tmp_path))
    (tmp_path / "somebody-elses-file").write_text("x")
    with pytest.raises(StoreError, match="not empty and not a criu-gpushare store"):
        Store.open(str(tmp_path), create=True)
    assert (tmp_path / "somebody-elses-file").read_text() == "x"


def test_store_owned_by_another_user_is_refused(store_dir):
    if os.geteuid() != 0:
        pytest.skip("needs root to chown the store to another user")
    Store.open(store_dir, create=True).close()
    os.chown(store_dir, 65534, 65534)
    with pytest.raises(StoreError, match=f"{store_dir}: owned by uid 65534.*decides what a "
                                         f"restore loads"):
        Store.open(store_dir)


@pytest.mark.parametrize("mode", [0o775, 0o757])
def test_group_or_world_writable_store_is_refused(store_dir, mode):
    Store.open(store_dir, create=True).close()
    os.chmod(store_dir, mode)
    with pytest.raises(StoreError, match=f"{store_dir}: writable by group or others"):
        Store.open(store_dir)


def test_group_writable_chunks_dir_is_refused(store_dir):
    Store.open(store_dir, create=True).close()
    os.chmod(os.path.join(store_dir, "chunks"), 0o777)
    with pytest.raises(StoreError, match="chunks: writable by group or others"):
        Store.open(store_dir)


def test_symlink_planted_at_a_chunk_name(store, tmp_path):
    data = chunk_bytes(4)
    cid = layout.chunk_id(data)
    victim = tmp_path / "victim"
    victim.write_bytes(chunk_bytes(99))  # same size, other bytes
    os.makedirs(os.path.dirname(chunk_path(store, cid)), exist_ok=True)
    os.symlink(victim, chunk_path(store, cid))
    with pytest.raises(StoreError, match=f"{chunk_path(store, cid)}: is a symlink"):
        store.put(data)
    with pytest.raises(ChunkDamaged, match="is a symlink"):
        store.get(cid, bytearray(4096))
    assert victim.read_bytes() == chunk_bytes(99)


def test_symlink_planted_as_a_fanout_dir(store, tmp_path):
    data = chunk_bytes(5)
    cid = layout.chunk_id(data)
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", os.path.join(store.path, "chunks", cid[:2]))
    with pytest.raises(StoreError, match=f"chunks/{cid[:2]}: is a symlink"):
        store.put(data)
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_symlink_planted_as_the_chunks_dir(store_dir, tmp_path):
    Store.open(store_dir, create=True).close()
    chunks = os.path.join(store_dir, "chunks")
    os.rmdir(chunks)
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", chunks)
    with pytest.raises(StoreError, match=f"{chunks}: is a symlink"):
        Store.open(store_dir)


def test_symlink_planted_at_the_temp_path(store, tmp_path, monkeypatch):
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    data = chunk_bytes(6)
    cid = layout.chunk_id(data)
    fan = os.path.join(store.path, "chunks", cid[:2])
    os.makedirs(fan, exist_ok=True)
    os.symlink(victim, os.path.join(fan, "planted.tmp"))
    monkeypatch.setattr(fsutil, "temp_name", lambda final: "planted.tmp")  # a guessed name
    with pytest.raises(StoreError, match="cannot create a temporary file"):
        store.put(data)
    assert victim.read_bytes() == b"precious"
    assert not os.path.lexists(chunk_path(store, cid))


def test_full_disk_removes_the_temp_file_and_names_store_and_bytes(tmp_path, monkeypatch):
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0755", "tmpfs",
                              str(mnt)], capture_output=True).returncode == 0
    try:
        if not mounted:
            # No mount rights here: inject ENOSPC into the write path instead.
            def full(fd, data):
                raise OSError(errno.ENOSPC, "No space left on device")
            monkeypatch.setattr(fsutil.os, "write", full)
        with Store.open(str(mnt / "s"), create=True) as st:
            big = chunk_bytes(7, 2 << 20)
            with pytest.raises(StoreError, match=f"{mnt}/s: file system full writing chunk "
                                                 f"[0-9a-f]{{32}}: needed {2 << 20} bytes"):
                st.put(big)
            leftovers = [f for _, _, fs in os.walk(mnt) for f in fs if f.endswith(".tmp")]
            assert leftovers == []
            assert not st.has_chunk(layout.chunk_id(big))
            st.put(chunk_bytes(8, 1000))  # still usable for what fits
    finally:
        if mounted:
            subprocess.run(["umount", str(mnt)], check=True)
    if not mounted:
        print("ENOSPC simulated: mounting a tmpfs was not permitted")


KILLED_WRITER = """
import os, sys, time
from criu_gpushare.store import Store, fsutil
real_write = os.write
def slow_write(fd, data):
    n = real_write(fd, data[:len(data) // 2])     # half the chunk reaches the temp file
    open(sys.argv[2], "w").close()                # tell the test, then hang until killed
    time.sleep(60)
    return n
with Store.open(sys.argv[1], create=True) as s:
    fsutil.os.write = slow_write
    s.put(os.urandom(1 << 20))
"""


def test_writer_killed_mid_chunk_leaves_no_chunk_under_its_final_name(store_dir, tmp_path):
    flag = tmp_path / "half-written"
    proc = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, store_dir, str(flag)])
    try:
        deadline = time.monotonic() + 30
        while not flag.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "writer did not start"
            time.sleep(0.01)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    files = [f for _, _, fs in os.walk(os.path.join(store_dir, "chunks")) for f in fs]
    assert len(files) == 1 and layout.is_temp_name(files[0])   # only the torn temp file
    with Store.open(store_dir) as st:
        cid = files[0][1:33]
        assert not st.has_chunk(cid)
        from criu_gpushare.store import collect_garbage
        temp = os.path.join(store_dir, "chunks", cid[:2], files[0])
        assert collect_garbage(st, grace_s=60).temps_removed == 0  # might be a live writer's
        age(temp, 120)
        assert collect_garbage(st, grace_s=60).temps_removed == 1
    assert [f for _, _, fs in os.walk(os.path.join(store_dir, "chunks")) for f in fs] == []


@pytest.mark.parametrize("sub", ["refs", "manifests", "chunks/ab"])
def test_a_writable_by_others_directory_inside_the_store_is_refused(store, sub):
    path = os.path.join(store.path, sub)
    os.makedirs(path, exist_ok=True)
    os.chmod(path, 0o777)
    with pytest.raises(StoreError, match=f"{path}: writable by group or others"):
        if sub == "refs":
            store.list_refs()
        elif sub == "manifests":
            store.read_manifest("ab" * 16)
        else:
            store.get("ab" * 16, bytearray(1))
