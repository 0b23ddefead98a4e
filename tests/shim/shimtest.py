"""Helpers of the shim tests (a module of its own: several test directories have a conftest)."""
from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time

import pytest

from criu_gpushare.shimctl import client as control

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


def cuda_include():
    for d in (os.path.join(os.environ.get("CUDA_HOME", "/nonexistent"), "include"),
              "/usr/local/cuda/include"):
        if os.path.isfile(os.path.join(d, "cuda.h")):
            return d
    from fakecuda.build import find_cuda_include
    return find_cuda_include()


class Workload:
    """A running tests/shim/workload.py; `do` sends one command and returns its JSON reply."""

    def __init__(self, env, extra_env=None, script=WORKLOAD, **popen):
        env = dict(env, **(extra_env or {}))
        self.proc = subprocess.Popen([sys.executable, script], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env=env, **popen)
        self.lines: queue.Queue = queue.Queue()
        self.log_lines: list = []  # its stderr: the shim's log, shown when a command fails
        threading.Thread(target=self._pump, daemon=True).start()
        threading.Thread(target=self._pump_log, daemon=True).start()
        hello = self.reply(30)
        assert hello["ok"], hello
        self.pid = self.proc.pid

    def _pump(self):
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def _pump_log(self):
        for line in self.proc.stderr:
            self.log_lines.append(line.rstrip("\n"))

    def log(self, lines=20):
        """The last lines the process wrote to stderr (the shim logs why a call failed there)."""
        return "\n".join(self.log_lines[-lines:])

    def wait_log(self, text, timeout=10):
        """Whether `text` shows in its stderr within `timeout` s (the log is read on a thread)."""
        deadline = time.monotonic() + timeout
        while not any(text in line for line in self.log_lines):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

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
            time.sleep(0.1)  # the log pump reads the last lines
            raise AssertionError(f"workload exited ({self.proc.returncode}): {self.log(50)}")
        return json.loads(line)

    def do(self, command, timeout=30):
        self.send(command)
        r = self.reply(timeout)
        assert r["ok"], f"{command!r}: {r}\n{self.log()}"
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


def fd_pass(exporter, importer, name, tmp_path):
    """Exports exporter's NAME and hands the fd to importer over SCM_RIGHTS; returns its fd there."""
    path = os.path.join(str(tmp_path), f"fd-{name}.sock")
    importer.do(f"listen {path}")
    fd = exporter.do(f"export {name}")["fd"]
    exporter.do(f"sendfd {fd} {path}")
    return importer.do("recvfd")["fd"]
