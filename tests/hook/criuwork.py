"""Workloads CRIU can dump as they are: tests/engine/lcworkload.py serving one command per
connection on a unix socket (no pipe to the test), a session leader with stdio on /dev/null."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LC_WORKLOAD = os.path.join(TESTS, "engine", "lcworkload.py")
sys.path.insert(0, os.path.join(TESTS, "engine"))
# The suspend/resume tests' helpers work on anything with .do() and .pid, as Client has.
from lctest import share, values, write  # noqa: E402,F401
from procs import become_subreaper  # noqa: E402,F401  (tests import it from here too)


class SockWorkload:
    def __init__(self, env, sock_path):
        self.path = str(sock_path)
        self.proc = subprocess.Popen([sys.executable, LC_WORKLOAD, "--socket", self.path],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True, env=env)
        self.pid = self.proc.pid
        deadline = time.monotonic() + 30
        while True:
            try:
                self.do("sync")
                return
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise AssertionError(f"workload {self.pid} did not start")
                time.sleep(0.05)

    def do(self, line, ok=True, timeout=30):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(self.path)
            s.sendall(line.encode() + b"\n")
            with s.makefile("r") as f:
                reply = json.loads(f.readline())
                # until the workload has closed its end: a dump right after this call must not
                # find its socket still connected to ours, a peer outside the tree, which CRIU
                # refuses ("External socket is used")
                f.read()
        if ok:
            assert reply.get("ok"), f"{line!r}: {reply}"
        return reply

    def reap(self):
        """After CRIU killed it: reap it, freeing its pid for the restore."""
        self.proc.wait(10)

    def kill(self):
        try:
            os.kill(self.pid, 9)
        except ProcessLookupError:
            pass


class Client:
    """Commands to a workload by its socket path (its process may be restored by CRIU: not ours)."""

    def __init__(self, path, pid):
        self.path, self.pid = str(path), pid

    do = SockWorkload.do

    def wait_ready(self, timeout=30):
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self.do("sync")
            except OSError:
                if time.monotonic() > deadline:
                    raise AssertionError(f"workload {self.pid} does not answer on {self.path}")
                time.sleep(0.05)


def reap(pids, timeout=10):
    """Wait for pids (dead, reparented to us) to be reaped."""
    deadline = time.monotonic() + timeout
    for pid in pids:
        while True:
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                break  # not ours (already reaped, or reaped by its parent)
            if done or time.monotonic() > deadline:
                break
            time.sleep(0.02)


def start_tree(tmp_path, env, n=2, plain=()):
    """(parent Popen, [Client per child]) of tests/hook/criutree.py; children in plain run
    without the shim."""
    become_subreaper()
    d = tmp_path / "tree"
    d.mkdir()
    parent = subprocess.Popen([sys.executable, os.path.join(os.path.dirname(__file__), "criutree.py"),
                               str(n), str(d), ",".join(map(str, plain))], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True, env=env)
    deadline = time.monotonic() + 30
    while not (d / "children").exists():
        if time.monotonic() > deadline or parent.poll() is not None:
            raise AssertionError("the tree did not start")
        time.sleep(0.05)
    pids = json.loads((d / "children").read_text())
    clients = [Client(d / f"w{i}.sock", pid) for i, pid in enumerate(pids)]
    for c in clients:
        c.wait_ready()
    return parent, clients


def kill_tree(pids):
    for pid in pids:
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
