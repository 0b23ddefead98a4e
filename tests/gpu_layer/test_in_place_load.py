"""A suspended group's chunk files registered ahead on a store in memory, and the loads that copy
them from their own pages (gpu/file_pages.py): the same bytes come back, checked, with no pinned
ring where all were registered; a damaged or missing chunk is refused with its own error; a
refused registration leaves the load to the ring; every page registered is released."""
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


def test_a_load_copies_the_chunk_files_registered_ahead_from_their_own_pages(fake_env, tmpfs_dir):
    r = subprocess.run([sys.executable, os.path.join(HERE, "in_place_load.py"), os.path.join(tmpfs_dir, "s")],
                       env=fake_env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    *said, last = r.stdout.splitlines()  # a line per registering and release, then the figures
    out = json.loads(last)
    assert out["pages"] in ("huge", "small")
    want = ["registered 6 of 6 chunk files", "released 6 registered", "registered 3 of 3 chunk files",
            "released 3 registered", "registered 6 of 6 chunk files", "released 6 registered",
            "released 2 registered"]  # the registering that stopped at a missing chunk says no line
    assert len(said) == len(want) and all(line.startswith(w) for line, w in zip(said, want)), said
    # six data chunks copied from their files' pages, checked on the host, no ring pinned
    assert out["all"] == {"intact": True, "in_place": 6 * MiB, "ring_pinned": False}, out
    # three registered, three read through the ring
    assert out["half"] == {"intact": True, "in_place": 3 * MiB, "ring_pinned": True}, out
    corrupt = out["corrupt"]
    assert corrupt["error"].startswith("ChunkDamaged: ") and "is corrupted" in corrupt["error"], corrupt
    assert corrupt["chunk"] in corrupt["error"]
    # the registering stops at the missing chunk, keeping the two before it; the load refuses it
    removed = out["removed"]
    assert removed["registered"] == 2 and len(removed["warnings"]) == 1, removed
    assert "stopped at 2 of 6" in removed["warnings"][0]
    assert removed["error"].startswith("ChunkMissing: ") and removed["chunk"] in removed["error"], removed
    # the driver refusing: nothing registered, said once, the load reads the store
    refused = out["refused"]
    assert refused["registered"] == 0 and len(refused["warnings"]) == 1, refused
    assert refused["intact"] and refused["in_place"] == 0 and refused["ring_pinned"], refused
    assert out["made"] == out["released"] == 6 + 3 + 6 + 2, out  # every page registered, released


def test_where_chunk_files_are_registered_ahead():
    """By default on huge pages only (small ones register slower than the ring reads); =0 never,
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
