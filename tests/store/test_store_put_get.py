"""put and get (FORMAT.md sections 3 and 4): new, present, zero; verification; O_DIRECT fallback;
many threads and processes writing one store."""
import ctypes
import errno
import mmap
import os
import subprocess
import sys
import threading

import pytest

from criu_gpushare.errors import StoreError
from criu_gpushare.store import CHUNK_SIZE_MAX, PutStatus, Source, Store
from criu_gpushare.store import fsutil

from store_helpers import age, chunk_bytes, chunk_path


def test_put_new_then_present_then_get(store):
    data = chunk_bytes(1, 10000)
    first = store.put(data)
    assert first.status is PutStatus.NEW and first.length == 10000
    assert store.put(bytearray(data)).status is PutStatus.PRESENT
    out = bytearray(10000)
    assert store.get(first.chunk_id, out, verify=True) is Source.STORE
    assert out == data


def test_present_chunk_is_not_rewritten_but_its_mtime_is_refreshed(store):
    cid = store.put(chunk_bytes(2)).chunk_id
    path = chunk_path(store, cid)
    age(path, 7200)
    inode, old_mtime = os.stat(path).st_ino, os.stat(path).st_mtime
    assert store.put(chunk_bytes(2)).status is PutStatus.PRESENT
    assert os.stat(path).st_ino == inode           # same file: not rewritten
    assert os.stat(path).st_mtime > old_mtime + 3600  # touched: gc's grace counts from now


def test_zero_chunks_are_never_stored(store):
    result = store.put(bytes(8192))
    assert result.status is PutStatus.ZERO and result.chunk_id is None and result.length == 8192
    assert not any(files for _, _, files in os.walk(os.path.join(store.path, "chunks")))


def test_put_under_an_id_its_caller_computed_does_not_hash_again(store, monkeypatch):
    """The copy engine's puts under GPU ids: the id is taken as given (the bytes are not hashed),
    present and zero ids work as for a hashed put, and what is not an id is refused."""
    from criu_gpushare.store import base
    from criu_gpushare.store.layout import chunk_id, zero_chunk_id
    data = chunk_bytes(4, 4096)
    cid = chunk_id(data)
    monkeypatch.setattr(base, "chunk_id", lambda view: pytest.fail("put hashed a chunk given its id"))
    first = store.put(data, cid=cid)
    assert first.status is PutStatus.NEW and first.chunk_id == cid
    assert store.put(data, cid=cid).status is PutStatus.PRESENT
    assert store.put(bytes(4096), cid=zero_chunk_id(4096)).status is PutStatus.ZERO
    with pytest.raises(ValueError, match="not a chunk id"):
        store.put(data, cid="../../etc/passwd")
    monkeypatch.undo()
    out = bytearray(4096)
    store.get(cid, out, verify=True)
    assert out == data


def test_put_accepts_ctypes_and_mmap_views(store):
    raw = (ctypes.c_char * 4096).from_buffer_copy(chunk_bytes(3))
    assert store.put(memoryview(raw)).chunk_id == store.put(chunk_bytes(3)).chunk_id
    m = mmap.mmap(-1, 8192)
    m[:4] = b"data"
    out = bytearray(8192)
    store.get(store.put(m).chunk_id, out, verify=True)
    assert out == m[:]


def test_chunk_size_limits(store):
    with pytest.raises(ValueError):
        store.put(b"")
    with pytest.raises(ValueError):
        store.put(memoryview(bytearray(CHUNK_SIZE_MAX + 1)))


def test_a_damaged_present_chunk_is_replaced(store):
    cid = store.put(chunk_bytes(4)).chunk_id
    with open(chunk_path(store, cid), "r+b") as f:
        f.truncate(100)
    assert store.put(chunk_bytes(4)).status is PutStatus.NEW
    out = bytearray(4096)
    store.get(cid, out, verify=True)


def test_no_temp_file_is_left_after_puts(store):
    for i in range(5):
        store.put(chunk_bytes(i))
    leftovers = [f for _, _, files in os.walk(store.path) for f in files if f.endswith(".tmp")]
    assert leftovers == []


@pytest.mark.parametrize("where", ["tmpfs", "disk"])
def test_o_direct_or_buffered_fallback_gives_the_same_bytes(where, tmp_path):
    base = "/dev/shm" if where == "tmpfs" else str(tmp_path)
    if not os.path.isdir(base):
        pytest.skip(f"{base} missing")
    import tempfile
    with tempfile.TemporaryDirectory(dir=base) as d:
        os.chmod(d, 0o755)
        with Store.open(os.path.join(d, "s"), create=True) as st:
            buf = mmap.mmap(-1, 1 << 20)          # page-aligned: O_DIRECT is attempted
            buf[:] = chunk_bytes(5, 1 << 20)
            cid = st.put(buf).chunk_id
            out = mmap.mmap(-1, 1 << 20)
            st.get(cid, memoryview(out), verify=True)
            assert out[:] == buf[:]


def test_a_file_system_refusing_o_direct_at_open_gets_buffered_io(store, monkeypatch):
    real_open, refused = os.open, []

    def no_direct_open(path, flags, *args, **kwargs):
        if flags & fsutil.O_DIRECT:
            refused.append(path)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", no_direct_open)
    buf = mmap.mmap(-1, 1 << 16)
    buf[:] = chunk_bytes(7, 1 << 16)
    cid = store.put(buf).chunk_id
    assert refused and store.chunks.direct_refused
    out = mmap.mmap(-1, 1 << 16)
    store.get(cid, memoryview(out), verify=True)
    assert out[:] == buf[:]


def test_write_all_drops_o_direct_when_a_write_says_einval(monkeypatch, tmp_path):
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT)
    real_write, calls = os.write, []

    def picky_write(f, data):
        calls.append(len(data))
        if len(calls) == 1:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_write(f, data)

    monkeypatch.setattr(os, "write", picky_write)
    monkeypatch.setattr(fsutil, "_clear_direct", lambda f: None)
    assert fsutil.write_all(fd, memoryview(b"x" * 10)) is True
    os.close(fd)
    assert (tmp_path / "f").read_bytes() == b"x" * 10


def test_many_threads_putting_the_same_and_different_chunks(store):
    errors, results = [], []

    def worker(k):
        try:
            for i in range(20):
                results.append(store.put(chunk_bytes(i % 7, 3000)))
                results.append(store.put(chunk_bytes(10000 + 1000 * k + i, 3000)))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    ids = {r.chunk_id for r in results}
    assert len(ids) == 7 + 8 * 20
    out = bytearray(3000)
    for cid in ids:
        store.get(cid, out, verify=True)


WRITER = """
import sys
from criu_gpushare.store import Store
from store_helpers import chunk_bytes
with Store.open(sys.argv[1], create=True) as s:
    for i in range(30):
        s.put(chunk_bytes(i % 10, 20000))
"""


def test_many_processes_share_one_store(store_dir):
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, store_dir], cwd=root, env=dict(os.environ, PYTHONPATH=os.path.dirname(__file__)))
             for _ in range(4)]
    assert [p.wait(timeout=60) for p in procs] == [0] * 4
    with Store.open(store_dir) as s:
        files = [f for _, _, fs in os.walk(os.path.join(store_dir, "chunks")) for f in fs]
        assert len(files) == 10
        out = bytearray(20000)
        for f in files:
            s.get(f, out, verify=True)


def test_get_rejects_a_bad_id_and_a_read_only_buffer(store):
    cid = store.put(chunk_bytes(6)).chunk_id
    with pytest.raises(StoreError, match="not a chunk id"):
        store.get("../../etc/passwd", bytearray(10))
    with pytest.raises(ValueError):
        store.get(cid, bytes(4096))


def test_a_store_made_by_another_process_between_two_looks_is_opened(store_dir, monkeypatch):
    """Two first dumps at once: one finds no store.json, then the directory already filled by the
    other, which wrote store.json first. That is the other's new store, not a stranger's."""
    Store.open(store_dir, create=True).close()  # the other process, done
    from criu_gpushare.store import fsutil
    real, calls = fsutil.read_small_file, []

    def not_yet_on_the_first_read(*args, **kwargs):
        calls.append(args)
        if len(calls) == 1:
            raise FileNotFoundError(2, "No such file or directory")
        return real(*args, **kwargs)

    monkeypatch.setattr(fsutil, "read_small_file", not_yet_on_the_first_read)
    with Store.open(store_dir, create=True) as s:
        s.put(chunk_bytes(1, 100))
    assert len(calls) >= 2
