"""Suspend/resume on the GPU of a PyTorch producer/consumer pair sharing a CUDA tensor (issue #5 b).

The pair runs with the shim (torch's CUDA IPC goes through it); three suspend/resume cycles, each
checking that the GPU memory was freed while suspended, that both see the same contents after, and
that the sharing is live (a write by the producer is seen by the consumer).
"""
import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
MIB = 512


def gpu_env():
    return dict(os.environ, NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1",
                NVSHMEM_DISABLE_NVLS="1")


def gpu_memory_used_mib():
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    return sum(int(x) for x in out.split())


@pytest.fixture
def pair(tmp_path):
    pytest.importorskip("torch", reason="torch is not installed")
    from criu_gpushare.shimctl.shimlib import shim_path
    env = gpu_env()
    env.update(LD_PRELOAD=shim_path(), CRIU_GPUSHARE_STORE=str(tmp_path / "store"),
               CRIU_GPUSHARE_RUN_DIR=str(tmp_path / "run"))
    proc = subprocess.Popen([sys.executable, os.path.join(HERE, "workloads", "torch_pair.py"), str(MIB)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)

    def ask(cmd):
        proc.stdin.write(cmd + "\n")
        proc.stdin.flush()
        return json.loads(proc.stdout.readline())

    assert json.loads(proc.stdout.readline())["ready"]
    yield ask, env
    pids = ask("pids")
    for pid in pids.values():
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
    proc.wait(30)


def cli(env, *args):
    env = {k: v for k, v in env.items() if k != "LD_PRELOAD"}  # the tool runs without the shim
    return subprocess.run([sys.executable, "-m", "criu_gpushare.cli", *args], env=env,
                          capture_output=True, text=True, timeout=300)


def test_torch_ipc_pair_survives_three_suspend_resume_cycles(pair):
    ask, env = pair
    pids = ask("pids")
    n = MIB * (1 << 20) // 4
    expected = float(sum(range(4096)) * (n // 4096))
    assert ask("check") == {"producer": expected, "consumer": expected}
    for cycle in range(3):
        before = gpu_memory_used_mib()
        r = cli(env, "suspend", str(pids["producer"]), str(pids["consumer"]))
        assert r.returncode == 0, r.stderr
        print(r.stderr.strip().splitlines()[-1:], r.stdout)
        freed = before - gpu_memory_used_mib()
        assert freed >= MIB, f"only {freed} MiB freed while suspended (cycle {cycle})"
        r = cli(env, "resume", str(pids["producer"]))
        assert r.returncode == 0, r.stderr
        print(r.stdout)
        assert ask("check") == {"producer": expected, "consumer": expected}, f"cycle {cycle}"
        value = float(cycle + 1)
        ask(f"write {value}")
        assert ask("check") == {"producer": value * n, "consumer": value * n}, "sharing not live"
        expected = value * n
