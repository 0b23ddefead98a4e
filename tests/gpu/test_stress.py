"""Many suspend/resume cycles of a pair sharing GPU memory while both keep kernels and copies going.

bench/workloads/pair.py --busy: a torch producer and consumer share a tensor through CUDA IPC;
each runs a background thread of kernels, device copies and copies to pinned host memory. Every
cycle suspends both, resumes them, and checks the contents (the digest of shared and private
memory, both processes reading the same shared tensor, scratch results) and that the background
work went on. Resident memory, open fds and threads of both
processes are read from /proc before the first cycle, after the first (warm-up: the first suspend
sets things up once) and after the last: last minus warm-up must stay within small noise.
CRIU_GPUSHARE_STRESS_CYCLES sets the number of cycles (default 60: at the 4.2 s a cycle measured on
the H200 they fit one 10-minute run of scripts/gpu-tests.sh with room to spare). A line every 10
cycles says how far it got, on the terminal even without -s.
"""
import os
import time

import benchlib
import pytest
from probe_harness import record

MIB = 256  # shared, and private in each process
CYCLES = int(os.environ.get("CRIU_GPUSHARE_STRESS_CYCLES", "60"))
PROGRESS_EVERY = 10
# 4.2 s a cycle measured; 6 s leaves room, and 60 cycles stay under scripts/gpu-tests.sh's 480 s.
SECONDS_PER_CYCLE = 6
RSS_NOISE_KIB = 32 << 10     # 32 MiB, or 3 % of the warm-up figure when that is more
FD_NOISE, THREAD_NOISE = 2, 2


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
def pair(torch_available, bench_workload):
    wl, env = bench_workload("pair.py", "--busy", "--gib", MIB / 1024, "--shared-gib", MIB / 1024)
    return wl, env, dict(zip(("producer", "consumer"), wl.pids))


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
    wl, env, pids = pair
    t0 = time.monotonic()

    def progress(done):
        with capsys.disabled():  # to the terminal (and the run's log) as it happens
            print(f"\nstress: {done}/{CYCLES} cycles in {time.monotonic() - t0:.0f} s", flush=True)

    first = wl.ask("check")
    assert first["shared_agree"], first

    def sample_all():
        return {role: sample(pid) for role, pid in pids.items()}

    def iterations(check):
        return dict(zip(pids, (figures["iters"] for figures in check["busy"])))

    before, warm = sample_all(), None
    iters = iterations(first)
    for cycle in range(CYCLES):
        r = benchlib.run_tool(["suspend", pids["producer"], pids["consumer"]], env, 300)
        assert r.ok, f"suspend, cycle {cycle}: {r.why()}\n{r.stderr[-3000:]}"
        r = benchlib.run_tool(["resume", pids["producer"]], env, 300)
        assert r.ok, f"resume, cycle {cycle}: {r.why()}\n{r.stderr[-3000:]}"
        seen = wl.ask("check")
        assert seen["sha"] == first["sha"] and seen["shared_agree"], f"cycle {cycle}: {seen}"
        for role, figures in zip(pids, seen["busy"]):
            assert figures["scratch_ok"], f"cycle {cycle}, {role}: background results wrong"
        if cycle == 0:
            warm = sample_all()
        iters = iterations(seen)
        if (cycle + 1) % PROGRESS_EVERY == 0 or cycle + 1 == CYCLES:
            progress(cycle + 1)
    first_iters = iterations(first)
    assert all(iters[role] > first_iters[role] for role in iters), f"background work stopped: {iters}"
    last, warm = sample_all(), warm or before
    record("stress", cycles=CYCLES, **{f"{role}_{k}": f"{before[role][k]}/{warm[role][k]}/{last[role][k]}"
                                      for role in before for k in before[role]})
    problems = growth_problems(warm, last)
    assert not problems, f"after {CYCLES} cycles: " + "; ".join(problems)
