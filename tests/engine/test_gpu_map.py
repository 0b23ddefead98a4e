"""Restoring onto another GPU: `resume --gpu-map OLD=NEW` hands the driver the map by UUID."""
import json
import re

from fakecuda.usage import read_usage
from lctest import resume, suspend, values, write
from shimtest import fake_only


def gpu_uuids(lc):
    r = lc.cli("doctor", "--json")
    gpus = next(c for c in json.loads(r.stdout)["checks"] if c["name"] == "gpus")
    return re.findall(r"GPU-[0-9a-f-]{36}", gpus["detail"])


@fake_only  # needs two GPUs
def test_a_driver_path_process_comes_back_on_the_gpu_the_map_names(lc, workload):
    first, second = gpu_uuids(lc)[:2]
    p = workload(lc.tool)  # no shared memory: the driver restores its memory itself
    p.do("malloc x 4194304")
    write(p, "x", 8)
    before = read_usage(lc.state)[p.pid]
    assert before.get(0, 0) >= 4 << 20, before
    suspend(lc, p.pid)
    r = lc.cli("resume", p.pid, "--gpu-map", f"{first}={second}")
    assert r.returncode == 0, r.stderr
    assert values(p, "x") == [8] * 4
    after = read_usage(lc.state)[p.pid]
    assert after.get(1, 0) >= 4 << 20 and after.get(0, 0) < 4 << 20, (before, after)


@fake_only
def test_a_map_to_a_gpu_that_is_not_there_fails_and_the_group_stays_suspended(lc, workload):
    p = workload(lc.tool)
    p.do("malloc x 4194304")
    write(p, "x", 9)
    suspend(lc, p.pid)
    first = gpu_uuids(lc)[0]
    r = lc.cli("resume", p.pid, "--gpu-map", f"{first}=GPU-00000000-0000-0000-0000-000000000000")
    assert r.returncode != 0 and "not visible here" in r.stderr
    resume(lc, p.pid)  # retried without the bad map
    assert values(p, "x") == [9] * 4


@fake_only  # needs two GPUs
def test_shared_memory_comes_back_on_the_gpu_the_map_names(lc, workload, tmp_path):
    """The shims re-create their memory on the mapped GPU (a devices map in each workload's own
    ordinals), the tool loads it there, and the sharing is live: not only the driver's part moves."""
    from lctest import assert_shared, share
    first, second = gpu_uuids(lc)[:2]
    a, b = workload(), workload()
    share(a, b, tmp_path)
    write(a, "buf", 21)
    suspend(lc, a.pid, b.pid)
    r = lc.cli("resume", a.pid, "--gpu-map", f"{first}={second}")
    assert r.returncode == 0, r.stderr
    assert values(b, "buf") == [21] * 4
    usage = read_usage(lc.state)[a.pid]
    assert usage.get(1, 0) >= 4 << 20 and usage.get(0, 0) < 4 << 20, usage
    assert_shared(a, b)


def test_a_malformed_gpu_map_is_refused_before_anything_changes(lc, workload):
    p = workload()
    p.do("cumem x 4194304")
    write(p, "x", 5)
    suspend(lc, p.pid)
    for bad in ("nonsense", "GPU-1=GPU-2", "GPU-00000000-0000-0000-0000-000000000000"):
        r = lc.cli("resume", p.pid, "--gpu-map", bad)
        assert r.returncode == 2 and "--gpu-map" in r.stderr, r.stderr
    resume(lc, p.pid)
    assert values(p, "x") == [5] * 4
