"""Suspend/resume cycles of workloads that share GPU memory, through the CLI (fake driver, or the
real one with CRIU_GPUSHARE_TEST_DRIVER=real)."""
import json
import os
import signal
import time

import pytest

from lctest import (SIZE, assert_gpu_memory, assert_no_gpu_memory, assert_shared, device_usage,
                    fd_target, resume, shim_state, share, suspend, values, wait_for, write)


def test_fd_export_pair_three_cycles(lc, workload, tmp_path):
    """(a) two processes sharing a cuMem fd export; the exporter keeps its exported fd open."""
    a, b = workload(), workload()
    export_fd, _ = share(a, b, tmp_path)
    a.do("malloc small 4096")           # plain driver memory: the driver's checkpoint keeps it
    a.do("malloc big 8388608")          # backed by exportable cuMem memory by the shim
    write(a, "small", 11)
    for cycle in range(3):
        write(a, "buf", 100 + cycle)
        write(a, "big", 200 + cycle)
        r = suspend(lc, a.pid, b.pid)
        assert "suspended 2 process(es)" in r.stdout and "copied" in r.stdout
        # every GPU byte is free while suspended, and each process says why
        assert_no_gpu_memory(lc, a.pid)
        assert_no_gpu_memory(lc, b.pid)
        assert shim_state(lc, a.pid) == "released"
        status = lc.cli("status", a.pid)
        assert "state: released" in status.stdout and "suspended by criu-gpushare" in status.stdout
        # the exported fd the application kept no longer pins the memory
        assert fd_target(a, export_fd) == "/dev/null"
        resume(lc, b.pid)
        assert shim_state(lc, a.pid) == "running"
        assert values(b, "buf") == [100 + cycle] * 4
        assert values(a, "big") == [200 + cycle] * 4
        assert values(a, "small") == [11] * 4
        assert_shared(a, b)
    assert_gpu_memory(lc, a.pid)


def test_self_export_keeping_both_fds(lc, workload, tmp_path):
    """(c) a process that exports to itself and keeps both fds."""
    a = workload()
    a.do(f"cumem buf {SIZE}")
    fd1 = a.do("export buf")["fd"]
    fd2 = a.do("export buf")["fd"]
    a.do(f"import mirror {fd1} {SIZE}")
    for cycle in range(3):
        write(a, "buf", 300 + cycle)
        suspend(lc, a.pid)
        assert_no_gpu_memory(lc, a.pid)
        assert fd_target(a, fd1) == "/dev/null" and fd_target(a, fd2) == "/dev/null"
        resume(lc, a.pid)
        assert values(a, "mirror") == [300 + cycle] * 4
        write(a, "mirror", 400 + cycle)
        assert values(a, "buf") == [400 + cycle] * 4


def test_exporter_freed_memory_importer_maps(lc, workload, tmp_path):
    """(d) the exporter freed the memory; the importer adopts it and keeps using it."""
    a, b = workload(), workload()
    share(a, b, tmp_path)
    write(a, "buf", 5)
    a.do("unmap buf")
    a.do("release buf")
    for cycle in range(3):
        suspend(lc, a.pid, b.pid)
        assert_no_gpu_memory(lc, b.pid)
        resume(lc, a.pid, b.pid)
        assert values(b, "buf") == [5 + cycle] * 4
        write(b, "buf", 6 + cycle)


def test_adopted_memory_shared_by_two_importers(lc, workload, tmp_path):
    """Memory two importers map after its exporter freed it: one adopts it, the other attaches."""
    a, b, c = workload(), workload(), workload()
    a.do(f"cumem buf {SIZE}")
    fd = a.do("export buf")["fd"]
    for w in (b, c):
        path = str(tmp_path / f"s{w.pid}")
        w.do(f"listen {path}")
        a.do(f"sendfd {fd} {path}")
        w.do(f"import buf {w.do('recvfd')['fd']} {SIZE}")
    write(a, "buf", 9)
    a.do("unmap buf")
    a.do("release buf")
    for _ in range(3):
        suspend(lc, a.pid, b.pid, c.pid)
        resume(lc, a.pid)
        assert values(c, "buf") == [9] * 4
        assert_shared(b, c, value=9)


def test_work_in_flight_when_suspend_starts(lc, workload, tmp_path):
    """(e) kernels and copies queued in both processes when suspend starts all finish first."""
    a, b = workload(), workload()
    share(a, b, tmp_path)
    write(a, "buf", 0)
    for cycle in range(3):
        for w in (a, b):
            w.do("sleep 300000")        # a 0.3 s kernel, then an add behind it, in each process
            w.do("add buf 1")
        suspend(lc, a.pid, b.pid)
        resume(lc, a.pid, b.pid)
        assert values(a, "buf") == [2 * (cycle + 1)] * 4
    assert_shared(a, b)


def test_pinned_host_reader_and_signal_while_suspended(lc, workload, tmp_path):
    """(f) a CPU thread reading pinned host memory survives suspension; a signal sent while
    suspended is delivered after resume."""
    a, b = workload(), workload()
    share(a, b, tmp_path)
    a.do("hostalloc pinned 1048576 0")
    a.do("hostfill pinned 77")
    a.do("reader pinned")
    a.do(f"trap {int(signal.SIGUSR1)}")
    for cycle in range(3):
        suspend(lc, a.pid, b.pid)
        os.kill(a.pid, signal.SIGUSR1)
        time.sleep(0.3)
        assert a.proc.poll() is None, "the workload died while suspended"
        assert len(list(_status_threads_stopped(a.pid))) > 0  # its threads are held
        resume(lc, b.pid)
        wait_for(lambda: len(a.do("signals")["signals"]) == cycle + 1, what="the SIGUSR1 delivery")
        before = a.do("readers")["reads"]
        wait_for(lambda: a.do("readers")["reads"] > before, what="the reader thread running again")
        assert a.do("readers")["value"] == 2 * 77
        assert_shared(a, b)


def _status_threads_stopped(pid):
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] in ("t", "T"):
                yield int(tid)


def test_legacy_ipc_through_the_shim(lc, workload):
    """cudaIpc-style sharing of cuMemAlloc memory, through the shim's own IPC handles."""
    a, b = workload(), workload()
    a.do(f"malloc buf {SIZE}")
    handle = a.do("ipcget buf")["handle"]
    b.do(f"ipcopen buf {handle} {SIZE}")
    for cycle in range(2):
        write(a, "buf", 50 + cycle)
        suspend(lc, a.pid, b.pid)
        assert_no_gpu_memory(lc, a.pid)
        resume(lc, a.pid, b.pid)
        assert values(b, "buf") == [50 + cycle] * 4
        assert_shared(a, b)


@pytest.mark.parametrize("size", [4096, SIZE], ids=["driver-memory", "backed"])
def test_an_ipc_handle_from_before_the_suspends_opens_in_a_new_importer(lc, workload, size):
    """A CUDA IPC handle taken before suspend/resume cycles of its exporter opens in a process
    started after them, on the memory as it is now: below the backing threshold (the driver
    checkpoints and restores that memory itself) and backed by the shim."""
    a = workload()
    a.do(f"malloc buf {size}")
    handle = a.do("ipcget buf")["handle"]
    for cycle in range(2):
        write(a, "buf", 60 + cycle)
        suspend(lc, a.pid)
        resume(lc, a.pid)
    b = workload()
    b.do(f"ipcopen buf {handle} {size}")
    assert values(b, "buf") == [61] * 4
    assert_shared(a, b)


def test_tree_suspends_children(lc, workload, tmp_path):
    """--tree: a pid and its descendants (here the test runner is not the parent: one pid)."""
    a = workload()
    a.do(f"cumem buf {SIZE}")
    write(a, "buf", 3)
    suspend(lc, a.pid, args=("--tree",))
    assert_no_gpu_memory(lc, a.pid)
    resume(lc, a.pid)
    assert values(a, "buf") == [3] * 4


def test_program_handles_work_after_resume(lc, workload, tmp_path):
    """The program's handle values keep working on re-created memory: export, retain, release."""
    a, b = workload(), workload()
    a.do(f"cumem buf {SIZE}")
    a.do(f"cumem spare {SIZE}")
    a.do("retain spare")          # a second handle of the same memory, held by the program
    write(a, "buf", 21)
    for _ in range(2):
        suspend(lc, a.pid)
        resume(lc, a.pid)
    fd = a.do("export buf")["fd"]  # the handle value from before the suspends
    path = str(tmp_path / "late")
    b.do(f"listen {path}")
    a.do(f"sendfd {fd} {path}")
    b.do(f"import buf {b.do('recvfd')['fd']} {SIZE}")
    assert values(b, "buf") == [21] * 4
    assert_shared(a, b)
    a.do("release spare")          # the retained handle
    a.do("unmap buf")
    a.do("release buf")
    write(b, "buf", 22)            # the importer's mapping keeps the memory
    assert values(b, "buf") == [22] * 4


def _anonymous(pid):
    """Bytes of pid's anonymous memory (what CRIU dumps of its private mappings)."""
    with open(f"/proc/{pid}/smaps_rollup") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("Anonymous:"))


def test_the_stack_reservation_stays_out_of_the_checkpoint(lc, workload):
    """A context reserves its stack limit for every thread the GPU can run, and the driver's
    checkpoint copies that reservation into the process, where CRIU would dump it. Suspended, the
    process holds no more host memory with a 4x larger stack limit than with the smaller one (the
    reservation was given back first: 96 MiB apart on the fake, 792 MiB on an H100), and after
    resume the program's own limit is in place."""
    a = workload()
    a.do(f"cumem buf {SIZE}")
    grew = {}
    for stack in (1024, 4096):
        assert a.do(f"stack {stack}")["stack"] == stack
        write(a, "buf", stack)
        before = _anonymous(a.pid)
        suspend(lc, a.pid)
        grew[stack] = _anonymous(a.pid) - before
        resume(lc, a.pid)
        assert a.do("stack")["stack"] == stack
        assert values(a, "buf") == [stack] * 4
    assert abs(grew[4096] - grew[1024]) < 16 << 20, grew


def test_threads_submitting_work_lose_nothing(lc, workload):
    """(e) threads launching kernels and copies as fast as they can while suspend starts: held at
    the gates, every launch runs exactly once."""
    a = workload()
    a.do(f"cumem buf {SIZE}")
    a.send("hammer 2 2")
    time.sleep(0.5)
    suspend(lc, a.pid)
    resume(lc, a.pid)
    r = a.reply(30)
    assert r["ok"], r
    assert [v for v in r["values"]] == [[c] for c in r["counts"]]


def test_cuda_process_without_sharing_or_shim(lc, workload):
    """A CUDA process without the shim (nothing shared) goes through the driver's own path."""
    p = workload(lc.tool)
    p.do("malloc x 4194304")
    write(p, "x", 8)
    suspend(lc, p.pid)
    assert_no_gpu_memory(lc, p.pid)
    resume(lc, p.pid)
    assert values(p, "x") == [8] * 4


def test_handles_released_after_mapping(lc, workload, tmp_path):
    """NCCL's pattern: both sides release their handles once mapped; the mappings hold the memory."""
    a, b = workload(), workload()
    share(a, b, tmp_path)
    a.do("release buf")
    b.do("release buf")
    for cycle in range(2):
        write(a, "buf", 60 + cycle)
        suspend(lc, a.pid, b.pid)
        assert_no_gpu_memory(lc, a.pid)
        resume(lc, a.pid)
        assert values(b, "buf") == [60 + cycle] * 4
        assert_shared(a, b)
    for w in (a, b):  # unmapping frees it as before: nothing is left held by the shim
        w.do("unmap buf")
    if lc.state:  # the fake counts allocations only (a real GPU shows the context's memory too)
        assert device_usage(lc, a.pid) == 0


def test_stream_ordered_memory_goes_through_the_copy_engine(lc, workload):
    """cuMemAllocAsync memory, of the default pool and of a created one, is saved by the tool and
    comes back at the same address; a block the pool keeps free is not saved at all, and the pool
    goes on serving and reusing after resume."""
    a = workload()
    a.do("threshold default 1073741824")
    x = a.do(f"allocasync x {SIZE}")["ptr"]
    a.do("pool mine")
    a.do(f"allocasync y {SIZE} mine")
    a.do(f"allocasync gone {2 * SIZE}")
    a.do("freeasync gone")
    for cycle in range(3):
        write(a, "x", 10 + cycle)
        write(a, "y", 20 + cycle)
        r = suspend(lc, a.pid, args=("--json",))
        result = json.loads(r.stdout)
        assert result["units"] == 2, "the two live blocks, not the free one"
        assert result["bytes"]["copied"] == 2 * SIZE
        assert_no_gpu_memory(lc, a.pid)
        resume(lc, a.pid)
        assert values(a, "x") == [10 + cycle] * 4
        assert values(a, "y") == [20 + cycle] * 4
    a.do("freeasync x")
    assert a.do(f"allocasync z {SIZE}")["ptr"] == x, "the pool reuses a block freed after resume"
    write(a, "z", 5)
    assert values(a, "z") == [5] * 4
