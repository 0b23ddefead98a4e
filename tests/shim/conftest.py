"""Fixtures for the shim tests: the shim library, an environment that preloads it over the fake
driver (or the real one, see shimtest.REAL_DRIVER), and workloads driven line by line
(tests/shim/workload.py)."""
from __future__ import annotations

import glob
import os
import shutil
import subprocess

import pytest

from shimtest import NO_MULTICAST_ENV, REAL_DRIVER, ROOT, SHIM_CFLAGS, Workload, cuda_include


@pytest.fixture(scope="session")
def shim_lib(tmp_path_factory) -> str:
    """The shim built from the current sources (the tests must not run a stale installed copy)."""
    gcc = shutil.which(os.environ.get("CC", "gcc"))
    if gcc is None:
        pytest.fail("no C compiler: the shim tests need gcc")
    out = str(tmp_path_factory.mktemp("shim") / "libcriu_gpushare.so")
    sources = sorted(glob.glob(os.path.join(ROOT, "shim", "src", "*.c")))
    cmd = [gcc, *SHIM_CFLAGS, "-I", os.path.join(ROOT, "shim", "include"), "-I", cuda_include(),
           "-o", out, *sources, "-ldl", "-lpthread"]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode:
        pytest.fail("the shim does not build:\n" + res.stderr)
    return out


@pytest.fixture
def cuda_env(request) -> dict:
    """Environment for a CUDA process without the shim: the fake driver, or the real one."""
    if REAL_DRIVER:
        return dict(os.environ, **NO_MULTICAST_ENV)
    return request.getfixturevalue("fake_env")


@pytest.fixture
def kernel_image(tmp_path) -> str:
    """A file holding the test kernels' image for the driver in use (see kernels.py)."""
    import kernels
    path = tmp_path / "kernels.img"
    path.write_bytes(kernels.PTX if REAL_DRIVER else kernels.FAKE_IMAGE)
    return str(path)


@pytest.fixture
def shim_env(cuda_env, shim_lib) -> dict:
    env = dict(cuda_env)
    env["LD_PRELOAD"] = shim_lib
    return env


@pytest.fixture
def workload(shim_env):
    """Factory: workload(extra_env=None) starts one; all are stopped at the end of the test."""
    started = []

    def start(extra_env=None, env=None):
        w = Workload(env or shim_env, extra_env)
        started.append(w)
        return w

    yield start
    for w in started:
        w.close()
