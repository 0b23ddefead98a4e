"""gpu/driver.py: the driver's start, in the calling thread or in the background (the hook's dump
holder starts it beside its imports), each process on the fake driver."""
import json
import os
import subprocess
import sys

import pytest

PROBE = """
import json, sys
from criu_gpushare.gpu import driver as drv
background = sys.argv[1] == "background"
if background:
    drv.start_in_background()
    drv.start_in_background()  # a second call starts nothing more
cu = drv.driver()
same = all(drv.driver() is cu for _ in range(3))
print(json.dumps({"same": same, "start": drv.start_seconds(), "background": drv.background_start_seconds()}))
"""


def probe(env, how):
    """-> what PROBE printed. A second cuInit in the process fails (FAKECUDA_FAIL), and with it
    the probe: the driver starts once, whoever asks first."""
    r = subprocess.run([sys.executable, "-c", PROBE, how], env=dict(env, FAKECUDA_FAIL="cuInit=2"),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_a_start_in_the_background_is_the_one_every_caller_gets_and_is_timed_apart(fake_env):
    out = probe(fake_env, "background")
    assert out["same"]  # the first driver() waited for it
    assert out["start"] > 0 and out["background"] == out["start"]


def test_a_start_in_the_calling_thread_is_no_background_start(fake_env):
    out = probe(fake_env, "inline")
    assert out["same"]
    assert out["start"] > 0 and out["background"] is None


def test_a_background_start_that_fails_fails_the_first_driver_call_that_needs_it(tmp_path):
    """No libcuda here (an empty library path, no NVIDIA driver on this machine): the background
    start raises nowhere; the caller gets the error, saying what to install."""
    probe_ = ("import sys; from criu_gpushare.gpu import driver as drv; from criu_gpushare.errors import NoGpuError\n"
              "drv.start_in_background()\n"
              "try:\n    drv.driver()\nexcept NoGpuError as e:\n    print('NoGpuError', e)\n")
    env = {"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": str(tmp_path), "PYTHONPATH": ":".join(sys.path)}
    if os.path.exists("/proc/driver/nvidia/version"):
        pytest.skip("an NVIDIA driver is installed here: libcuda loads from the system")
    r = subprocess.run([sys.executable, "-c", probe_], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("NoGpuError") and "NVIDIA driver" in r.stdout, r.stdout + r.stderr
