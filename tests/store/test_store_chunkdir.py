"""criu_gpushare/store/chunkdir.py: a chunks/ tree, as the store and the node cache both use it.

What its callers rely on: a chunk file appears whole under its name or not at all, a read gets
exactly the chunk's bytes or an error naming the file and what is wrong with it, nothing is ever
followed through a symlink, and a listing shows chunks and temp files but nothing foreign."""
import os

import pytest

from criu_gpushare.errors import StoreError
from criu_gpushare.store import chunk_id
from criu_gpushare.store.chunkdir import ChunkDamaged, ChunkDir
from criu_gpushare.store.fsutil import open_dir
from criu_gpushare.store.layout import temp_name

from store_helpers import chunk_bytes


@pytest.fixture
def chunks(tmp_path):
    root = tmp_path / "root"
    fd = open_dir(str(root), create=True)
    d = ChunkDir(fd, str(root), create=True)
    yield d
    d.close()
    os.close(fd)


def put(chunks, data):
    cid = chunk_id(data)
    chunks.write(cid, memoryview(data), chunks.path)
    return cid


def test_a_written_chunk_reads_back_under_its_fanout_name(chunks):
    data = chunk_bytes(1, 8192)
    cid = put(chunks, data)
    assert chunks.chunk_path(cid) == os.path.join(chunks.path, cid[:2], cid)
    assert os.path.isfile(chunks.chunk_path(cid))
    buf = bytearray(len(data))
    chunks.read(cid, memoryview(buf))
    assert bytes(buf) == data
    assert chunks.stat(cid).st_size == len(data)


def test_a_second_write_keeps_the_first_file_unless_told_to_replace(chunks):
    data = chunk_bytes(2)
    cid = put(chunks, data)
    assert chunks.write(cid, memoryview(data), chunks.path) is False
    with open(chunks.chunk_path(cid), "r+b") as f:
        f.write(b"\0" * 16)  # damaged in place
    assert chunks.write(cid, memoryview(data), chunks.path, replace=True) is not False
    buf = bytearray(len(data))
    chunks.read(cid, memoryview(buf))
    assert bytes(buf) == data
    assert [f.name for f in chunks.scan()] == [cid]  # no temp file left behind


def test_reads_name_the_file_and_the_damage(chunks):
    data = chunk_bytes(3)
    cid = put(chunks, data)
    with pytest.raises(ChunkDamaged) as e:
        chunks.read(cid, memoryview(bytearray(len(data) + 1)))
    assert e.value.kind == "truncated" and chunks.chunk_path(cid) in str(e.value)
    with open(chunks.chunk_path(cid), "r+b") as f:
        f.write(b"x")
    buf = bytearray(len(data))
    chunks.read(cid, memoryview(buf))  # reading does not hash: check does
    with pytest.raises(ChunkDamaged) as e:
        chunks.check(cid, memoryview(buf))
    assert e.value.kind == "corrupt" and chunks.chunk_path(cid) in str(e.value)
    with pytest.raises(FileNotFoundError):
        chunks.read("ab" * 16, memoryview(bytearray(4)))


def test_a_symlink_under_a_chunk_name_is_never_followed(chunks, tmp_path):
    data = chunk_bytes(4)
    target = tmp_path / "elsewhere"
    target.write_bytes(data)
    cid = chunk_id(data)
    os.makedirs(os.path.join(chunks.path, cid[:2]), exist_ok=True)
    os.symlink(target, chunks.chunk_path(cid))
    with pytest.raises(StoreError, match="symlink"):
        chunks.stat(cid)
    with pytest.raises(ChunkDamaged) as e:
        chunks.read(cid, memoryview(bytearray(len(data))))
    assert e.value.kind == "bad-file"


def test_scan_lists_chunks_and_temp_files_and_skips_foreign_names(chunks):
    cid = put(chunks, chunk_bytes(5))
    fan = os.path.join(chunks.path, cid[:2])
    open(os.path.join(fan, "notes.txt"), "w").close()
    open(os.path.join(fan, "ff" * 16), "w").close()  # a chunk id in the wrong fan-out
    open(os.path.join(fan, temp_name(cid)), "w").close()
    os.mkdir(os.path.join(chunks.path, "zz"))
    found = {(f.name, f.is_temp) for f in chunks.scan()}
    assert (cid, False) in found and sum(temp for _, temp in found) == 1
    assert ("notes.txt", False) not in found and ("ff" * 16, False) not in found
    assert chunks.fanouts() == [cid[:2]]


def test_touch_refreshes_the_time_and_says_when_the_chunk_is_gone(chunks):
    cid = put(chunks, chunk_bytes(6))
    os.utime(chunks.chunk_path(cid), (1, 1))
    assert chunks.touch(cid) is True
    assert chunks.stat(cid).st_mtime > 1
    chunks.remove(cid, cid[:2])
    assert chunks.stat(cid) is None and chunks.touch(cid) is False
