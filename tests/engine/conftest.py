"""Fixtures of the suspend/resume tests: workloads under the shim over the fake driver (or the real
one with CRIU_GPUSHARE_TEST_DRIVER=real), and the `criu-gpushare` CLI run as a user would (its own
process, the same driver, no shim)."""
from __future__ import annotations

import glob
import os
import re
import signal
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "shim"))

from shimtest import NO_MULTICAST_ENV, REAL_DRIVER, Workload  # noqa: E402  (tests/shim/shimtest.py)

from criu_gpushare.shimctl.shimlib import shim_path  # noqa: E402

LC_WORKLOAD = os.path.join(HERE, "lcworkload.py")


class LcWorkload(Workload):
    """tests/engine/lcworkload.py (the shim tests' workload plus host readers and signals)."""

    def __init__(self, env):
        super().__init__(env, script=LC_WORKLOAD)


class Env:
    """Paths and environments of one test: the tool's and the workloads'."""

    def __init__(self, base_env, tmp_path):
        self.run_dir = str(tmp_path / "run")
        self.store = str(tmp_path / "store")
        self.state = base_env.get("FAKECUDA_STATE")  # None with the real driver
        os.mkdir(self.run_dir, 0o700)
        self.tool = dict(base_env, CRIU_GPUSHARE_RUN_DIR=self.run_dir, CRIU_GPUSHARE_STORE=self.store,
                         CRIU_GPUSHARE_CACHE="")
        self.tool.pop("LD_PRELOAD", None)
        self.app = dict(self.tool, LD_PRELOAD=shim_path())

    def cli(self, *args, env=None, timeout=120):
        """Runs `criu-gpushare ARGS`; the CompletedProcess (stdout, stderr as text)."""
        return subprocess.run([sys.executable, "-m", "criu_gpushare.cli", *map(str, args)],
                              env=env or self.tool, capture_output=True, text=True, timeout=timeout)

    def holder_pids(self):
        pids = []
        for log in glob.glob(os.path.join(self.run_dir, "holder-*.log")):
            with open(log) as f:
                m = re.match(r"holder (\d+) ", f.readline())
            if m:
                pids.append(int(m.group(1)))
        return pids

    def holder_log(self):
        return "".join(open(p).read() for p in glob.glob(os.path.join(self.run_dir, "holder-*.log")))


    def kill_holders(self):
        """Holders a test left running. First of all: a killed tracee cannot be reaped by its
        parent while its tracer (the holder) lives."""
        for pid in self.holder_pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.fixture
def run_dir(tmp_path, monkeypatch):
    """The tool's state directory for tests that run engine code in this process (not yet made)."""
    d = tmp_path / "run"
    monkeypatch.setenv("CRIU_GPUSHARE_RUN_DIR", str(d))
    return d


@pytest.fixture
def lc(request, tmp_path):
    """The test's Env; holders still running at the end are stopped."""
    base = dict(os.environ, **NO_MULTICAST_ENV) if REAL_DRIVER else request.getfixturevalue("fake_env")
    env = Env(base, tmp_path)
    yield env
    env.kill_holders()


@pytest.fixture
def workload(lc):
    """Factory: workload(env=None) starts a lifecycle workload under the shim; all are stopped at
    the end (killed if a test left them frozen or stuck)."""
    started = []

    def start(env=None):
        w = LcWorkload(env or lc.app)
        started.append(w)
        return w

    yield start
    lc.kill_holders()
    for w in started:
        if w.proc.poll() is None:
            w.proc.kill()
            w.proc.wait()
