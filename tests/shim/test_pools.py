"""Stream-ordered allocation and memory pools on the shim's own memory (shim/src/pools.c): what
is backed, what the driver keeps, how freed blocks are reused and released, and what a checkpoint
must refuse."""
from __future__ import annotations

import pytest

from shimtest import fake_only
from criu_gpushare.errors import ShimError
from criu_gpushare.shimctl import client as control
from fakecuda.usage import process_usage

MiB = 1 << 20


def async_allocs(w):
    return [a for a in w.status()["allocations"] if a["origin"] == "cuMemAllocAsync"]


def usage(w, fake_env):
    return process_usage(fake_env["FAKECUDA_STATE"], w.pid)


def test_stream_ordered_memory_is_the_shims_and_works(workload):
    w = workload()
    ptr = w.do(f"allocasync x {4 * MiB}")["ptr"]
    w.do(f"allocasync small {64 << 10}")
    w.do("fill x 7")
    w.do("add x 5")
    w.do("sync")
    assert w.do("read x")["values"] == [12] * 4
    [a] = async_allocs(w)
    assert a["va"] == ptr and a["size"] == 4 * MiB and a["device"] == 0
    assert a["handle_types"] & 1, "backed memory must be exportable, for the copy engine"
    m = next(m for m in w.status()["mappings"] if m["va"] == ptr)
    assert [(x["location"], x["prot"]) for x in m["access"]] == [(0, "rw")]
    w.do("freeasync x")
    assert async_allocs(w) == [], "a freed block is no allocation of the program's"


def test_a_freed_block_is_reused_on_its_stream_at_once(workload):
    w = workload()
    w.do("threshold default 1073741824")
    first = w.do(f"allocasync x {4 * MiB}")["ptr"]
    w.do("sleep 200000")  # work still queued when the block is freed and taken again
    w.do("freeasync x")
    assert w.do(f"allocasync y {4 * MiB}")["ptr"] == first
    w.do("fill y 3")
    w.do("sync")
    assert w.do("read y")["values"] == [3] * 4


def test_cumemfree_frees_stream_ordered_memory(workload):
    w = workload()
    w.do(f"allocasync x {4 * MiB}")
    w.do("free x")
    assert async_allocs(w) == []


@fake_only
def test_the_cache_keeps_no_more_than_the_release_threshold(workload, fake_env):
    w = workload()
    w.do(f"allocasync x {4 * MiB}")
    w.do("freeasync x")
    w.do("sync")
    w.do(f"allocasync y {6 * MiB}")  # threshold 0: the completed 4 MiB block goes back now
    assert usage(w, fake_env) == 6 * MiB

    w.do("threshold default 1073741824")
    w.do("freeasync y")
    w.do("sync")
    w.do(f"allocasync z {2 * MiB}")
    assert usage(w, fake_env) == 8 * MiB, "below the threshold the pool keeps the freed block"
    w.do("trim default 0")
    assert usage(w, fake_env) == 2 * MiB


@fake_only
def test_quiesce_releases_the_blocks_the_pools_keep(workload, fake_env):
    w = workload()
    w.do("threshold default 1073741824")
    w.do(f"allocasync keep {4 * MiB}")
    w.do("fill keep 9")
    w.do(f"allocasync x {8 * MiB}")
    w.do("freeasync x")
    assert usage(w, fake_env) == 12 * MiB
    control.quiesce(w.pid)
    assert usage(w, fake_env) == 4 * MiB, "a checkpoint must not carry a free block"
    control.resume(w.pid)
    assert w.do("read keep")["values"] == [9] * 4
    w.do(f"allocasync y {8 * MiB}")
    w.do("fill y 1")
    w.do("sync")
    assert w.do("read y")["values"] == [1] * 4


def test_created_pools_without_export_types_are_backed_exportable_ones_are_not(workload):
    w = workload()
    w.do("pool plain")
    w.do("pool shared 1")
    plain = w.do(f"allocasync a {4 * MiB} plain")["ptr"]
    shared = w.do(f"allocasync b {4 * MiB} shared")["ptr"]
    assert [a["va"] for a in async_allocs(w)] == [plain]
    assert shared not in [a["va"] for a in w.status()["allocations"]]
    for name in ("a", "b"):
        w.do(f"fill {name} 4")
        w.do("sync")
        assert w.do(f"read {name}")["values"] == [4] * 4


def test_a_process_that_imported_a_pool_is_refused_by_quiesce(workload, tmp_path):
    a, b = workload(), workload()
    a.do("pool shared 1")
    fd = a.do("poolexport shared")["fd"]
    path = str(tmp_path / "pool.sock")
    b.do(f"listen {path}")
    a.do(f"sendfd {fd} {path}")
    got = b.do("recvfd")["fd"]
    b.do(f"poolimport theirs {got}")
    [reason] = b.status()["untracked"]
    assert "memory pool(s) imported from another process" in reason
    with pytest.raises(ShimError, match="memory pool"):
        control.quiesce(b.pid)
    assert b.status()["state"] == "running", "a refused quiesce leaves the process running"


@fake_only
def test_an_unlimited_threshold_never_releases_a_block_work_still_uses(workload, fake_env):
    """PyTorch sets the release threshold to UINT64_MAX: the cache then keeps every block, and one
    freed behind queued work stays mapped until that work is done."""
    w = workload()
    w.do(f"threshold default {(1 << 64) - 1}")
    w.do(f"allocasync x {4 * MiB}")
    w.do("sleep 300000")
    w.do("fill x 1")        # still queued when x is freed
    w.do("freeasync x")
    w.do(f"allocasync y {6 * MiB}")
    w.do("sync")            # the fill ran on mapped memory: the process is alive to answer
    assert usage(w, fake_env) == 10 * MiB, "below the threshold the freed block stays cached"


@fake_only
def test_an_allocation_during_capture_is_the_drivers_and_the_capture_holds(workload):
    """Captured, it becomes a graph node, which only the driver can make."""
    w = workload()
    w.do("capture global")
    ptr = w.do(f"allocasync g {4 * MiB} - capture")["ptr"]
    w.do("endcapture")
    assert ptr not in [a["va"] for a in w.status()["allocations"]]


@fake_only
def test_a_free_during_capture_keeps_the_block(workload):
    """The graph's work before the free may run at any later launch: the block stays allocated."""
    w = workload()
    ptr = w.do(f"allocasync x {4 * MiB}")["ptr"]
    w.do("sync")
    w.do("capture global")
    w.do("freeasync x capture")
    w.do("endcapture")
    assert ptr in [a["va"] for a in async_allocs(w)]


@fake_only
def test_the_shims_own_calls_never_invalidate_a_global_capture(workload):
    """While this thread captures in global mode, stream-ordered allocation on another stream
    (event record and query, the cache's reuse and release) must not break the capture, as an
    unsafe call would."""
    w = workload()
    w.do(f"allocasync warm {4 * MiB}")
    w.do("freeasync warm")
    w.do("sync")
    w.do("capture global")
    w.do(f"allocasync x {4 * MiB}")   # takes the cached block: its event is queried
    w.do("freeasync x")               # an event recorded, the cache trimmed (queries again)
    w.do(f"allocasync y {6 * MiB}")
    w.do("endcapture")                # fails with CUDA_ERROR_STREAM_CAPTURE_INVALIDATED otherwise


def test_pools_off_leaves_stream_ordered_memory_to_the_driver(workload):
    w = workload({"CRIU_GPUSHARE_POOLS": "0"})
    w.do(f"allocasync x {4 * MiB}")
    w.do("fill x 2")
    w.do("sync")
    assert w.do("read x")["values"] == [2] * 4
    assert async_allocs(w) == []
