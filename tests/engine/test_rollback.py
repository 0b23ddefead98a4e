"""Failures: every step of suspend rolls back and says which step failed; a failed resume can be
retried once the cause is fixed; what cannot be suspended is refused before anything changes."""
import json
import os

import pytest

from criu_gpushare.shimctl import client as control

from lctest import (assert_runs_as_before, assert_shared, pair, resume, shim_state,
                    suspend, values, wait_for, write)
from shimtest import fake_only

ROLLED_BACK = "rolled back, the workload runs as before"


@fake_only
@pytest.mark.parametrize("step, fail", [
    ("lock", "cuCheckpointProcessLock=1"),
    ("checkpoint", "cuCheckpointProcessCheckpoint=1"),
])
def test_driver_failure_rolls_back(lc, workload, tmp_path, step, fail):
    a, b = pair(lc, workload, tmp_path)
    r = suspend(lc, a.pid, b.pid, ok=False, env=dict(lc.tool, FAKECUDA_FAIL=fail))
    assert r.returncode != 0
    assert f"failed at step {step}" in r.stderr and ROLLED_BACK in r.stderr, r.stderr
    # its memory came back as the memory its shim kept, untouched (no load needed)
    assert all(x["intact"] for x in control.status(a.pid)["allocations"])
    assert "load..." in r.stderr and "loaded" not in r.stderr, r.stderr
    assert_runs_as_before(lc, a, b)


@pytest.mark.parametrize("step", ["quiesce", "release", "void", "lock", "freeze", "checkpoint",
                                  "save", "unkeep"])
def test_failure_after_each_step_rolls_back(lc, workload, tmp_path, step):
    """Every suspend step, failing after it did its work, is undone with the steps before it."""
    a, b = pair(lc, workload, tmp_path)
    r = suspend(lc, a.pid, b.pid, ok=False, env=dict(lc.tool, CRIU_GPUSHARE_FAULT=step))
    assert r.returncode != 0
    assert f"failed at step {step}" in r.stderr and ROLLED_BACK in r.stderr, r.stderr
    assert_runs_as_before(lc, a, b)


def test_unwritable_store_rolls_back(lc, workload, tmp_path):
    a, b = pair(lc, workload, tmp_path)
    not_a_dir = tmp_path / "store-is-a-file"
    not_a_dir.write_text("")
    r = suspend(lc, a.pid, b.pid, ok=False, env=dict(lc.tool, CRIU_GPUSHARE_STORE=str(not_a_dir)))
    assert r.returncode != 0
    assert "failed at step save" in r.stderr and ROLLED_BACK in r.stderr, r.stderr
    assert_runs_as_before(lc, a, b)


@fake_only
def test_release_failure_in_one_process_rolls_back_both(lc, workload, tmp_path):
    # The importer's first cuMemUnmap is the shim's release of its import mapping.
    a, b = pair(lc, workload, tmp_path, b_env={"FAKECUDA_FAIL": "cuMemUnmap=1"})
    r = suspend(lc, a.pid, b.pid, ok=False)
    assert r.returncode != 0
    assert "failed at step release" in r.stderr and ROLLED_BACK in r.stderr, r.stderr
    assert "cuMemUnmap of import" in r.stderr
    assert_runs_as_before(lc, a, b)


@fake_only
def test_shim_refusal_rolls_back(lc, workload, tmp_path):
    """A shim that refuses a step (multicast objects: not supported by suspend yet)."""
    a, b = pair(lc, workload, tmp_path)
    b.do("cumem mcmem 2097152")
    b.do("mc mcmem")
    r = suspend(lc, a.pid, b.pid, ok=False)
    assert r.returncode != 0
    assert "failed at step release" in r.stderr and "multicast" in r.stderr, r.stderr
    assert ROLLED_BACK in r.stderr
    assert values(b, "buf") == [42] * 4
    assert_shared(a, b)


def test_busy_quiesce_times_out_and_reopens(lc, workload, tmp_path):
    a, b = pair(lc, workload, tmp_path)
    a.do("sleep 3000000")  # a 3 s kernel: the GPU does not drain within the timeout
    r = suspend(lc, a.pid, b.pid, ok=False, args=("--timeout", "0.5"))
    assert r.returncode == 7, r.stderr  # BusyError
    assert "failed at step quiesce" in r.stderr and ROLLED_BACK in r.stderr, r.stderr
    a.do("sync", timeout=10)
    assert_runs_as_before(lc, a, b)


@fake_only
@pytest.mark.parametrize("step, fail", [("restore", "cuCheckpointProcessRestore=1"),
                                        ("unlock", "cuCheckpointProcessUnlock=1")])
def test_failed_resume_is_retried(lc, workload, tmp_path, step, fail):
    """The holder was started with the failure injected: its first resume fails at that step."""
    a, b = pair(lc, workload, tmp_path)
    suspend(lc, a.pid, b.pid, env=dict(lc.tool, FAKECUDA_FAIL=fail))
    r = resume(lc, a.pid, ok=False)
    assert r.returncode != 0
    assert f"resume failed at step {step}" in r.stderr and "resume again" in r.stderr, r.stderr
    status = lc.cli("status", a.pid)
    assert "suspended by criu-gpushare" in status.stdout
    resume(lc, b.pid)
    assert values(b, "buf") == [42] * 4
    assert_shared(a, b)


@fake_only
def test_failed_recreate_is_retried(lc, workload, tmp_path):
    # The exporter's first cuMemCreate is its own; the second is the shim's re-creation.
    a, b = pair(lc, workload, tmp_path, a_env={"FAKECUDA_FAIL": "cuMemCreate=2"})
    suspend(lc, a.pid, b.pid)
    r = resume(lc, a.pid, ok=False)
    assert r.returncode != 0
    assert "resume failed at step recreate" in r.stderr and "cuMemCreate" in r.stderr, r.stderr
    resume(lc, a.pid)
    assert values(b, "buf") == [42] * 4
    assert_shared(a, b)


def test_store_moved_away_then_back(lc, workload, tmp_path):
    a, b = pair(lc, workload, tmp_path)
    suspend(lc, a.pid, b.pid)
    os.rename(lc.store, lc.store + ".away")
    r = resume(lc, a.pid, ok=False)
    # found before anything changes: the driver restore has not even begun
    assert r.returncode == 6 and "no store here" in r.stderr and "restore..." not in r.stderr, r.stderr
    os.rename(lc.store + ".away", lc.store)
    resume(lc, a.pid)
    assert values(b, "buf") == [42] * 4
    assert_shared(a, b)


def test_cuda_process_without_shim_refused(lc, workload, tmp_path):
    a, b = pair(lc, workload, tmp_path)
    plain = workload(lc.tool)  # CUDA, no shim
    plain.do("malloc x 4096")
    r = suspend(lc, a.pid, b.pid, plain.pid, ok=False)
    assert r.returncode == 5, r.stderr
    assert f"process {plain.pid}: uses CUDA without the criu-gpushare shim" in r.stderr
    assert "quiesce" not in r.stderr  # refused before anything changed
    assert shim_state(lc, a.pid) == "running"
    assert_shared(a, b)


def test_importer_outside_the_group_refused(lc, workload, tmp_path):
    a, b = pair(lc, workload, tmp_path)
    r = suspend(lc, a.pid, ok=False)
    assert r.returncode == 5, r.stderr
    assert f"process {b.pid}" in r.stderr and "suspend them together" in r.stderr
    assert shim_state(lc, a.pid) == "running"
    assert_shared(a, b)


def test_status_json_shows_state(lc, workload, tmp_path):
    a, b = pair(lc, workload, tmp_path)
    suspend(lc, a.pid, b.pid)
    st = json.loads(lc.cli("status", b.pid, "--json").stdout)
    assert st["state"] == "released"
    assert all(i["dropped"] for i in st["imports"])
    assert st["gates"]["launch"]["closed"] and st["gates"]["memory"]["closed"]
    listing = lc.cli("status").stdout
    assert "suspended" in listing
    resume(lc, a.pid)
    wait_for(lambda: shim_state(lc, b.pid) == "running", what="state running")


@fake_only
def test_failed_rollback_keeps_the_group_held_for_resume(lc, workload, tmp_path):
    """The lock fails, then the rollback's re-creation fails too (the exporter's first import: of
    the memory its shim kept): the group stays held, and `resume` retries the rollback."""
    a, b = pair(lc, workload, tmp_path, a_env={"FAKECUDA_FAIL": "cuMemImportFromShareableHandle=1"})
    r = suspend(lc, a.pid, b.pid, ok=False,
                env=dict(lc.tool, FAKECUDA_FAIL="cuCheckpointProcessLock=1"))
    assert r.returncode != 0
    assert "failed at step lock" in r.stderr and "the rollback failed too" in r.stderr, r.stderr
    assert "held by criu-gpushare" in lc.cli("status", a.pid).stdout
    resume(lc, b.pid)
    assert_runs_as_before(lc, a, b)


@fake_only
def test_a_member_another_tool_has_locked_is_refused_naming_it(lc, workload, tmp_path):
    """Another checkpoint tool holds b locked in the driver: refused before anything changes,
    naming b and its state; a stays running and free, b is left to the other tool."""
    import subprocess
    import sys
    from shimtest import ROOT
    a, b = pair(lc, workload, tmp_path)
    other = subprocess.Popen([sys.executable, os.path.join(ROOT, "tests", "fake", "cuda_worker.py")],
                             env={k: v for k, v in lc.tool.items() if k != "LD_PRELOAD"},
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout.readline().split()[:2] == ["ok", "ready"]
        other.stdin.write(f"ck lock {b.pid}\n")
        other.stdin.flush()
        assert other.stdout.readline().split()[:2] == ["ok", "CUDA_SUCCESS"]
        r = suspend(lc, a.pid, b.pid, ok=False)
        assert r.returncode == 5 and f"process {b.pid}" in r.stderr and "locked" in r.stderr, r.stderr
        assert not [f for f in os.listdir(lc.run_dir) if f.startswith(("pid-", "journal-"))]
        assert shim_state(lc, a.pid) == "running"
        other.stdin.write(f"ck unlock {b.pid}\n")
        other.stdin.flush()
        assert other.stdout.readline().split()[:2] == ["ok", "CUDA_SUCCESS"]
        assert_runs_as_before(lc, a, b)
    finally:
        other.kill()
        other.wait()


def test_memory_allocated_during_the_suspend_is_refused_before_anything_is_released(lc, workload):
    """A thread that allocates without launching is not held by the gates: what it holds at the
    release may not be what was planned. The suspend must then fail before the release, never
    drop memory nobody saves. Whether the thread allocated in the few milliseconds between the
    plan and the release is timing (on the real driver it mostly did not): either way nothing is
    lost."""
    a = workload()
    a.do(f"malloc keep {4 << 20}")
    write(a, "keep", 9)
    a.do("allocloop 600")
    r = suspend(lc, a.pid, ok=False)
    if r.returncode != 0:
        assert "allocated or freed GPU memory while it was being suspended" in r.stderr, r.stderr
        assert ROLLED_BACK in r.stderr
    else:
        resume(lc, a.pid)
    assert shim_state(lc, a.pid) == "running"
    assert values(a, "keep") == [9] * 4


def test_a_rollback_from_kept_memory_lets_the_memory_be_shared_and_suspended_again(lc, workload, tmp_path):
    """The exporter's memory came back as the memory its shim kept (an import of its own fd, which
    the driver will not export again): the importer attaches to it, and the next suspend and
    resume of the group move it as any other memory."""
    a, b = pair(lc, workload, tmp_path)
    r = suspend(lc, a.pid, b.pid, ok=False, env=dict(lc.tool, CRIU_GPUSHARE_FAULT="freeze"))
    assert ROLLED_BACK in r.stderr, r.stderr
    assert all(x["intact"] for x in control.status(a.pid)["allocations"])
    assert_runs_as_before(lc, a, b)
    write(a, "buf", 9)
    suspend(lc, a.pid, b.pid)
    assert not any(x["kept"] for x in control.status(a.pid)["allocations"])  # dropped: freed
    resume(lc, a.pid)
    assert values(b, "buf") == [9] * 4
    assert_shared(a, b, value=9)
