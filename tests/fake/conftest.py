"""Fixtures for the tests of the fake driver: CUDA worker processes driven line by line."""
from __future__ import annotations

import os
import select
import subprocess
import sys

import pytest

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cuda_worker.py")


class WorkerProcess:
    """A cuda_worker.py subprocess; do() sends one command and returns the reply's words."""

    def __init__(self, env: dict, device: int = 0):
        env = dict(env, WORKER_DEVICE=str(device))
        self.proc = subprocess.Popen([sys.executable, WORKER], env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        ready = self.reply(timeout=30)
        assert ready[:2] == ["ok", "ready"], ready
        self.pid = int(ready[2])

    def send(self, command: str) -> None:
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()

    def reply(self, timeout: float = 30) -> list[str]:
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            raise TimeoutError(f"worker {self.proc.pid}: no reply within {timeout} s")
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"worker {self.proc.pid} died: {self.proc.stderr.read()}")
        return line.split()

    def has_reply(self, timeout: float) -> bool:
        return bool(select.select([self.proc.stdout], [], [], timeout)[0])

    def do(self, command: str, timeout: float = 30) -> list[str]:
        self.send(command)
        return self.reply(timeout)

    def ok(self, command: str, timeout: float = 30) -> list[str]:
        """do() that expects success; returns the values after 'ok'."""
        words = self.do(command, timeout)
        assert words[0] == "ok", f"{command!r} -> {words}"
        return words[1:]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            stream.close()


@pytest.fixture
def workers(fake_env):
    """Factory of worker processes sharing the test's fake state; all are killed afterwards."""
    started: list[WorkerProcess] = []

    def start(device: int = 0, **extra_env) -> WorkerProcess:
        w = WorkerProcess(dict(fake_env, **extra_env), device)
        started.append(w)
        return w

    yield start
    for w in started:
        w.close()
