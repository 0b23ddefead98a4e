"""Loads from a store on tmpfs copy the chunk files' own pages (gpu/file_pages.py): the same bytes
come back, checked, with no pinned ring; a refused registration still loads; a damaged or missing
chunk is refused with its own error; every page mapped is released."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

from criu_gpushare.gpu import file_pages
from criu_gpushare.store import memfs

HERE = os.path.dirname(os.path.abspath(__file__))
MiB = 1 << 20


@pytest.fixture
def tmpfs_dir():
    if memfs.on_disk("/dev/shm"):
        pytest.skip("/dev/shm is not a tmpfs here: a load in place needs a store in memory")
    path = tempfile.mkdtemp(prefix="in-place-", dir="/dev/shm")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_store_in_memory_is_loaded_from_its_chunk_files_own_pages(fake_env, tmpfs_dir):
    env = dict(fake_env, **{file_pages.ENV_SWITCH: "1"})
    r = subprocess.run([sys.executable, os.path.join(HERE, "in_place_load.py"), os.path.join(tmpfs_dir, "s")],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["pages"] in ("huge", "small")
    # six data chunks copied from their files' pages, checked on the host, none through a ring
    assert out["load"] == {"intact": True, "in_place": 6 * MiB, "ring_pinned": False,
                           "made": 6, "released": 6, "registered": 6}, out
    # the driver refusing to register them: still intact, through its own staging, said once
    assert out["refused"] == {"intact": True, "in_place": 6 * MiB, "ring_pinned": False,
                              "made": 12, "released": 12, "registered": 6}, out
    assert len(out["warnings"]) == 1 and "CRIU_GPUSHARE_PAGES_IN_PLACE=0" in out["warnings"][0], out
    for case, want in (("corrupt", "ChunkDamaged: "), ("truncated", "ChunkDamaged: "),
                       ("removed", "ChunkMissing: ")):
        got = out[case]
        assert got["error"].startswith(want) and got["chunk"] in got["error"], (case, got)
        assert got["made"] == got["released"], (case, got)  # nothing left mapped or registered
    assert "is corrupted" in out["corrupt"]["error"]
    assert "truncated or damaged" in out["truncated"]["error"]


def test_where_a_load_copies_in_place(monkeypatch):
    """By default huge pages only (small ones register slower than the ring reads); =0 never,
    =1 on small pages too; never where the chunk files are not in memory."""
    for value, want in (("", {"huge"}), ("0", set()), ("off", set()), ("1", {"huge", "small"}),
                        ("yes", {"huge", "small"})):
        env = {file_pages.ENV_SWITCH: value}
        assert {p for p in ("huge", "small", None) if file_pages.wanted(p, env)} == want, value
    assert file_pages.wanted("huge", {}) and not file_pages.wanted("small", {})


def test_a_store_says_where_its_chunk_files_keep_their_bytes(tmp_path, tmpfs_dir):
    from criu_gpushare.store.store import Store
    with Store.open(os.path.join(tmpfs_dir, "s"), create=True) as store:
        assert store.chunk_pages() == memfs.pages_of(tmpfs_dir) in ("huge", "small")
    if not memfs.on_disk(str(tmp_path)):
        pytest.skip(f"{tmp_path} is on tmpfs here: no store on a disk to ask")
    with Store.open(str(tmp_path / "s"), create=True) as store:
        assert store.chunk_pages() is None
