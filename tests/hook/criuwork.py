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
