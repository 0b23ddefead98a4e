"""A resume reads the store into spare GPU memory of its own while the steps before the load run
(engine/ahead.py), then copies device to device: the memory comes back whole either way, and the
result says how much came that way (`bytes.loaded_ahead`)."""
import json

from lctest import share, values, write
from phasecheck import assert_phases_cover, timed_cli
from shimtest import REAL_DRIVER


def roomy(lc, **more):
    """The tool's environment, with fake GPUs large enough for a second copy (ahead.MARGIN and
    a context's share per process leave nothing of the fake's default 4 GiB)."""
    return dict(lc.tool, **({} if REAL_DRIVER else {"FAKECUDA_MEM_MB": "16384"}), **more)


def test_a_resume_loads_ahead_where_the_gpu_has_room(lc, workload, tmp_path):
    a, b = workload(), workload()
    share(a, b, tmp_path)
    a.do("malloc big 8388608")
    for cycle in range(2):
        write(a, "buf", 40 + cycle)
        write(a, "big", 50 + cycle)
        r = lc.cli("suspend", a.pid, b.pid, "--json", env=roomy(lc))
        assert r.returncode == 0, r.stderr
        if cycle == 1:
            lc.kill_holders()  # the second resume runs from the journal, in the command
        r, wall = timed_cli(roomy(lc), "resume", a.pid, "--json")
        phases = assert_phases_cover(r, wall, "restore", "recreate", "load", "load ahead (not overlapped)",
                                     "load: copy what was loaded ahead (device to device)",
                                     "load: free what was loaded ahead")
        out = json.loads(r.stdout)
        assert out["bytes"]["loaded_ahead"] == out["bytes"]["copied"] > 0, out["bytes"]
        assert values(b, "buf") == [40 + cycle] * 4 and values(a, "big") == [50 + cycle] * 4
        assert phases["load ahead (not overlapped)"] >= 0


def test_without_room_or_switched_off_the_load_reads_the_store(lc, workload, tmp_path):
    a, b = workload(), workload()
    share(a, b, tmp_path)
    cases = [roomy(lc, CRIU_GPUSHARE_LOAD_AHEAD="0")]
    if not REAL_DRIVER:  # an H200 always has the room; the fake's default 4 GiB is less than the margin
        cases.append(lc.tool)
    for value, env in enumerate(cases):
        write(a, "buf", 77 + value)
        assert lc.cli("suspend", a.pid, b.pid, env=env).returncode == 0
        r = lc.cli("resume", b.pid, "--json", env=env)
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        assert out["bytes"]["loaded_ahead"] == 0 and out["bytes"]["copied"] > 0, out["bytes"]
        assert "load ahead (not overlapped)" not in out["phases"], out["phases"]
        assert "load: free what was loaded ahead" not in out["phases"], out["phases"]
        assert values(a, "buf") == [77 + value] * 4
