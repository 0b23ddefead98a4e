"""The GPU rows of the CRIU fault matrix (hooks/README.md, "Faults"). A restore onto a GPU without
room for the memory that comes back. Another process holds all but 1 GiB of the GPU; the restore
of a 2 GiB torch workload is refused at CRIU's post-restore, the GPU check having run while CRIU
restored the processes (the wrapper exits 12, the hook's post-restore fails CRIU's restore; both
name the GPU, what is needed and what is free): CRIU kills what it restored, and nothing of the
tree is left; once that process lets go, the same restore brings the tree back with
its contents. And `criu-gpushare dump` SIGKILLed mid-dump: its watch gives the torch workload
its GPU state back by itself. The fake driver's twin is tests/hook/test_criu_faults.py.
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time

import pytest

from test_criu_trees import CALL_TIMEOUT_S, HOOK, Tree, bl, run_criu  # one tree harness for tests/gpu

ROOM_LEFT = 1 << 30  # what the filler leaves free: less than the workload's 2 GiB
FILLER = """
import sys, time, torch
free, _ = torch.cuda.mem_get_info()
held = torch.empty(max(free - int(sys.argv[1]), 0), dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
with open(sys.argv[2], "w") as f:
    f.write(str(held.numel()))
time.sleep(900)
"""


@contextlib.contextmanager
def gpu_filled(tmp_path):
    """A process (no shim) holding all but ROOM_LEFT of GPU 0's free memory while inside."""
    ready = tmp_path / "filled"
    env = bl.tool_env(str(tmp_path / "run"))
    if os.environ.get("GPUSHARE_PROBE_RUN"):  # scripts/gpu-tests.sh kills leftovers by this tag
        env["GPUSHARE_PROBE_TAG"] = os.environ["GPUSHARE_PROBE_RUN"]
    proc = subprocess.Popen([sys.executable, "-c", FILLER, str(ROOM_LEFT), str(ready)], env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert proc.poll() is None, f"the filler exited {proc.returncode}: {proc.stderr.read()[-2000:]}"
            assert time.monotonic() < deadline, "the filler did not take the GPU's memory within 120 s"
            time.sleep(0.1)
        print(f"filler holds {int(ready.read_text()) / 2**30:.1f} GiB", flush=True)
        yield
    finally:
        proc.kill()
        proc.wait()


def restore(tree, door, criu, images):
    """-> (exit code, what the user reads)."""
    if door == "wrapper":
        r = bl.run_tool(["restore", images], tree.env, CALL_TIMEOUT_S)
        return r.rc, r.stderr
    r = run_criu(criu, "restore", images, ["-d", "--action-script", HOOK, "--link-remap"], tree.env, CALL_TIMEOUT_S)
    return r.returncode, r.output + r.log


def dump(tree, door, criu, images):
    root = tree.wl.pids[0]
    if door == "wrapper":
        r = bl.run_tool(["dump", root, images], tree.env, CALL_TIMEOUT_S)
        assert r.ok, f"dump: {r.why()}\n{r.stderr[-3000:]}"
    else:
        r = run_criu(criu, "dump", images, ["-t", root, "--action-script", HOOK, "--link-remap"], tree.env, CALL_TIMEOUT_S)
        assert r.returncode == 0, r.tail(40)
    tree.wl.reap(30)


@pytest.mark.parametrize("door", ["wrapper", pytest.param("hook", marks=pytest.mark.skipif(
    HOOK is None, reason="criu-gpushare-hook is not on PATH (package not installed)"))])
def test_a_restore_onto_a_full_gpu_is_refused_until_there_is_room(tmp_path, criu_bin, door):
    pytest.importorskip("torch", reason="torch is not installed")
    tree = Tree(tmp_path, "blocks", "blocks.py", ["--gib", "2"])
    try:
        images = tree.images()
        dump(tree, door, criu_bin, images)
        with gpu_filled(tmp_path):
            rc, said = restore(tree, door, criu_bin, images)
        print(f"refused ({door}): exit {rc}: {said.strip().splitlines()[-3:]}", flush=True)
        assert rc != 0 and "GiB on GPU" in said and "GiB free" in said, said[-3000:]
        if door == "wrapper":
            assert rc == 12 and "Traceback" not in said, said[-3000:]
        # refused at post-restore (the GPU check overlaps CRIU's restore): CRIU killed what it
        # restored, whose zombies this test (a subreaper) reaps
        tree.wl.reap(10)
        assert not [p for p in tree.wl.pids if os.path.exists(f"/proc/{p}")], "half-restored"
        rc, said = restore(tree, door, criu_bin, images)
        assert rc == 0 and "GPU state NOT restored" not in said, said[-3000:]
        assert tree.wl.verify() == "ok", "contents differ after the retried restore"
    finally:
        tree.close()


def watch_logs(run_dir):
    return "".join(open(os.path.join(run_dir, n)).read() for n in os.listdir(run_dir)
                   if n.startswith("dumpwatch-"))


def what_holds(tree, run_dir, proc):
    """What a failed wait shows: the watch's log, the command's stderr, the tree's and CRIU's
    processes (state, where they wait), the state directory."""
    lines = [f"watch log: {watch_logs(run_dir)!r}", f"command stderr: {(proc.stderr_text or '')[-2000:]}",
             f"state directory: {sorted(os.listdir(run_dir))}"]
    for name in sorted(os.listdir(run_dir)):
        if name.startswith("journal-"):
            with open(os.path.join(run_dir, name), errors="replace") as f:
                lines.append(f"{name}: {f.read()[:1500]}")
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")[:160]
            with open(f"/proc/{pid}/stat") as f:
                state, ppid = f.read().rsplit(")", 1)[1].split()[:2]
            with open(f"/proc/{pid}/wchan") as f:
                wchan = f.read()
            with open(f"/proc/{pid}/status") as f:
                tracer = [ln.split()[1] for ln in f if ln.startswith("TracerPid:")]
        except OSError:
            continue
        if int(pid) in map(int, tree.wl.pids) or "criu" in cmd or "dumpwatch" in cmd:
            lines.append(f"pid {pid} ppid {ppid} state {state} tracer {tracer} wchan {wchan}: {cmd}")
    return "\n".join(lines)


@pytest.mark.parametrize("point", ["stop", "post-dump"])
def test_the_wrapper_killed_mid_dump_gives_the_tree_back_by_itself(tmp_path, point):
    """`criu-gpushare dump` SIGKILLed at the end of pre-dump (tasks not yet seized) or at post-dump
    (CRIU has dumped them): its CRIU fails the dump and lets the tasks go, stopped; the command's
    watch (engine/dumpwatch.py) then resumes them from the journal, and the workload answers with
    its GPU contents intact, with no one running `resume`."""
    pytest.importorskip("torch", reason="torch is not installed")
    from interrupts import paused, paused_env, tool_argv, wait_until
    tree = Tree(tmp_path, "blocks", "blocks.py", ["--gib", "2"])
    try:
        images = tree.images()
        pause = tmp_path / "pause"
        t0 = time.monotonic()
        with paused(tool_argv(["dump", tree.wl.pids[0], images]), paused_env(tree.env, point, pause),
                    pause) as (proc, err_path):
            proc.kill()
            proc.wait()
        proc.stderr_text = open(err_path).read()
        run_dir = tree.env["CRIU_GPUSHARE_RUN_DIR"]
        try:
            wait_until(lambda: not [n for n in os.listdir(run_dir) if n.startswith("journal-")],
                       "the watch to resume the tree (its journal gone)", timeout=60)
        except AssertionError as e:
            raise AssertionError(f"{e}\n{what_holds(tree, run_dir, proc)}") from None
        back_s = time.monotonic() - t0
        logs = watch_logs(run_dir)
        assert "running: criu-gpushare resume" in logs, logs
        assert tree.wl.verify() == "ok", "contents differ after the watch's resume"
        print(f"PROBE dump_watch point={point} back_s={back_s:.2f}", flush=True)
    finally:
        tree.close()
