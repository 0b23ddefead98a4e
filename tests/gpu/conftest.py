"""tests/gpu: tests that need a real NVIDIA GPU and driver (run by scripts/gpu-tests.sh).

Everything here is skipped, with the reason, where there is no NVIDIA driver or no usable GPU
(developer machines, CI). Tests that need CRIU >= 4 or torch skip with their own reason. The
check for a GPU runs cuInit in a child process: pytest itself never loads the driver.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

# The probe harness, and the workloads' library shared with the bench (bench/benchlib.py,
# bench/workloads/), importable by every test here.
REPO = Path(__file__).resolve().parents[2]
for _d in (REPO / "tests" / "probes", REPO / "bench"):
    if str(_d) not in sys.path:
        sys.path.insert(0, str(_d))

import benchlib  # noqa: E402
from probe_harness import NO_MULTICAST_ENV, ProbeSession  # noqa: E402

GPU_DIR = Path(__file__).resolve().parent
MIN_CRIU_MAJOR = 4
_GPU_CHECK = """
from cuda.bindings import driver as cu
err, = cu.cuInit(0)
assert err == cu.CUresult.CUDA_SUCCESS, f"cuInit: {err.name}"
err, n = cu.cuDeviceGetCount()
assert err == cu.CUresult.CUDA_SUCCESS and n > 0, f"cuDeviceGetCount: {err.name}, {n} devices"
err, v = cu.cuDriverGetVersion()
print(f"{n} device(s), CUDA driver API {v}")
"""


def gpu_env():
    """os.environ with NVLink multicast kept off (README, "Development")."""
    env = dict(os.environ)
    env.update(NO_MULTICAST_ENV)
    return env


def _gpu_skip_reason():
    """None when a real NVIDIA GPU is usable, else why not."""
    version = Path("/proc/driver/nvidia/version")
    if not version.exists():
        return "no NVIDIA GPU driver on this machine (/proc/driver/nvidia/version absent)"
    try:
        proc = subprocess.run([sys.executable, "-c", _GPU_CHECK], env=gpu_env(),
                              capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return "cuInit did not return within 120 s"
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:]
        return f"the NVIDIA driver is present but no GPU is usable: {' '.join(tail)}"
    return None


def pytest_collection_modifyitems(config, items):
    ours = [item for item in items if GPU_DIR in Path(str(item.fspath)).resolve().parents]
    if not ours:
        return
    reason = _gpu_skip_reason()
    for item in ours:
        item.add_marker(pytest.mark.gpu)
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))


def _criu_skip_reason():
    criu = shutil.which("criu")
    if criu is None:
        return None, f"CRIU >= {MIN_CRIU_MAJOR} absent: no `criu` on PATH"
    try:
        out = subprocess.run([criu, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"`{criu} --version` failed: {e}"
    match = re.search(r"Version:\s*(\d+)\.(\d+)", out)
    if not match:
        return None, f"cannot read the CRIU version from `{criu} --version`: {out.strip()!r}"
    if int(match.group(1)) < MIN_CRIU_MAJOR:
        return None, f"CRIU >= {MIN_CRIU_MAJOR} absent: {criu} is {match.group(0)}"
    return criu, None


@pytest.fixture(scope="session")
def criu_bin():
    """Path of a CRIU >= 4 binary; skips the test (with the reason) when there is none."""
    criu, reason = _criu_skip_reason()
    if reason:
        pytest.skip(reason)
    return criu


@pytest.fixture(scope="session")
def torch_available():
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed")


@pytest.fixture
def probes(tmp_path):
    """A ProbeSession on the real driver; every process it started is SIGKILLed at the end."""
    with ProbeSession(tmp_path / "rv", gpu_env()) as session:
        yield session


@pytest.fixture
def bench_workload(tmp_path):
    """Factory: bench_workload(script, *args, shim=True) starts a bench/workloads script, under the
    shim unless shim=False (benchlib.Workload, ready and its contents' digest taken), with a store
    and a run directory of this test; returns the workload and the environment for the tool. All
    are killed at the end."""
    started = []

    def start(script, *args, shim=True):
        run_dir = tmp_path / "run"
        run_dir.mkdir(mode=0o700, exist_ok=True)
        store = {"CRIU_GPUSHARE_STORE": str(tmp_path / "store")}
        env = dict(benchlib.tool_env(str(run_dir)), **store)
        wl = benchlib.Workload(script.split(".")[0], script, args, str(tmp_path), str(run_dir), store,
                               shim=shim)
        started.append(wl)
        return wl.start(600), env

    yield start
    for wl in started:
        wl.kill()


@pytest.fixture
def image_dir():
    """A CRIU image directory, on /dev/shm when there is one (fast and large on the GPU machine)."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    path = Path(tempfile.mkdtemp(prefix="gpushare-probe-img.", dir=base))
    yield path
    shutil.rmtree(path, ignore_errors=True)
