"""Fixtures for the shim tests: the shim library, an environment that preloads it over the fake
driver, and workloads driven line by line (tests/shim/workload.py)."""
from __future__ import annotations

import glob
import json
import os
import queue
import shutil
import subprocess
import sys
import threading

import pytest

from criu_gpushare import control

# CRIU_GPUSHARE_TEST_DRIVER=real runs these tests against the machine's driver (a GPU host);
# anything else uses the fake driver. Tests of what only the fake can do are skipped there.
REAL_DRIVER = os.environ.get("CRIU_GPUSHARE_TEST_DRIVER") == "real"
NO_MULTICAST_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                    "NVSHMEM_DISABLE_NVLS": "1"}
fake_only = pytest.mark.skipif(REAL_DRIVER, reason="fake driver only (two devices, multicast, or "
                                                   "entry points a GPU test must not touch)")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
WORKLOAD = os.path.join(HERE, "workload.py")
# The flags setup.py builds the shim with.
SHIM_CFLAGS = ["-std=gnu11", "-O2", "-fPIC", "-Wall", "-Wextra", "-Werror", "-fvisibility=hidden",
               "-D_GNU_SOURCE", "-shared", "-Wl,--no-undefined", "-Wl,-z,defs"]


def _cuda_include():
    for d in (os.path.join(os.environ.get("CUDA_HOME", "/nonexistent"), "include"),
              "/usr/local/cuda/include"):
        if os.path.isfile(os.path.join(d, "cuda.h")):
            return d
    from fakecuda.build import find_cuda_include
    return find_cuda_include()


@pytest.fixture(scope="session")
def shim_lib(tmp_path_factory) -> str:
    """The shim built from the current sources (the tests must not run a stale installed copy)."""
    gcc = shutil.which(os.environ.get("CC", "gcc"))
    if gcc is None:
        pytest.fail("no C compiler: the shim tests need gcc")
    out = str(tmp_path_factory.mktemp("shim") / "libcriu_gpushare.so")
    sources = sorted(glob.glob(os.path.join(ROOT, "shim", "src", "*.c")))
    cmd = [gcc, *SHIM_CFLAGS, "-I", os.path.join(ROOT, "shim", "include"), "-I", _cuda_include(),
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


class Workload:
    """A running tests/shim/workload.py; `do` sends one command and returns its JSON reply."""

    def __init__(self, env, extra_env=None, **popen):
        env = dict(env, **(extra_env or {}))
        self.proc = subprocess.Popen([sys.executable, WORKLOAD], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env=env, **popen)
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        hello = self.reply(30)
        assert hello["ok"], hello
        self.pid = self.proc.pid

    def _pump(self):
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def send(self, command):
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()

    def reply(self, timeout=30):
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"workload {self.proc.pid}: no reply within {timeout} s") from None
        if line is None:
            self.proc.wait(5)
            raise AssertionError(f"workload exited ({self.proc.returncode}): {self.proc.stderr.read()}")
        return json.loads(line)

    def do(self, command, timeout=30):
        self.send(command)
        r = self.reply(timeout)
        assert r["ok"], f"{command!r}: {r}"
        return r

    def status(self):
        return control.status(self.pid)

    def close(self):
        if self.proc.poll() is None:
            try:
                self.send("exit")
                self.proc.wait(10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


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
