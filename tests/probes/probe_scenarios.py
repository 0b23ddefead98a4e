"""The probe sequences behind the driver facts (tests/probes/README.md), shared by the fake-driver and the GPU tests.

Each function drives probe programs through a ProbeSession and returns what it saw; the tests
assert. The expected driver answers are named here once (DRIVER_FACTS), so that the fake driver's
test and the GPU test check the very same facts.
"""
from __future__ import annotations

from probe_harness import CheckpointRun, ProbeSession, fd_target, nvidia_fds, parse_probe_lines

SUCCESS = "CUDA_SUCCESS"
CHECKPOINTED = "CU_PROCESS_STATE_CHECKPOINTED"
RUNNING = "CU_PROCESS_STATE_RUNNING"

# What the driver answers (H200, driver 580.159.04; tests/probes/README.md).
DRIVER_FACTS = {
    "ipc_importer_restore": "CUDA_ERROR_INVALID_VALUE",
    "fd_importer_restore": "CUDA_ERROR_NOT_SUPPORTED",
    "stuck_state": CHECKPOINTED,
    "stuck_unlock": "CUDA_ERROR_ILLEGAL_STATE",
}

# The step list of an importer's full driver cycle (indices used by the tests).
IMPORTER_CYCLE = ("lock", "checkpoint", "restore", "state", "unlock")


def importer_cycle(session: ProbeSession, kind, mib):
    """Exporter + importer sharing `mib` MiB by `kind` (ipc|fd); the importer alone goes
    lock, checkpoint, restore, state, unlock. Returns (importer ready payload, CheckpointRun)."""
    session.start_exporter(kind, mib)
    importer = session.start_importer(kind, mib)
    pid = importer["pid"]
    run = session.checkpoint(*(f"{op}:{pid}" for op in IMPORTER_CYCLE))
    return importer, run


def released_importer_cycle(session: ProbeSession, mib):
    """cuMem-fd pair; the importer releases its import, both are locked, checkpointed, restored
    and unlocked from threads of one checkpointer, then the importer re-imports a fresh fd at the
    same VA. Returns dict(importer, released, run, reimported)."""
    exporter = session.start_exporter("fd", mib)
    importer = session.start_importer("fd", mib)
    released = session.request("importer", "release")
    pids = f"{exporter['pid']},{importer['pid']}"
    run = session.checkpoint(f"lock:{pids}", f"checkpoint:{pids}", f"restore:{pids}",
                             f"unlock:{pids}")
    reimported = session.request("importer", "reimport") if all_succeeded(run) else None
    return {"importer": importer, "released": released, "run": run, "reimported": reimported}


def exporter_checkpoint(session: ProbeSession, mib):
    """cuMem-fd exporter keeping its exported fd; lock + checkpoint it (left CHECKPOINTED: the
    caller restores it). Returns dict(exporter, target_before, run, target_after,
    nvidia_fds_after: the /dev/nvidia* fds still open after the checkpoint)."""
    exporter = session.start_exporter("fd", mib)
    pid, fd = exporter["pid"], exporter["fd"]
    before = fd_target(pid, fd)
    run = session.checkpoint(f"lock:{pid}", f"checkpoint:{pid}")
    return {"exporter": exporter, "target_before": before, "run": run,
            "target_after": fd_target(pid, fd), "nvidia_fds_after": nvidia_fds(pid)}


def driver_cycle(session: ProbeSession, holders, lock_timeout_ms=10000):
    """lock, checkpoint, restore, unlock of every holder pid at once (threads of one checkpointer),
    then each holder verifies its memory. Returns (CheckpointRun, {name: verify answer})."""
    pids = ",".join(str(h["pid"]) for h in holders.values())
    run = session.checkpoint(f"lock:{pids}", f"checkpoint:{pids}", f"restore:{pids}",
                             f"unlock:{pids}", lock_timeout_ms=lock_timeout_ms)
    verified = {name: session.request(name, "verify") for name in holders} if all_succeeded(run) else {}
    return run, verified


def all_succeeded(run: CheckpointRun):
    return (run.returncode == 0 and run.complete()
            and all(c["result"] == SUCCESS for c in run.calls))


def rates(run: CheckpointRun, total_bytes):
    """GB/s of the checkpoint (step 1) and restore (step 2) steps of a driver_cycle run."""
    return {"checkpoint_s": run.step_secs[1], "restore_s": run.step_secs[2],
            "checkpoint_gbps": round(total_bytes / run.step_secs[1] / 1e9, 2),
            "restore_gbps": round(total_bytes / run.step_secs[2] / 1e9, 2)}


def one_probe_line(output, name):
    """The fields of the single `PROBE name ...` line in `output`."""
    lines = [f for f in parse_probe_lines(output) if f["probe"] == name]
    assert len(lines) == 1, f"expected one PROBE {name} line in:\n{output}"
    return lines[0]


def tool_copy(session: ProbeSession, mib, buffers=8, threads=8, timeout=240):
    """A cuMem-fd exporter of `mib` MiB and tool_copy.py importing and streaming it out.
    Returns (returncode, PROBE tool_copy fields, output)."""
    session.start_exporter("fd", mib)
    rc, output = session.run_program("tool", "tool_copy.py", "--dir", session.dir, "--size-mib", mib,
                                     "--buffers", buffers, "--threads", threads, timeout=timeout)
    fields = one_probe_line(output, "tool_copy") if rc in (0, 1) else None
    return rc, fields, output
