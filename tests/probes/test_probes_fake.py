"""The driver probes of this directory, run against the fake driver.

tests/gpu/test_driver_probes.py runs the same probe programs and the same sequences
(probe_scenarios.py) on the H200; here they check that the fake driver models the facts of
tests/probes/README.md lists, which the product relies on. Where the fake deliberately differs, the test says
so. Sizes are small: the facts do not depend on size, and rates on the fake mean nothing.
"""
from __future__ import annotations

import os
import signal
import time

import pytest
from probe_harness import CheckpointRun, ProbeSession
from probe_scenarios import (DRIVER_FACTS, IMPORTER_CYCLE, LAZY_IPC_FACTS,
                             LAZY_IPC_FACTS_FIRST_HANDLE_AFTER, LAZY_IPC_SIZES, SUCCESS, all_succeeded,
                             driver_cycle, exporter_checkpoint, importer_cycle, lazy_ipc_cycle,
                             lazy_ipc_facts, one_probe_line, released_importer_cycle, tool_copy)

pytestmark = pytest.mark.timeout(90)

MIB = 8
STEP = {op: index for index, op in enumerate(IMPORTER_CYCLE)}


@pytest.fixture
def probes(fake_env, tmp_path):
    with ProbeSession(tmp_path / "rv", fake_env) as session:
        yield session


def assert_stuck_after_failed_restore(run, expected_restore):
    results = [run.call(STEP[op])["result"] for op in IMPORTER_CYCLE]
    assert results[:2] == [SUCCESS, SUCCESS], f"lock + checkpoint of an importer: {run}"
    assert results[2] == expected_restore, f"importer restore: {run}"
    assert run.call(STEP["state"]).get("state") == DRIVER_FACTS["stuck_state"], run
    assert results[4] == DRIVER_FACTS["stuck_unlock"], f"unlock of a stuck importer: {run}"


def test_legacy_ipc_importer_restore_fails_and_stays_checkpointed(probes):
    importer, run = importer_cycle(probes, "ipc", MIB)
    assert importer["data_ok"], "the importer did not see the exporter's data"
    assert_stuck_after_failed_restore(run, DRIVER_FACTS["ipc_importer_restore"])


def test_cumem_fd_importer_restore_not_supported_and_stays_checkpointed(probes):
    importer, run = importer_cycle(probes, "fd", MIB)
    assert importer["data_ok"], "the importer did not see the exporter's data"
    assert_stuck_after_failed_restore(run, DRIVER_FACTS["fd_importer_restore"])


def test_released_importer_checkpoints_and_reimports_at_same_va(probes):
    seen = released_importer_cycle(probes, MIB)
    assert all_succeeded(seen["run"]), seen["run"]
    reimported = seen["reimported"]
    assert reimported["va"] == seen["importer"]["va"] == seen["released"]["va"]
    assert reimported["data_ok"], f"data after re-import differs at offset {reimported['bad_offset']}"


def test_exported_fd_stays_open_after_checkpoint(probes):
    # The real driver shows the fd on /dev/nvidiactl; the fake's exports are memfds. What matters
    # (and is checked on both) is that the driver checkpoint leaves the fd open.
    seen = exporter_checkpoint(probes, MIB)
    assert all_succeeded(seen["run"]), seen["run"]
    assert seen["target_before"] is not None
    assert seen["target_after"] == seen["target_before"], seen
    pid = seen["exporter"]["pid"]
    back = probes.checkpoint(f"restore:{pid}", f"unlock:{pid}")
    assert all_succeeded(back), back
    assert probes.request("exporter", "verify")["data_ok"]


@pytest.mark.parametrize("nbytes", [4096, 1 << 20])
def test_legacy_ipc_of_memory_the_driver_restores(probes, nbytes):
    assert lazy_ipc_facts(lazy_ipc_cycle(probes, nbytes)) == LAZY_IPC_FACTS


@pytest.mark.parametrize("nbytes", LAZY_IPC_SIZES)
def test_legacy_ipc_handle_first_taken_after_the_restore_opens(probes, nbytes):
    facts = lazy_ipc_facts(lazy_ipc_cycle(probes, nbytes, lazy=True))
    assert facts == LAZY_IPC_FACTS_FIRST_HANDLE_AFTER


def test_driver_cycle_in_place_keeps_contents(probes):
    # On the GPU this probe measures the driver's checkpoint/restore GB/s; here it checks the cycle.
    holder = probes.start_holder("holder", 3 * MIB)
    run, verified = driver_cycle(probes, {"holder": holder})
    assert all_succeeded(run), run
    assert verified["holder"]["data_ok"], verified


def test_checkpoint_calls_at_once_from_threads_of_one_process(probes):
    holders = {name: probes.start_holder(name, MIB, seed=n)
               for n, name in enumerate(("holder-a", "holder-b"))}
    run, verified = driver_cycle(probes, holders)
    assert all_succeeded(run), run
    assert len(run.calls) == 8
    assert all(v["data_ok"] for v in verified.values()), verified


def test_tool_copy_streams_an_export_through_a_ring_and_checks_digests(probes):
    # 160 MiB = 64 + 64 + 32 MiB chunks through 2 buffers: the ring wraps and the last chunk is short.
    rc, fields, output = tool_copy(probes, 160, buffers=2, threads=2)
    assert rc == 0, output
    assert fields["data_ok"] == "True" and fields["chunks"] == "3", fields


def test_pinned_copy_probe_reports_rates(probes):
    rc, output = probes.run_program("copy_rates", "copy_rates.py", "--size-mib", 4, "--reps", 1,
                                    timeout=60)
    assert rc == 0, output
    fields = one_probe_line(output, "pinned_copy")
    assert all(float(fields[k]) > 0 for k in ("h2d_gbps", "d2h_gbps", "d2h_chunked_gbps")), fields


def test_host_rates_probe_reports_hashing_and_disk(probes, tmp_path):
    rc, output = probes.run_program("host_rates", "host_rates.py", "--hash-mib", 16, "--threads", 2,
                                    "--disk-dir", tmp_path, "--disk-mib", 16, timeout=60)
    assert rc == 0, output
    assert float(one_probe_line(output, "xxhash")["threaded_gbps"]) > 0
    disk = one_probe_line(output, "disk_write")
    assert disk["mib"] == "16" and disk["odirect"] in ("yes", "no") and float(disk["gbps"]) > 0
    assert list(tmp_path.glob("host_rates.*")) == [], "the probe left its file behind"


def test_checkpoint_calls_at_once_from_two_processes_are_detected(probes, fake_env):
    # The real driver hangs here (never run on a GPU); the fake fails the overlapping call with
    # NOT_PERMITTED and says why. To make the overlap certain, holder A is SIGSTOPped: a call on
    # it cannot finish (its restore thread cannot answer) and holds the node-wide call lock.
    a = probes.start_holder("holder-a", MIB)["pid"]
    b = probes.start_holder("holder-b", MIB, seed=2)["pid"]
    first = start_checkpointer_at_barrier(probes, "first", f"lock:{a}")
    second = start_checkpointer_at_barrier(probes, "second", f"lock:{b}")
    os.kill(a, signal.SIGSTOP)
    try:
        probes.announce("first.go")
        wait_until_flock_held(os.path.join(fake_env["FAKECUDA_STATE"], "checkpoint-calls.lock"))
        probes.announce("second.go")
        second.wait(30)
    finally:
        os.kill(a, signal.SIGCONT)
    first.wait(30)
    overlapping = CheckpointRun([f"lock:{b}"], second.returncode, probes.log("second"))
    alone = CheckpointRun([f"lock:{a}"], first.returncode, probes.log("first"))
    assert overlapping.call(0)["result"] == "CUDA_ERROR_NOT_PERMITTED", overlapping
    assert "concurrent checkpoint calls from two processes" in overlapping.output
    assert alone.call(0)["result"] == SUCCESS, "the first caller must not be disturbed"


def start_checkpointer_at_barrier(probes, name, *steps):
    proc = probes.start(name, "checkpointer.py", "--barrier", probes.dir, name, *steps, role=False)
    probes.wait_for(f"{name}.ready")
    return proc


def wait_until_flock_held(path, timeout=20.0):
    """Until /proc/locks shows a FLOCK on `path` (a checkpoint call is in progress)."""
    deadline = time.monotonic() + timeout
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.01)
    inode = os.stat(path).st_ino
    while time.monotonic() < deadline:
        with open("/proc/locks") as f:
            if any(" FLOCK " in line and line.split()[5].endswith(f":{inode}") for line in f):
                return
        time.sleep(0.01)
    raise AssertionError(f"no flock on {path} after {timeout} s")
