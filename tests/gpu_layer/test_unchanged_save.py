"""The copy engine's save path around GPU chunk ids (fake driver, a CPU stand-in for the kernel)."""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
MiB = 1 << 20


def run(env, *args):
    r = subprocess.run([sys.executable, os.path.join(HERE, "unchanged_save.py"), *map(str, args)],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_unchanged_chunks_do_not_cross_the_link(fake_env, tmp_path):
    out = run(fake_env, tmp_path / "store")
    # The fake runs no kernels: no hasher, every chunk copied, as before.
    assert out["fake_hasher"] is False
    assert out["plain"]["copied"] == 8 * MiB and out["plain"]["unchanged"] == 0
    assert out["plain"]["written"] == 6 * MiB and out["plain"]["zero"] == 2 * MiB
    # With chunk ids from the device: nothing copied, the same manifest, the chunks' times refreshed.
    again = out["again"]
    assert again["copied"] == 0 and again["unchanged"] == 8 * MiB
    assert again["dedup"] == 6 * MiB and again["zero"] == 2 * MiB and again["written"] == 0
    assert again["ids"] == out["plain"]["ids"]
    assert out["refreshed"]
    assert out["ring_allocated"] is False  # nothing to copy: no pinned ring either
    # A chunk missing from the store and a chunk rewritten on the device cross the link again.
    third = out["third"]
    assert third["copied"] == 2 * MiB and third["unchanged"] == 6 * MiB and third["written"] == 2 * MiB
    assert third["ids"][2] == again["ids"][2] and third["ids"][5] != again["ids"][5]
    # The first copied chunk of a length (2) is hashed on the host too; the next one of that
    # length (5) is put under its device id, not hashed again. (The puts run on worker threads:
    # in either order.)
    assert len(out["third_put_ids"]) == 2
    assert set(out["third_put_ids"]) == {None, third["ids"][5]}, out["third_put_ids"]
    # A device id that differs from the CPU's for a chunk hashed on both fails the save.
    assert "hashed to" in out["lie"] and "CRIU_GPUSHARE_GPU_HASH=0" in out["lie"]
    # ids once for "again", twice for "third": before its copies and after them
    assert out["hasher_calls"] == 3
    # Memory written between its hashing and the end of the copies fails the save.
    assert "offset 3145728 changed while it was saved" in out["changed"], out["changed"]
    # ... also when it is one allocation of a group, checked with the others once all are copied
    assert "p2: the GPU memory at offset 1048576 changed" in out["changed_in_group"], \
        out["changed_in_group"]


def test_switched_off_by_the_environment(fake_env, tmp_path):
    from criu_gpushare.gpu import fingerprint
    env = dict(fake_env, CRIU_GPUSHARE_GPU_HASH="0")
    assert run(env, tmp_path / "store")["fake_hasher"] is False
    os.environ[fingerprint.ENV_SWITCH] = "0"
    try:
        assert fingerprint.GpuHasher.create(0) is None  # off: the driver is not even asked
    finally:
        del os.environ[fingerprint.ENV_SWITCH]


def test_a_save_that_copied_nothing_leaves_the_load_a_pinned_ring(fake_env, tmp_path):
    """A warm resume is never slower than a cold one: after a save of unchanged memory (no ring
    pinned), the holder pins the load's ring in the background, as a save that copied keeps its
    own; the load pins nothing on its path."""
    out = run(fake_env, tmp_path / "store")["pin_ahead"]
    assert out["copied"] == 0
    assert out["by_load"] == 0 and out["by_save"] == 3, out


def test_a_holder_s_save_pins_its_ring_ahead_from_its_start(fake_env, tmp_path):
    """A suspend's save that copies takes its ring from the buffers pinned ahead since its start
    (beside its GPU start and hashing), none pinned on its path, and its load reuses that ring;
    the pages of those buffers were faulted in before (no driver call in that)."""
    out = run(fake_env, tmp_path / "store")["pin_ahead_copied"]
    assert out["copied"] == 1 << 20
    assert out["by_save"] == 3 and out["by_load"] == 0, out
    # their pages were faulted in from the group's discovery on, none on the way of the pinning
    assert out["faulted_ahead"] == 3 and out["faulted_on_the_path"] == 0, out
