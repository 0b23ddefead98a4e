"""The store between suspend and resume: a lost, truncated or corrupted chunk never reaches GPU
memory and never loses the group (it stays suspended until the store is repaired); the node cache
is read first; a suspension's checkpoint cannot be removed from under it."""
import json
import os
import shutil

import pytest

from lctest import resume, share, suspend, values, write


@pytest.fixture
def suspended(lc, workload, tmp_path):
    a, b = workload(), workload()
    share(a, b, tmp_path)
    write(a, "buf", 77)
    suspend(lc, a.pid, b.pid)
    return a, b


def chunk_files(lc):
    return [os.path.join(d, f) for d, _, fs in os.walk(os.path.join(lc.store, "chunks")) for f in fs]


def test_a_missing_chunk_is_found_before_anything_changes(lc, suspended, tmp_path):
    a, b = suspended
    chunk = chunk_files(lc)[0]
    shutil.move(chunk, tmp_path / "saved-chunk")
    r = resume(lc, a.pid, ok=False)
    assert r.returncode == 6 and "missing" in r.stderr and "nothing was changed" in r.stderr, r.stderr
    assert "restore..." not in r.stderr  # refused before the driver restore
    assert "suspended by criu-gpushare" in lc.cli("status", a.pid).stdout
    shutil.move(tmp_path / "saved-chunk", chunk)  # the store repaired: the same group resumes
    resume(lc, a.pid)
    assert values(b, "buf") == [77] * 4


def test_a_truncated_chunk_is_found_before_anything_changes(lc, suspended):
    a, b = suspended
    chunk = chunk_files(lc)[0]
    data = open(chunk, "rb").read()
    with open(chunk, "r+b") as f:
        f.truncate(len(data) // 2)
    r = resume(lc, a.pid, ok=False)
    assert r.returncode == 6 and "truncated" in r.stderr, r.stderr
    with open(chunk, "wb") as f:
        f.write(data)
    resume(lc, a.pid)
    assert values(b, "buf") == [77] * 4


def test_a_corrupted_chunk_is_never_loaded_and_the_group_stays_resumable(lc, suspended):
    a, b = suspended
    chunk = chunk_files(lc)[0]
    data = bytearray(open(chunk, "rb").read())
    good = bytes(data)
    data[len(data) // 2] ^= 0xFF
    os.chmod(chunk, 0o644)
    with open(chunk, "wb") as f:
        f.write(data)
    r = resume(lc, a.pid, ok=False)
    assert r.returncode == 15 and "resume failed at step load" in r.stderr, r.stderr
    with open(chunk, "wb") as f:
        f.write(good)
    resume(lc, a.pid)
    assert values(b, "buf") == [77] * 4


def test_resume_reads_the_node_cache_first(lc, workload, tmp_path):
    cache = str(tmp_path / "cache")
    env = dict(lc.tool, CRIU_GPUSHARE_CACHE=cache)
    a = workload()
    a.do("cumem buf 4194304")
    write(a, "buf", 5)
    r = lc.cli("suspend", a.pid, env=env)
    assert r.returncode == 0, r.stderr
    r = lc.cli("store", "prefetch", env=env)
    assert r.returncode == 0, r.stderr
    for chunk in chunk_files(lc):  # gone from the store: only the cache has them now
        os.unlink(chunk)
    r = lc.cli("resume", a.pid, env=env)
    assert r.returncode == 0, r.stderr
    assert values(a, "buf") == [5] * 4


def test_the_ref_of_a_live_suspension_cannot_be_removed(lc, suspended):
    a, b = suspended
    (row,) = json.loads(lc.cli("store", "ls", "--json").stdout)["checkpoints"]
    r = lc.cli("store", "rm", row["ref"] if "ref" in row else row["name"])
    assert r.returncode == 6 and str(a.pid) in r.stderr, r.stderr
    resume(lc, a.pid)
    assert values(b, "buf") == [77] * 4


def test_verify_off_at_resume_loads_without_hashing(lc, suspended):
    """CRIU_GPUSHARE_VERIFY=0 given to `resume` turns the hashing off (the suspend had it on, and
    its holder does the load): the corrupted chunk is loaded as it is, which only a load without
    hashing can do; sizes are still checked (a truncated chunk is still refused)."""
    a, b = suspended
    chunk = chunk_files(lc)[0]
    data = bytearray(open(chunk, "rb").read())
    data[0] ^= 0xFF
    os.chmod(chunk, 0o644)
    with open(chunk, "wb") as f:
        f.write(data)
    r = lc.cli("resume", a.pid, env=dict(lc.tool, CRIU_GPUSHARE_VERIFY="0"))
    assert r.returncode == 0, r.stderr
    assert values(b, "buf") != [77] * 4  # the flipped byte is in GPU memory: nothing checked it
