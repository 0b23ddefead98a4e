"""The driver facts of tests/probes/README.md, probed on the real GPU (one test per row).

The probe programs are those of tests/probes/, which test_probes_fake.py runs against the fake
driver. Each test bounds itself (pytest-timeout plus timeouts on every wait and subprocess) and its
ProbeSession SIGKILLs every process it started, including those left stuck CHECKPOINTED. Figures
go through probe_harness.record() into $PROBE_RECORD, which scripts/gpu-tests.sh summarises.
Sizes are small where the fact does not depend on size, to keep the suite within ~6 minutes.
"""
from __future__ import annotations

import os

import pytest
from criu_runner import run_criu
from probe_harness import PROBES_DIR, nvidia_fds, record
from probe_scenarios import (DRIVER_FACTS, IMPORTER_CYCLE, LAZY_IPC_FACTS, LAZY_IPC_FACTS_DRIVER_580,
                             LAZY_IPC_FACTS_FIRST_HANDLE_AFTER, LAZY_IPC_SIZES,
                             SUCCESS, all_succeeded,
                             driver_cycle, exporter_checkpoint, importer_cycle, lazy_ipc_cycle,
                             lazy_ipc_facts, one_probe_line, rates, released_importer_cycle,
                             tool_copy)

SHARE_MIB = 256            # importer/exporter facts do not depend on size
CRIU_MIB = 1024            # single process through CRIU
THROUGHPUT_MIB = 4096      # driver checkpoint/restore in place
PARALLEL_MIB = 2048        # each of two processes checkpointed from threads of one process
TOOL_MIB = 4096            # tool-process import + copy-out + hash
PINNED_MIB = 1024
PCIE_CEILING_GBPS = 55.0   # pinned copies each way on the H200 (tests/probes/README.md)

STEP = {op: index for index, op in enumerate(IMPORTER_CYCLE)}


def cycle_figures(run):
    """lock=... checkpoint=... restore=... unlock=... results and the state seen after restore."""
    figures = {op: run.call(STEP[op])["result"] for op in IMPORTER_CYCLE if op != "state"}
    figures["state"] = run.call(STEP["state"]).get("state", run.call(STEP["state"])["result"])
    return figures


def assert_stuck_after_failed_restore(run, expected_restore):
    results = [run.call(STEP[op])["result"] for op in IMPORTER_CYCLE]
    assert results[:2] == [SUCCESS, SUCCESS], f"lock + checkpoint of an importer: {run}"
    assert results[2] == expected_restore, f"importer restore: {run}"
    assert run.call(STEP["state"]).get("state") == DRIVER_FACTS["stuck_state"], run
    assert results[4] == DRIVER_FACTS["stuck_unlock"], f"unlock of a stuck importer: {run}"


@pytest.mark.timeout(120)
def test_legacy_ipc_importer_restore_fails_and_stays_checkpointed(probes):
    """Legacy-IPC importer: lock+checkpoint succeed; restore INVALID_VALUE; stuck CHECKPOINTED."""
    importer, run = importer_cycle(probes, "ipc", SHARE_MIB)
    record("ipc_importer", **cycle_figures(run))
    assert importer["data_ok"], "the importer did not see the exporter's data"
    assert_stuck_after_failed_restore(run, DRIVER_FACTS["ipc_importer_restore"])


@pytest.mark.timeout(120)
def test_cumem_fd_importer_restore_not_supported_and_stays_checkpointed(probes):
    """cuMem-fd importer: restore NOT_SUPPORTED; stuck CHECKPOINTED (unlock ILLEGAL_STATE)."""
    importer, run = importer_cycle(probes, "fd", SHARE_MIB)
    record("fd_importer", **cycle_figures(run))
    assert importer["data_ok"], "the importer did not see the exporter's data"
    assert_stuck_after_failed_restore(run, DRIVER_FACTS["fd_importer_restore"])


@pytest.mark.timeout(120)
def test_released_importer_checkpoints_and_reimports_at_same_va(probes):
    """Importer that released its import: checkpoint/restore/unlock work; re-import at same VA."""
    seen = released_importer_cycle(probes, SHARE_MIB)
    run, reimported = seen["run"], seen["reimported"]
    record("released_importer", cycle=all_succeeded(run),
           same_va=bool(reimported and reimported["va"] == seen["importer"]["va"]),
           data_ok=bool(reimported and reimported["data_ok"]))
    assert all_succeeded(run), run
    assert reimported["va"] == seen["importer"]["va"] == seen["released"]["va"], (
        f"re-imported at {reimported['va']:#x}, first mapped at {seen['importer']['va']:#x}")
    assert reimported["data_ok"], f"data after re-import differs at offset {reimported['bad_offset']}"


@pytest.mark.timeout(180)
@pytest.mark.parametrize("nbytes", [4096, 1 << 20])
def test_legacy_ipc_of_memory_the_driver_restores(probes, nbytes):
    """A small cuMemAlloc through two driver cycles: its range needs a current context (the shim's
    ipcget pushes the owner's); a handle from before does not open, and on driver 580 one taken
    after does not open either (LAZY_IPC_FACTS_DRIVER_580)."""
    seen = lazy_ipc_cycle(probes, nbytes)
    facts = lazy_ipc_facts(seen)
    again = seen["again"] or {}
    record("lazy_ipc", bytes=nbytes, range=seen["ready"]["queries"]["main_range"],
           same_handle_bytes=again.get("same_bytes"),
           **{key: value for key, value in facts.items() if value != LAZY_IPC_FACTS[key]})
    assert facts == LAZY_IPC_FACTS_DRIVER_580, probes.describe()


@pytest.mark.parametrize("nbytes", LAZY_IPC_SIZES)
def test_legacy_ipc_handle_first_taken_after_the_restore_opens(probes, nbytes):
    """The fact the shim's lazy handles rest on: the exporter takes no driver handle before two
    driver cycles, its first one after them opens in a new process on the same memory, at every
    size below the backing threshold. If driver 580 refuses it (as it refuses a handle taken after
    one from before), the record names the answer and lazy handles cannot survive a checkpoint."""
    seen = lazy_ipc_cycle(probes, nbytes, lazy=True)
    facts = lazy_ipc_facts(seen)
    record("lazy_ipc_first_after", bytes=nbytes, range=seen["ready"]["queries"]["main_range"],
           **{key: value for key, value in facts.items()
              if value != LAZY_IPC_FACTS_FIRST_HANDLE_AFTER.get(key)})
    assert facts == LAZY_IPC_FACTS_FIRST_HANDLE_AFTER, probes.describe()


@pytest.mark.timeout(120)
def test_exported_fd_stays_open_on_nvidia_device_after_checkpoint(probes):
    """Exporter keeping its exported fd: the fd is still open after the driver checkpoint."""
    seen = exporter_checkpoint(probes, SHARE_MIB)
    pid = seen["exporter"]["pid"]
    back = probes.checkpoint(f"restore:{pid}", f"unlock:{pid}")
    record("exporter_fd", before=seen["target_before"], after=seen["target_after"],
           nvidia_fds_after=len(seen["nvidia_fds_after"]), restore=back.call(0)["result"])
    assert all_succeeded(seen["run"]), seen["run"]
    assert seen["target_after"] is not None, "the exported fd was closed by the checkpoint"
    assert seen["target_after"].startswith("/dev/nvidia"), (
        f"the exported fd points at {seen['target_after']} (before: {seen['target_before']})")
    assert all_succeeded(back), f"restore + unlock of the exporter: {back}"


@pytest.mark.timeout(240)
@pytest.mark.criu
def test_criu_dump_of_exporter_with_open_fd_fails(probes, criu_bin, image_dir):
    """CRIU cannot dump the exporter's fd left on /dev/nvidia*: "Can't dump file ... of that type"."""
    seen = exporter_checkpoint(probes, SHARE_MIB)
    pid = seen["exporter"]["pid"]
    assert all_succeeded(seen["run"]), seen["run"]
    dump = run_criu(criu_bin, "dump", image_dir, ["-t", pid, "--leave-running"], probes.env)
    back = probes.checkpoint(f"restore:{pid}", f"unlock:{pid}")
    message = next((line.strip() for line in dump.log.splitlines() if "Can't dump file" in line), "")
    record("criu_dump_exporter", rc=dump.returncode, message=message or "-",
           restore_after=back.call(0)["result"])
    assert dump.returncode != 0, "criu dump of a process holding an exported fd succeeded"
    assert "Can't dump file" in message and "of that type" in message, dump.tail()
    assert all_succeeded(back), f"the exporter after the failed dump: {back}"


@pytest.mark.timeout(300)
@pytest.mark.criu
def test_single_process_driver_path_through_criu(probes, criu_bin, image_dir):
    """lock+checkpoint, criu dump, criu restore, driver restore+unlock: contents intact."""
    holder = probes.start_holder("holder", CRIU_MIB)
    pid = holder["pid"]
    out = probes.checkpoint(f"lock:{pid}", f"checkpoint:{pid}")
    assert all_succeeded(out), out
    fds_left = nvidia_fds(pid)
    dump = run_criu(criu_bin, "dump", image_dir, ["-t", pid], probes.env)
    assert dump.returncode == 0, f"criu dump: {dump.tail()}"
    probes.reap_role("holder")
    pidfile = image_dir / "restored.pid"
    restore = run_criu(criu_bin, "restore", image_dir, ["-d", "--pidfile", pidfile], probes.env)
    if pidfile.exists():
        probes.adopt(int(pidfile.read_text()))
    probes.adopt(pid)
    assert restore.returncode == 0, f"criu restore: {restore.tail()}"
    back = probes.checkpoint(f"restore:{pid}", f"unlock:{pid}")
    verified = probes.request("holder", "verify") if all_succeeded(back) else {}
    image_bytes = sum(f.stat().st_size for f in image_dir.iterdir() if f.is_file())
    record("driver_path_criu", mib=CRIU_MIB, checkpoint_s=out.step_secs[1], dump_s=dump.secs,
           image_mb=round(image_bytes / 1e6), restore_s=restore.secs,
           driver_restore_s=back.step_secs.get(0), nvidia_fds_at_dump=len(fds_left),
           data_ok=verified.get("data_ok"))
    assert all_succeeded(back), f"driver restore after criu restore: {back}"
    assert verified["data_ok"], f"contents differ at offset {verified['bad_offset']}"


@pytest.mark.timeout(240)
def test_driver_checkpoint_in_place_is_far_below_pcie(probes):
    """Driver checkpoint/restore of 4 GiB in place: GB/s well below the PCIe ceiling (the premise)."""
    holder = probes.start_holder("holder", THROUGHPUT_MIB)
    run, verified = driver_cycle(probes, {"holder": holder})
    assert all_succeeded(run), run
    figures = rates(run, THROUGHPUT_MIB << 20)
    record("driver_throughput", mib=THROUGHPUT_MIB, **figures, data_ok=verified["holder"]["data_ok"],
           pcie_ceiling_gbps=PCIE_CEILING_GBPS)
    assert verified["holder"]["data_ok"]
    # The product exists because the driver path is far below the link; if that stops being true,
    # the copy engine's reason to be changes: look again.
    assert figures["checkpoint_gbps"] < PCIE_CEILING_GBPS / 2, figures
    assert figures["restore_gbps"] < PCIE_CEILING_GBPS / 2, figures


@pytest.mark.timeout(120)
def test_pinned_copy_rate_is_above_20_gbps(probes):
    """Pinned host <-> device copies (one buffer, and 64 MiB chunks): > 20 GB/s each way."""
    rc, output = probes.run_program("copy_rates", "copy_rates.py", "--size-mib", PINNED_MIB,
                                    "--reps", 3, timeout=90)
    assert rc == 0, output
    fields = one_probe_line(output, "pinned_copy")
    record("pinned_copy", **{k: v for k, v in fields.items() if k != "probe"})
    for key in ("h2d_gbps", "d2h_gbps", "d2h_chunked_gbps"):
        assert float(fields[key]) > 20.0, fields


@pytest.mark.timeout(240)
def test_tool_process_copies_out_a_4gib_cumem_export(probes):
    """Tool process: import a 4 GiB cuMem export, copy out via pinned 64 MiB buffers + xxh3-128 threads.

    Eight pinned buffers on one stream, eight hashing threads; the digests must match the
    exporter's pattern; GB/s and the import time are reported."""
    rc, fields, output = tool_copy(probes, TOOL_MIB)
    assert fields is not None, output
    record("tool_copy", **{k: v for k, v in fields.items() if k != "probe"})
    assert rc == 0 and fields["data_ok"] == "True", output


@pytest.mark.timeout(120)
def test_xxhash_rates(probes):
    """xxh3-128 in Python, one thread and 8 threads (report)."""
    rc, output = probes.run_program("host_rates", "host_rates.py", "--hash-mib", 2048,
                                    "--threads", 8, timeout=90)
    assert rc == 0, output
    fields = one_probe_line(output, "xxhash")
    record("xxhash", **{k: v for k, v in fields.items() if k != "probe"})
    assert float(fields["one_thread_gbps"]) > 0 and float(fields["threaded_gbps"]) > 0


@pytest.mark.timeout(120)
def test_odirect_disk_write_rate(probes, tmp_path):
    """O_DIRECT write rate of the disk under $PROBE_DISK_DIR (default: the test's tmp dir) (report)."""
    directory = os.environ.get("PROBE_DISK_DIR") or str(tmp_path)
    rc, output = probes.run_program("disk", "host_rates.py", "--hash-mib", 64, "--disk-dir",
                                    directory, "--disk-mib", 2048, timeout=90)
    assert rc == 0, output
    fields = one_probe_line(output, "disk_write")
    record("disk_write", **{k: v for k, v in fields.items() if k != "probe"})
    assert float(fields["gbps"]) > 0


@pytest.mark.timeout(180)
def test_checkpoint_calls_at_once_from_threads_of_one_process(probes):
    """Two processes locked, checkpointed, restored, unlocked at once from threads of ONE process."""
    holders = {name: probes.start_holder(name, PARALLEL_MIB, seed=n)
               for n, name in enumerate(("holder-a", "holder-b"))}
    run, verified = driver_cycle(probes, holders)
    figures = rates(run, 2 * PARALLEL_MIB << 20) if all_succeeded(run) else {}
    record("threads_two_pids", mib_each=PARALLEL_MIB, **figures,
           data_ok=all(v["data_ok"] for v in verified.values()) if verified else False)
    assert all_succeeded(run), run
    assert all(v["data_ok"] for v in verified.values()), verified


def test_checkpoint_calls_at_once_from_two_processes_hang():
    """Two processes calling the checkpoint API at once: never run here."""
    pytest.skip("never run on a GPU: two processes calling cuCheckpointProcess* at once hang the "
                "real driver (calls never return and ignore SIGTERM; tests/probes/README.md) and can "
                "wedge the machine; tests/probes/test_probes_fake.py checks that the fake driver "
                "detects it")


@pytest.mark.timeout(180)
def test_torch_ipc_pair_lock_and_checkpoint_one_after_the_other(probes, torch_available):
    """torch.multiprocessing CUDA-IPC pair: lock+checkpoint producer, then consumer: both succeed."""
    probes.start("producer", "torch_ipc_pair.py", "--dir", probes.dir, "--size-mib", SHARE_MIB)
    ready = probes.wait_for("producer.ready", timeout=150)
    consumer = probes.wait_for("consumer.ready")
    producer_pid, consumer_pid = ready["pid"], ready["consumer_pid"]
    probes.adopt(consumer_pid)
    fds_before = nvidia_fds(consumer_pid)
    run = probes.checkpoint(f"lock:{producer_pid}", f"checkpoint:{producer_pid}",
                            f"lock:{consumer_pid}", f"checkpoint:{consumer_pid}")
    record("torch_ipc_pair", producer_lock=run.call(0)["result"],
           producer_checkpoint_s=run.call(1)["secs"], consumer_lock=run.call(2)["result"],
           consumer_checkpoint_s=run.call(3)["secs"], consumer_nvidia_fds=len(fds_before),
           consumer_nvidia_fds_after=len(nvidia_fds(consumer_pid)))
    assert consumer["data_ok"]
    assert all_succeeded(run), run
    # both processes stay CHECKPOINTED; the session SIGKILLs them (the consumer cannot be restored)


@pytest.mark.timeout(120)
@pytest.mark.criu
def test_criu_action_script_order(probes, criu_bin, image_dir):
    """Action scripts of a dump + restore of a trivial process: order, task state, CRTOOLS_* env."""
    record_file = probes.dir / "actions.txt"
    env = dict(probes.env, ACTION_RECORD=str(record_file))
    script = PROBES_DIR / "action_recorder.sh"
    sleeper = probes.start("sleeper", "/bin/sleep", "600", python=False)
    dump = run_criu(criu_bin, "dump", image_dir, ["-t", sleeper.pid, "--action-script", script], env)
    assert dump.returncode == 0, f"criu dump: {dump.tail()}"
    probes.reap_role("sleeper")
    pidfile = image_dir / "restored.pid"
    restore = run_criu(criu_bin, "restore", image_dir,
                       ["-d", "--pidfile", pidfile, "--action-script", script], env)
    probes.adopt(sleeper.pid)  # CRIU restores the same pid; the pidfile says so
    if pidfile.exists():
        probes.adopt(int(pidfile.read_text()))
    assert restore.returncode == 0, f"criu restore: {restore.tail()}"
    calls = [dict(f.split("=", 1) for f in line.split()) for line in record_file.read_text().splitlines()]
    record("criu_actions", order=",".join(f"{c['action']}:{c['state']}" for c in calls),
           env=";".join(f"{c['action']}:{c['env']}" for c in calls))
    actions = [c["action"] for c in calls]
    expected = ["pre-dump", "post-dump", "pre-restore", "post-restore", "pre-resume", "post-resume"]
    assert [a for a in actions if a in expected] == expected, actions
    state = {c["action"]: c["state"] for c in calls}
    assert state["pre-dump"] == "S", "the task runs (sleeps) at pre-dump"
    assert state["post-dump"] == "t", "the task is seized (ptrace stop) at post-dump"
    assert "CRTOOLS_INIT_PID" not in {c["action"]: c["env"] for c in calls}["pre-restore"]
