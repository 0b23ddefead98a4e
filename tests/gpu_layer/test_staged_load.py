"""Loading ahead (gpu/staging.py) on the fake driver: a restore's memory read from the store into
the tool's own GPU memory before the load step, which then copies device to device."""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
MiB = 1 << 20


def run_cases(fake_env, tmp_path):
    r = subprocess.run([sys.executable, os.path.join(HERE, "staged_load.py"), str(tmp_path / "s")],
                       env=fake_env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_staged_load_copies_device_to_device_and_gives_its_memory_back(fake_env, tmp_path):
    out = run_cases(fake_env, tmp_path)
    staged = out["staged"]
    # Both allocations came back whole from the staged copies: the store's chunks were gone by then.
    assert staged["keys"] == ["a", "b"] and staged["error"] == "None", staged
    assert staged["same"], staged
    assert staged["ahead"] == [8 * MiB, 4 * MiB] and staged["zero"] == [2 * MiB, 0], staged
    assert staged["bytes"] == 12 * MiB and staged["held"] >= 12 * MiB, staged
    assert staged["freed"], "close() gives the staged buffers' GPU memory back"
    damaged = out["damaged"]
    assert damaged["wait"] == {} and damaged["victim"] in damaged["error"], damaged
    assert damaged["freed"], "a failed loading holds no GPU memory"
    no_room = out["no_room"]
    # Made one at a time until one fails: the first is loaded, the third is left to the load step.
    assert no_room["keys"] == ["a"] and no_room["error"] == "None" and no_room["freed"], no_room
    stopped = out["stopped"]
    assert stopped["closed"] and stopped["freed"], stopped
    assert stopped["error"] == "_Stopped" and stopped["gets"] < stopped["total"], stopped
