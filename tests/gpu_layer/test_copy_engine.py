"""The copy engine on the fake driver: an exported allocation goes to the store and comes back."""
import json
import os
import subprocess
import sys

from criu_gpushare.gpu.copy_engine import HASH_GROUP

HERE = os.path.dirname(os.path.abspath(__file__))


def roundtrip(env, store, mib, *args):
    r = subprocess.run([sys.executable, os.path.join(HERE, "copy_roundtrip.py"), str(store), str(mib), *args],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_save_then_load_gives_back_the_same_bytes_and_dedups(fake_env, tmp_path):
    out = roundtrip(fake_env, tmp_path / "store", 16, "--ring", "3", "--chunk-mib", "1")
    assert out["same"]
    assert out["chunks"] == 16 and out["zero_chunks"] == 4
    mib = 1 << 20
    # 4 zero chunks never stored; the 4 constant chunks are one chunk stored once; 8 distinct chunks.
    assert out["first"] == {"copied": 16 * mib, "written": 9 * mib, "dedup": 3 * mib, "zero": 4 * mib}
    # Saving the same memory again writes nothing.
    assert out["second"] == {"written": 0, "dedup": 12 * mib, "zero": 4 * mib}
    assert out["loaded"] == 16 * mib
    assert out["ring_reused"], "a later engine takes the pinned ring the first one left"


def test_a_ring_longer_than_the_allocation_and_a_short_last_chunk(fake_env, tmp_path):
    out = roundtrip(fake_env, tmp_path / "store", 6, "--ring", "8", "--chunk-mib", "4")
    assert out["same"] and out["chunks"] == 2


def test_many_allocations_share_one_pipeline_each_open_only_while_it_is_copied(fake_env, tmp_path):
    """save_all / load_all: 37 pieces of 1-3 chunks through a ring of 2 slots (so slots are reused
    across pieces and the reads run ahead into the next pieces), each piece's memory opened once
    per pass, in order, and held open a hash group at a time (their GPU ids are computed
    together once their copies are done); none is left open."""
    out = roundtrip(fake_env, tmp_path / "store", 64, "--ring", "2", "--chunk-mib", "1", "--pieces", "37")
    assert out["same"]
    assert out["most_open"] == {"save": HASH_GROUP, "load": HASH_GROUP}
    assert out["open_now"] == 0
    assert out["order"] == list(range(37)) * 2
    assert out["saved"] == out["loaded"] == 64 << 20


def test_the_puts_of_one_allocation_overlap_the_copies_of_the_next(fake_env, tmp_path):
    """12 allocations of one chunk each, the first put held until another put begins: a pipeline
    that finished one allocation's puts before copying the next would never begin another, and
    the held put would give up (after a minute); this one keeps its 3 workers putting while the
    next allocations are opened and copied."""
    out = roundtrip(fake_env, tmp_path / "store", 12, "--ring", "4", "--chunk-mib", "1",
                    "--pieces", "12", "--hold-first-put")
    assert out["same"] and out["open_now"] == 0
    assert out["first_put_overlapped"] is True, "the first put was alone: the puts did not overlap"
