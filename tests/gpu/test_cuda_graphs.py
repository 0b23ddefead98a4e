"""CUDA graphs across suspend/resume: a torch program's graphs replay to the same bits afterwards.

tests/gpu/workloads/graphs.py captures three graphs (matmul + copy into a static output; kernel,
memcpy and memset nodes captured on a side stream; outputs in the graph's private memory pool),
replays them and hashes every output (each overwritten with -1 first, so a replay that did nothing
shows). With the shim: three suspend/resume cycles through the tool, replaying after each. Without
the shim: the same program checkpointed by the driver alone (lock, checkpoint, restore, unlock, from
tests/probes/checkpointer.py: one process makes driver checkpoint calls, never pytest itself), the
comparison, recorded as a PROBE line.
"""
import json
import os
import signal
import subprocess
import sys

import pytest
from probe_harness import record
from probe_scenarios import all_succeeded

HERE = os.path.dirname(os.path.abspath(__file__))
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


class Program:
    def __init__(self, env):
        self.proc = subprocess.Popen([sys.executable, os.path.join(HERE, "workloads", "graphs.py")],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
                                     start_new_session=True)
        assert json.loads(self.proc.stdout.readline())["ready"], "graphs.py did not start"
        self.pid = self.proc.pid

    def ask(self, cmd):
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, f"graphs.py died (exit {self.proc.poll()})"
        return json.loads(line)

    def kill(self):
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # stuck CHECKPOINTED only dies so
        except ProcessLookupError:
            pass
        self.proc.wait(60)


@pytest.fixture
def program(tmp_path):
    pytest.importorskip("torch", reason="torch is not installed")
    started = []

    def start(shim):
        env = dict(os.environ, **NO_MULTICAST, CRIU_GPUSHARE_STORE=str(tmp_path / "store"),
                   CRIU_GPUSHARE_RUN_DIR=str(tmp_path / "run"))
        env.pop("LD_PRELOAD", None)
        if shim:
            from criu_gpushare.shimctl.shimlib import shim_path
            env["LD_PRELOAD"] = shim_path()
        started.append(Program(env))
        return started[-1], env

    yield start
    for p in started:
        p.kill()


def cli(env, *args):
    env = {k: v for k, v in env.items() if k != "LD_PRELOAD"}  # the tool runs without the shim
    return subprocess.run([sys.executable, "-m", "criu_gpushare.cli", *map(str, args)], env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.timeout(600)
def test_cuda_graphs_replay_identically_after_three_suspend_resume_cycles(program):
    """CUDA graphs (matmul, memcpy/memset/kernel nodes on a side stream, private pool) replay exactly
    after each of 3 suspend/resume cycles through the tool."""
    prog, env = program(shim=True)
    reference = prog.ask("replay")
    assert prog.ask("replay") == reference, "replays differ before any suspend (not deterministic)"
    for cycle in range(3):
        r = cli(env, "suspend", prog.pid, "--json")
        assert r.returncode == 0, f"suspend (cycle {cycle}): {r.stderr}"
        r = cli(env, "resume", prog.pid, "--json")
        assert r.returncode == 0, f"resume (cycle {cycle}): {r.stderr}"
        after = prog.ask("replay")
        differ = sorted(k for k in reference if after.get(k) != reference[k])
        assert not differ, f"cycle {cycle}: graphs {differ} replay differently after resume"
    record("graphs_tool", cycles=3, graphs=len(reference), same=True)


@pytest.mark.timeout(300)
def test_cuda_graphs_through_the_driver_alone(program, probes):
    """Probe: the same graphs program checkpointed and restored by the driver alone (no shim):
    do its graphs replay the same?"""
    prog, _ = program(shim=False)
    reference = prog.ask("replay")
    pid = prog.pid
    run = probes.checkpoint(f"lock:{pid}", f"checkpoint:{pid}", f"restore:{pid}", f"unlock:{pid}")
    results = [run.call(i)["result"] for i in range(4)]
    try:
        after = prog.ask("replay")
    except (AssertionError, ValueError) as e:  # died or answered garbage: that is the answer
        after = {"error": str(e)}
    same = sorted(k for k in reference if after.get(k) == reference[k])
    record("graphs_driver_only", lock=results[0], checkpoint=results[1], restore=results[2],
           unlock=results[3], same=",".join(same) or "none",
           differ=",".join(sorted(set(reference) - set(same))) or "none")
    assert all_succeeded(run), f"driver lock/checkpoint/restore/unlock of a plain torch process: {run}"
