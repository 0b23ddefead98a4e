"""The checkpoint API of the fake driver across processes, with the real driver's behaviour
(tests/probes/README.md): lock, checkpoint, restore, unlock, and what a process that shares memory
gets from a restore."""
from __future__ import annotations

import fcntl
import os
import time

import pytest

from fakecuda.usage import process_usage

MB = 1 << 20
RUNNING, LOCKED, CHECKPOINTED = "0", "1", "2"


def protection(pid: int, va: str) -> str:
    """The permissions column of /proc/pid/maps for the mapping that holds va."""
    addr = int(va, 16)
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            span, perms = line.split()[:2]
            lo, hi = (int(x, 16) for x in span.split("-"))
            if lo <= addr < hi:
                return perms
    raise AssertionError(f"{va} not mapped in pid {pid}")


def checkpoint(tool, pid: int) -> None:
    assert tool.ok(f"ck lock {pid}") == ["CUDA_SUCCESS"]
    assert tool.ok(f"ck checkpoint {pid}") == ["CUDA_SUCCESS"]


def test_round_trip_keeps_bytes_at_the_same_va_and_frees_memory_meanwhile(workers, fake_env):
    target, tool = workers(), workers()
    va = target.ok("alloc a 0x400000")[0]
    vmm_va = target.ok("vmm v 0x200000")[0]
    target.ok("set32 a 0x11223344")
    target.ok("set32 v 0x55667788")
    state_dir = fake_env["FAKECUDA_STATE"]
    assert process_usage(state_dir, target.pid) == 6 * MB
    free_before = int(tool.ok("info")[0])
    assert tool.ok(f"state {target.pid}") == [RUNNING]
    assert tool.ok(f"ck lock {target.pid}") == ["CUDA_SUCCESS"]
    assert tool.ok(f"state {target.pid}") == [LOCKED]
    assert tool.ok(f"ck checkpoint {target.pid}") == ["CUDA_SUCCESS"]
    assert tool.ok(f"state {target.pid}") == [CHECKPOINTED]
    # Device memory is free for others while checkpointed, and a CPU touch of the VA would fault.
    assert process_usage(state_dir, target.pid) == 0
    assert int(tool.ok("info")[0]) == free_before + 6 * MB
    assert protection(target.pid, va) == "---p"
    assert protection(target.pid, vmm_va) == "---p"
    assert tool.ok(f"ck restore {target.pid}") == ["CUDA_SUCCESS"]
    assert tool.ok(f"state {target.pid}") == [LOCKED]
    assert protection(target.pid, va) == "rw-s"
    assert process_usage(state_dir, target.pid) == 6 * MB
    assert tool.ok(f"ck unlock {target.pid}") == ["CUDA_SUCCESS"]
    assert tool.ok(f"state {target.pid}") == [RUNNING]
    assert target.ok("get32 a 1000") == ["0x11223344"]
    assert target.ok("get32 v 7") == ["0x55667788"]


def test_calls_in_the_wrong_state_are_illegal(workers):
    target, tool = workers(), workers()
    assert tool.ok(f"ck checkpoint {target.pid}") == ["CUDA_ERROR_ILLEGAL_STATE"]
    assert tool.ok(f"ck unlock {target.pid}") == ["CUDA_ERROR_ILLEGAL_STATE"]
    assert tool.ok(f"ck restore {target.pid}") == ["CUDA_ERROR_ILLEGAL_STATE"]
    assert tool.ok(f"ck lock {target.pid}") == ["CUDA_SUCCESS"]
    assert tool.ok(f"ck lock {target.pid}") == ["CUDA_ERROR_ILLEGAL_STATE"]
    assert tool.ok(f"ck unlock {target.pid}") == ["CUDA_SUCCESS"]


def test_locked_process_calls_wait_until_unlock(workers):
    target, tool = workers(), workers()
    target.ok("alloc a 0x1000")
    tool.ok(f"ck lock {target.pid}")
    target.send("set32 a 0x5")
    assert not target.has_reply(0.5), "a CUDA call of a locked process must block"
    assert tool.ok(f"ck unlock {target.pid}") == ["CUDA_SUCCESS"]
    assert target.reply() == ["ok"]
    assert target.ok("get32 a") == ["0x5"]


def test_lock_waits_for_submitted_work_and_times_out_leaving_it_running(workers):
    target, tool = workers(), workers()
    target.ok("sleep_kernel 1500000")
    t0 = time.monotonic()
    assert tool.ok(f"ck lock {target.pid} timeout=200") == ["CUDA_ERROR_TIMEOUT"]
    assert time.monotonic() - t0 < 1.2
    assert tool.ok(f"state {target.pid}") == [RUNNING]
    target.ok("sleep_kernel 300000")
    t0 = time.monotonic()
    assert tool.ok(f"ck lock {target.pid}") == ["CUDA_SUCCESS"]
    assert time.monotonic() - t0 > 0.2, "lock must wait for the running kernel"
    tool.ok(f"ck unlock {target.pid}")


def test_restore_thread_id_is_a_thread_of_the_target(workers):
    target, tool = workers(), workers()
    tid = int(tool.ok(f"tid {target.pid}")[0])
    assert tid != target.pid
    assert os.path.isdir(f"/proc/{target.pid}/task/{tid}")


def test_pid_without_cuda_and_missing_pid(workers):
    tool = workers()
    assert tool.do("state 1") == ["err", "CUDA_ERROR_NOT_INITIALIZED"]
    assert tool.do("state 999999999") == ["err", "CUDA_ERROR_INVALID_VALUE"]


def test_pinned_host_memory_is_unmapped_while_checkpointed(workers):
    target, tool = workers(), workers()
    va = target.ok("host h 0x10000")[0]
    target.ok("hostset h 0x7b")
    checkpoint(tool, target.pid)
    assert protection(target.pid, va) == "---p"
    tool.ok(f"ck restore {target.pid}")
    tool.ok(f"ck unlock {target.pid}")
    assert target.ok("hostget h") == ["0x7b"]


def test_legacy_ipc_importer_restore_fails_and_stays_checkpointed(workers):
    exporter, importer, tool = workers(), workers(), workers()
    exporter.ok("alloc a 0x200000")
    exporter.ok("set32 a 0xabcd")
    handle = exporter.ok("ipc_get a")[0]
    importer.ok(f"ipc_open a {handle}")
    assert importer.ok("get32 a") == ["0xabcd"]
    checkpoint(tool, importer.pid)  # lock and checkpoint succeed
    assert tool.ok(f"ck restore {importer.pid}") == ["CUDA_ERROR_INVALID_VALUE"]
    assert tool.ok(f"state {importer.pid}") == [CHECKPOINTED]
    assert tool.ok(f"ck unlock {importer.pid}") == ["CUDA_ERROR_ILLEGAL_STATE"]
    assert tool.ok(f"ck restore {importer.pid}") == ["CUDA_ERROR_INVALID_VALUE"]


def test_cumem_importer_restore_fails_and_stays_checkpointed(workers):
    exporter, importer, tool = workers(), workers(), workers()
    exporter.ok("vmm v 0x200000")
    exporter.ok("set32 v 0x1234")
    fd = exporter.ok("export v")[0]
    importer.ok(f"import v {exporter.pid} {fd}")
    assert importer.ok("get32 v 3") == ["0x1234"]
    checkpoint(tool, importer.pid)
    assert tool.ok(f"ck restore {importer.pid}") == ["CUDA_ERROR_NOT_SUPPORTED"]
    assert tool.ok(f"state {importer.pid}") == [CHECKPOINTED]
    assert tool.ok(f"ck unlock {importer.pid}") == ["CUDA_ERROR_ILLEGAL_STATE"]


def test_released_import_restores_and_reimport_lands_at_the_same_va(workers):
    exporter, importer, tool = workers(), workers(), workers()
    exporter.ok("vmm v 0x400000")
    exporter.ok("set32 v 0xfeedbeef")
    fd = exporter.ok("export v")[0]
    va = importer.ok(f"import v {exporter.pid} {fd}")[0]
    importer.ok("unmap_release v")
    for pid in (importer.pid, exporter.pid):
        checkpoint(tool, pid)
    assert tool.ok(f"ck restore {exporter.pid} {importer.pid}") == ["CUDA_SUCCESS", "CUDA_SUCCESS"]
    assert tool.ok(f"ck unlock {exporter.pid} {importer.pid}") == ["CUDA_SUCCESS", "CUDA_SUCCESS"]
    fresh_fd = exporter.ok("export v")[0]
    assert importer.ok(f"reimport v {exporter.pid} {fresh_fd}") == [va]
    assert importer.ok("get32 v 100") == ["0xfeedbeef"]
    # The two processes share memory again.
    importer.ok("set32 v 0x42")
    assert exporter.ok("get32 v 5") == ["0x42"]


def test_exported_fd_stays_open_and_keeps_the_memory_through_a_checkpoint(workers, fake_env):
    exporter, tool = workers(), workers()
    exporter.ok("vmm kept 0x200000")
    exporter.ok("vmm voided 0x400000")
    fd = exporter.ok("export kept")[0]
    exporter.ok(f"close_fd {exporter.ok('export voided')[0]}")
    target = os.readlink(f"/proc/{exporter.pid}/fd/{fd}")
    checkpoint(tool, exporter.pid)
    assert os.readlink(f"/proc/{exporter.pid}/fd/{fd}") == target
    # The kept fd pins its 2 MiB; the allocation whose export was closed is freed.
    assert process_usage(fake_env["FAKECUDA_STATE"], exporter.pid) == 2 * MB
    tool.ok(f"ck restore {exporter.pid}")
    tool.ok(f"ck unlock {exporter.pid}")
    assert process_usage(fake_env["FAKECUDA_STATE"], exporter.pid) == 6 * MB


def test_threads_of_one_process_checkpoint_two_pids_at_once(workers):
    a, b, tool = workers(), workers(), workers()
    for w in (a, b):
        w.ok("alloc x 0x200000")
        w.ok("set32 x 0x77")
        w.ok("sleep_kernel 300000")  # keeps both lock calls in flight together
    assert tool.ok(f"ck lock {a.pid} {b.pid}") == ["CUDA_SUCCESS", "CUDA_SUCCESS"]
    assert tool.ok(f"ck checkpoint {a.pid} {b.pid}") == ["CUDA_SUCCESS", "CUDA_SUCCESS"]
    assert tool.ok(f"ck restore {a.pid} {b.pid}") == ["CUDA_SUCCESS", "CUDA_SUCCESS"]
    assert tool.ok(f"ck unlock {a.pid} {b.pid}") == ["CUDA_SUCCESS", "CUDA_SUCCESS"]
    assert a.ok("get32 x") == b.ok("get32 x") == ["0x77"]


def checkpoint_call_in_flight(state_dir: str) -> bool:
    """True while some process holds the fake's node-wide checkpoint-call lock."""
    fd = os.open(os.path.join(state_dir, "checkpoint-calls.lock"), os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def test_checkpoint_calls_from_two_processes_at_once_are_caught(workers, fake_env):
    a, b, tool1, tool2 = workers(), workers(), workers(), workers()
    a.ok("sleep_kernel 1000000")  # tool1's lock stays in flight while tool2 calls
    tool1.send(f"ck lock {a.pid}")
    deadline = time.monotonic() + 10
    while not checkpoint_call_in_flight(fake_env["FAKECUDA_STATE"]):
        assert time.monotonic() < deadline, "tool1's lock call never started"
        time.sleep(0.01)
    assert tool2.ok(f"ck lock {b.pid}") == ["CUDA_ERROR_NOT_PERMITTED"]
    assert tool1.reply() == ["ok", "CUDA_SUCCESS"]
    tool2.proc.stdin.close()
    assert "fakecuda: concurrent checkpoint calls from two processes (the real driver hangs)" in \
        tool2.proc.stderr.read()
    # One after the other is fine.
    assert tool1.ok(f"ck unlock {a.pid}") == ["CUDA_SUCCESS"]


def test_restore_remaps_devices_by_uuid(workers):
    target, tool = workers(), workers()
    target.ok("alloc a 0x200000")
    target.ok("set32 a 0x99")
    checkpoint(tool, target.pid)
    assert tool.ok(f"restore_map {target.pid} 0 1") == ["CUDA_SUCCESS"]
    tool.ok(f"ck unlock {target.pid}")
    assert target.ok("get32 a") == ["0x99"]


def test_restore_with_a_gpu_map_missing_a_checkpointed_gpu_is_refused(workers):
    target, tool = workers(), workers()
    target.ok("alloc a 0x200000")
    checkpoint(tool, target.pid)
    assert tool.ok(f"restore_map {target.pid} 1 0") == ["CUDA_ERROR_INVALID_VALUE"]
    assert tool.ok(f"state {target.pid}") == [CHECKPOINTED]
    assert tool.ok(f"ck restore {target.pid}") == ["CUDA_SUCCESS"]
    tool.ok(f"ck unlock {target.pid}")


def test_injected_lock_failure(workers):
    target = workers()
    tool = workers(FAKECUDA_FAIL="cuCheckpointProcessLock=1:2")
    assert tool.ok(f"ck lock {target.pid}") == ["CUDA_ERROR_OUT_OF_MEMORY"]
    assert tool.ok(f"state {target.pid}") == [RUNNING]
    assert tool.ok(f"ck lock {target.pid}") == ["CUDA_SUCCESS"]
    tool.ok(f"ck unlock {target.pid}")


def test_injected_checkpoint_failure_inside_the_target(workers):
    target = workers(FAKECUDA_FAIL="cuCheckpointProcessCheckpoint=1:2")
    tool = workers()
    target.ok("alloc a 0x200000")
    target.ok("set32 a 0x5")
    assert tool.ok(f"ck lock {target.pid}") == ["CUDA_SUCCESS"]
    assert tool.ok(f"ck checkpoint {target.pid}") == ["CUDA_ERROR_OUT_OF_MEMORY"]
    assert tool.ok(f"state {target.pid}") == [LOCKED]
    assert tool.ok(f"ck checkpoint {target.pid}") == ["CUDA_SUCCESS"]
    tool.ok(f"ck restore {target.pid}")
    tool.ok(f"ck unlock {target.pid}")
    assert target.ok("get32 a") == ["0x5"]
