"""Suspend/resume on the GPU of a PyTorch producer/consumer pair sharing a CUDA tensor (issue #5 b).

The pair (bench/workloads/pair.py) runs with the shim (torch's CUDA IPC goes through it); three
suspend/resume cycles, each checking that the GPU memory was freed while suspended, that both see
the same contents after, and that the sharing is live (a write by the producer is seen by the
consumer).
"""
import subprocess

import benchlib
import pytest

MIB = 512  # shared; each process holds half as much of its own


def gpu_memory_used_mib():
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    return sum(int(x) for x in out.split())


def test_torch_ipc_pair_survives_three_suspend_resume_cycles(torch_available, bench_workload):
    wl, env = bench_workload("pair.py", "--gib", MIB / 2048, "--shared-gib", MIB / 1024)
    expected = wl.ask("check")
    assert expected["shared_agree"], expected
    for cycle in range(3):
        before = gpu_memory_used_mib()
        r = benchlib.run_tool(["suspend", *wl.pids], env, 300)
        assert r.ok, f"suspend, cycle {cycle}: {r.why()}\n{r.stderr[-3000:]}"
        freed = before - gpu_memory_used_mib()
        assert freed >= MIB, f"only {freed} MiB freed while suspended (cycle {cycle})"
        r = benchlib.run_tool(["resume", wl.pids[0]], env, 300)
        assert r.ok, f"resume, cycle {cycle}: {r.why()}\n{r.stderr[-3000:]}"
        assert wl.ask("check")["sha"] == expected["sha"], f"contents changed, cycle {cycle}"
        wl.ask(f"write {cycle + 1}")
        written = wl.ask("check")
        assert written["shared_agree"] and written["parts"][2] != expected["parts"][2], \
            f"sharing not live, cycle {cycle}: {written}"
        expected = written
