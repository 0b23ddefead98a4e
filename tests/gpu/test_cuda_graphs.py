"""CUDA graphs across suspend/resume: a torch program's graphs replay to the same bits afterwards.

bench/workloads/graphs.py captures three graphs (matmul + copy into a static output; kernel,
memcpy and memset nodes captured on a side stream; outputs in the graph's private memory pool),
replays them and hashes every output (each overwritten with -1 first, so a replay that did nothing
shows). With the shim: three suspend/resume cycles through the tool, replaying after each. Without
the shim: the same program checkpointed by the driver alone (lock, checkpoint, restore, unlock, from
tests/probes/checkpointer.py: one process makes driver checkpoint calls, never pytest itself), the
comparison, recorded as a PROBE line.
"""
import benchlib
import pytest
from probe_harness import record
from probe_scenarios import all_succeeded


@pytest.mark.timeout(600)
def test_cuda_graphs_replay_identically_after_three_suspend_resume_cycles(torch_available,
                                                                          bench_workload):
    """CUDA graphs (matmul, memcpy/memset/kernel nodes on a side stream, private pool) replay exactly
    after each of 3 suspend/resume cycles through the tool."""
    prog, env = bench_workload("graphs.py")
    reference = prog.ask("check")["graphs"]
    assert prog.ask("check")["graphs"] == reference, "replays differ before any suspend (not deterministic)"
    for cycle in range(3):
        r = benchlib.run_tool(["suspend", prog.pids[0]], env, 300)
        assert r.ok, f"suspend (cycle {cycle}): {r.why()}\n{r.stderr[-3000:]}"
        r = benchlib.run_tool(["resume", prog.pids[0]], env, 300)
        assert r.ok, f"resume (cycle {cycle}): {r.why()}\n{r.stderr[-3000:]}"
        after = prog.ask("check")["graphs"]
        differ = sorted(k for k in reference if after.get(k) != reference[k])
        assert not differ, f"cycle {cycle}: graphs {differ} replay differently after resume"
    record("graphs_tool", cycles=3, graphs=len(reference), same=True)


@pytest.mark.timeout(300)
def test_cuda_graphs_through_the_driver_alone(torch_available, bench_workload, probes):
    """Probe: the same graphs program checkpointed and restored by the driver alone (no shim):
    do its graphs replay the same?"""
    prog, _ = bench_workload("graphs.py", shim=False)
    reference = prog.ask("check")["graphs"]
    pid = prog.pids[0]
    run = probes.checkpoint(f"lock:{pid}", f"checkpoint:{pid}", f"restore:{pid}", f"unlock:{pid}")
    results = [run.call(i)["result"] for i in range(4)]
    try:
        after = prog.ask("check", timeout=120)["graphs"]
    except benchlib.WorkloadError as e:  # died, or answered an error: that is the answer
        after = {"error": str(e)}
    same = sorted(k for k in reference if after.get(k) == reference[k])
    record("graphs_driver_only", lock=results[0], checkpoint=results[1], restore=results[2],
           unlock=results[3], same=",".join(same) or "none",
           differ=",".join(sorted(set(reference) - set(same))) or "none")
    assert all_succeeded(run), f"driver lock/checkpoint/restore/unlock of a plain torch process: {run}"
