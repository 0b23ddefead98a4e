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

# Legacy CUDA IPC of memory the driver checkpoints itself (a cuMemAlloc below the shim's backing
# threshold), as the shim's lazy handles use it: lazy_ipc_facts() of a lazy_ipc_cycle().
LAZY_IPC_FACTS = {
    "cycles_ok": True,
    # the shim's control thread has no context: it must push one to ask the range
    "range_without_context": "CUDA_ERROR_INVALID_CONTEXT",
    "pointer_attributes_without_context": [SUCCESS, True],
    "range_with_owner_context_pushed_is_the_same": True,
    "range_kept_by_restore": True,
    "data_kept_by_restore": True,
    # a driver handle does not survive its exporter's restore: why the shim's handles are lazy
    "open_of_handle_from_before_restore": "CUDA_ERROR_INVALID_HANDLE",
    # the driver handle ipcget takes after the restore opens, on the same memory both ways
    "open_of_handle_taken_after_restore": SUCCESS,
    "importer_sees_the_data": True,
    "exporter_sees_the_importers_write": True,
}
# Measured on the H200 (driver 580.159.04, tests/gpu/test_driver_probes.py): a handle the exporter
# takes after the driver restored its memory does not open either (NOT_PERMITTED), for 4 KiB and
# 1 MiB alike, in this probe's sequence (two checkpointer processes, then the exporter's fresh
# handle). The fake still opens it. Through the shim the same memory does open after suspends on
# the H200 (tests/engine/test_cycles.py, [driver-memory]). One difference: the shim takes no
# driver handle before the checkpoints; LAZY_IPC_FACTS_FIRST_HANDLE_AFTER probes that sequence.
LAZY_IPC_FACTS_DRIVER_580 = dict(LAZY_IPC_FACTS, open_of_handle_taken_after_restore="CUDA_ERROR_NOT_PERMITTED",
                                 importer_sees_the_data=False, exporter_sees_the_importers_write=False)

# The shim's own sequence (lazy_ipc_cycle(lazy=True)): no driver handle is taken before the
# checkpoints, the first one after the restore. The shim's lazy handles rest on this one opening,
# for every size below the backing threshold (tests/gpu/test_driver_probes.py asserts it there).
LAZY_IPC_FACTS_FIRST_HANDLE_AFTER = dict(LAZY_IPC_FACTS, open_of_handle_from_before_restore=None)
LAZY_IPC_SIZES = (4096, 65536, 1 << 20)

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


def lazy_ipc_cycle(session: ProbeSession, nbytes, cycles=2, lazy=False):
    """legacy_ipc.py: an exporter of `nbytes` of cuMemAlloc memory with a legacy IPC handle taken
    at once (none with `lazy`: the shim's sequence) goes through `cycles` driver cycles (lock,
    checkpoint, restore, unlock); then the handle from before and one taken after are each opened
    by a new process (the second writes the pattern of seed 4). Returns dict(ready, runs, again,
    opens {before, after}, shared); with `lazy`, opens has no "before"."""
    session.start("exporter", "legacy_ipc.py", "exporter", "--dir", session.dir, "--bytes", nbytes,
                  *(["--lazy"] if lazy else []))
    ready = session.wait_for("exporter.ready")
    pid = ready["pid"]
    seen = {"ready": ready, "runs": [], "again": None, "opens": {}, "shared": None}
    for _ in range(cycles):
        run = session.checkpoint(f"lock:{pid}", f"checkpoint:{pid}", f"restore:{pid}",
                                 f"unlock:{pid}")
        seen["runs"].append(run)
        if not all_succeeded(run):
            return seen
    seen["again"] = session.request("exporter", "again")
    for which, handle in (("before", ready["before"]), ("after", seen["again"]["after"])):
        if handle is None:
            continue
        rc, output = session.run_program(f"importer-{which}", "legacy_ipc.py", "importer",
                                         "--handle", handle, "--bytes", nbytes, "--seed", 1,
                                         "--write", 4, timeout=60)
        seen["opens"][which] = one_probe_line(output, "ipc_open") if rc == 0 else {"rc": rc}
    seen["shared"] = session.request("exporter", "verify", {"seed": 4})
    return seen


def lazy_ipc_facts(seen):
    """What a lazy_ipc_cycle() showed, in the terms of LAZY_IPC_FACTS."""
    facts = {"cycles_ok": all(all_succeeded(run) for run in seen["runs"])}
    if seen["again"] is None:
        return facts
    first, last = seen["ready"]["queries"], seen["again"]["queries"]

    def same(key):  # the answer, when it did not change across the restores; else both
        return first.get(key) if first.get(key) == last.get(key) else [first.get(key), last.get(key)]

    opens = seen["opens"]
    facts.update({
        "range_without_context": same("bare_range"),
        "pointer_attributes_without_context": [same("bare_context"), same("bare_ipc_capable")],
        "range_with_owner_context_pushed_is_the_same":
            all(q.get("pushed_range") == q["main_range"] for q in (first, last)),
        "range_kept_by_restore": first["main_range"] == last["main_range"],
        "data_kept_by_restore": seen["again"]["data_ok"],
        "open_of_handle_from_before_restore": opens["before"].get("result") if "before" in opens
                                              else None,
        "open_of_handle_taken_after_restore": opens["after"].get("result"),
        "importer_sees_the_data": opens["after"].get("data_ok") == "True",
        "exporter_sees_the_importers_write": seen["shared"]["data_ok"],
    })
    return facts


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
