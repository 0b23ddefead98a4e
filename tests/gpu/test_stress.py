"""Many suspend/resume cycles of a pair sharing GPU memory while both keep kernels and copies going.

tests/gpu/workloads/stress_pair.py: a torch producer and consumer share a tensor through CUDA IPC;
each runs a background thread of kernels, device copies and copies to pinned host memory. Every
cycle suspends both, resumes them, and checks the contents (shared and private sums, scratch
results) and that the background work went on. Resident memory, open fds and threads of both
processes are read from /proc before the first cycle, after the first (warm-up: the first suspend
sets things up once) and after the last: last minus warm-up must stay within small noise.
CRIU_GPUSHARE_STRESS_CYCLES sets the number of cycles (default 60: at the 4.2 s a cycle measured on
the H200 they fit one 10-minute run of scripts/gpu-tests.sh with room to spare). A line every 10
cycles says how far it got, on the terminal even without -s.
"""
import json
import os
import subprocess
import sys
import time

import pytest
from probe_harness import record

HERE = os.path.dirname(os.path.abspath(__file__))
MIB = 256
CYCLES = int(os.environ.get("CRIU_GPUSHARE_STRESS_CYCLES", "60"))
PROGRESS_EVERY = 10
# 4.2 s a cycle measured; 6 s leaves room, and 60 cycles stay under scripts/gpu-tests.sh's 480 s.
SECONDS_PER_CYCLE = 6
RSS_NOISE_KIB = 32 << 10     # 32 MiB, or 3 % of the warm-up figure when that is more
FD_NOISE, THREAD_NOISE = 2, 2


def gpu_env():
    return dict(os.environ, NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1",
                NVSHMEM_DISABLE_NVLS="1")


def sample(pid):
    """{"rss_kib", "fds", "threads"} of pid from /proc."""
    fields = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            fields[key] = value.split()
    return {"rss_kib": int(fields["VmRSS"][0]), "fds": len(os.listdir(f"/proc/{pid}/fd")),
            "threads": int(fields["Threads"][0])}


@pytest.fixture
def pair(tmp_path):
    pytest.importorskip("torch", reason="torch is not installed")
    from criu_gpushare.shimctl.shimlib import shim_path
    env = gpu_env()
    env.update(LD_PRELOAD=shim_path(), CRIU_GPUSHARE_STORE=str(tmp_path / "store"),
               CRIU_GPUSHARE_RUN_DIR=str(tmp_path / "run"))
    proc = subprocess.Popen([sys.executable, os.path.join(HERE, "workloads", "stress_pair.py"), str(MIB)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)

    def ask(cmd):
        proc.stdin.write(cmd + "\n")
        proc.stdin.flush()
        line = proc.stdout.readline()
        assert line, f"stress_pair.py died (exit {proc.poll()})"
        return json.loads(line)

    assert json.loads(proc.stdout.readline())["ready"]
    pids = ask("pids")
    yield ask, env, pids
    for pid in pids.values():
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
    proc.wait(30)


def cli(env, *args):
    env = {k: v for k, v in env.items() if k != "LD_PRELOAD"}
    return subprocess.run([sys.executable, "-m", "criu_gpushare.cli", *map(str, args)], env=env,
                          capture_output=True, text=True, timeout=300)


def growth_problems(warm, last):
    problems = []
    for role in warm:
        w, l = warm[role], last[role]
        rss_noise = max(RSS_NOISE_KIB, w["rss_kib"] * 3 // 100)
        if l["rss_kib"] - w["rss_kib"] > rss_noise:
            problems.append(f"{role} VmRSS grew {w['rss_kib']} -> {l['rss_kib']} KiB")
        if l["fds"] - w["fds"] > FD_NOISE:
            problems.append(f"{role} fds grew {w['fds']} -> {l['fds']}")
        if l["threads"] - w["threads"] > THREAD_NOISE:
            problems.append(f"{role} threads grew {w['threads']} -> {l['threads']}")
    return problems


@pytest.mark.timeout(60 + SECONDS_PER_CYCLE * CYCLES)
def test_stress_suspend_resume_cycles_of_a_busy_sharing_pair(pair, capsys):
    """N suspend/resume cycles of a busy CUDA-IPC pair: contents right every cycle, no growth of
    VmRSS, fds or threads (CRIU_GPUSHARE_STRESS_CYCLES, default 60)."""
    ask, env, pids = pair
    t0 = time.monotonic()

    def progress(done):
        with capsys.disabled():  # to the terminal (and the run's log) as it happens
            print(f"\nstress: {done}/{CYCLES} cycles in {time.monotonic() - t0:.0f} s", flush=True)

    first = ask("check")
    expected = {role: (first[role]["shared"], first[role]["private"]) for role in first}
    assert first["producer"]["shared"] == first["consumer"]["shared"]

    def sample_all():
        return {role: sample(pid) for role, pid in pids.items()}

    before, warm = sample_all(), None
    iters = {role: first[role]["iters"] for role in first}
    for cycle in range(CYCLES):
        r = cli(env, "suspend", pids["producer"], pids["consumer"])
        assert r.returncode == 0, f"suspend, cycle {cycle}: {r.stderr}"
        r = cli(env, "resume", pids["producer"])
        assert r.returncode == 0, f"resume, cycle {cycle}: {r.stderr}"
        seen = ask("check")
        for role, (shared, private) in expected.items():
            got = seen[role]
            assert (got["shared"], got["private"]) == (shared, private), f"cycle {cycle}, {role}: {got}"
            assert got["scratch_ok"], f"cycle {cycle}, {role}: background results wrong"
        if cycle == 0:
            warm = sample_all()
        iters = {role: seen[role]["iters"] for role in seen}
        if (cycle + 1) % PROGRESS_EVERY == 0 or cycle + 1 == CYCLES:
            progress(cycle + 1)
    assert all(iters[role] > first[role]["iters"] for role in iters), f"background work stopped: {iters}"
    last, warm = sample_all(), warm or before
    record("stress", cycles=CYCLES, **{f"{role}_{k}": f"{before[role][k]}/{warm[role][k]}/{last[role][k]}"
                                      for role in before for k in before[role]})
    problems = growth_problems(warm, last)
    assert not problems, f"after {CYCLES} cycles: " + "; ".join(problems)
