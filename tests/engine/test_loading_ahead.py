"""A resume reads the store into spare GPU memory of its own while the steps before the load run
(engine/ahead.py), then copies device to device: the memory comes back whole either way, and the
result says how much came that way (`bytes.loaded_ahead`)."""
import json
import shutil
import tempfile
import time

import pytest

from criu_gpushare.store import memfs
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


def test_a_resume_copies_the_chunk_files_registered_while_it_was_suspended(lc, workload, tmp_path):
    """A store on a tmpfs: once the suspend is done its holder registers the chunk files with the
    driver (CRIU_GPUSHARE_PAGES_IN_PLACE=1 for the small pages of /dev/shm), and the resume,
    through the load ahead or the load step, copies them from their own pages
    (`bytes.loaded_in_place`); without the switch, small pages are not registered."""
    if memfs.on_disk("/dev/shm"):
        pytest.skip("/dev/shm is not a tmpfs here: registering chunk files needs a store in memory")
    store = tempfile.mkdtemp(prefix="registered-", dir="/dev/shm")
    try:
        a, b = workload(), workload()
        share(a, b, tmp_path)
        a.do("malloc big 8388608")
        cases = [("1", "1"), ("1", "0")]
        if memfs.pages_of(store) == "small":
            cases.append(("", "1"))
        for value, (switch, load_ahead) in enumerate(cases):
            env = roomy(lc, CRIU_GPUSHARE_STORE=store, CRIU_GPUSHARE_PAGES_IN_PLACE=switch,
                        CRIU_GPUSHARE_LOAD_AHEAD=load_ahead)
            write(a, "buf", 60 + value)
            write(a, "big", 70 + value)
            logs_before = lc.holder_log().count("chunk files (")
            assert lc.cli("suspend", a.pid, b.pid, env=env).returncode == 0
            if switch:
                registered = _wait_for(lambda: lc.holder_log().count("chunk files (") > logs_before)
                assert registered, lc.holder_log()
            r = lc.cli("resume", a.pid, "--json", env=env)
            assert r.returncode == 0, r.stderr
            out = json.loads(r.stdout)["bytes"]
            if switch:
                assert 0 < out["loaded_in_place"] <= out["copied"], out
                # the holder undid the registrations before it ended
                def since():  # the holder's log from its last registering on
                    return lc.holder_log().split("chunk files (")[-1]
                assert _wait_for(lambda: "holder done" in since()), lc.holder_log()
                assert "registered chunk files in" in since(), lc.holder_log()
            else:
                assert out["loaded_in_place"] == 0, out
                assert lc.holder_log().count("chunk files (") == logs_before, lc.holder_log()
            assert values(b, "buf") == [60 + value] * 4 and values(a, "big") == [70 + value] * 4
    finally:
        shutil.rmtree(store, ignore_errors=True)


def _wait_for(condition, timeout_s=30.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False
