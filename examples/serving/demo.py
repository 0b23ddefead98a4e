"""Dump the serving tree (serve.py) under traffic, restore it, and check that every request gets
the answer it got before the dump.

    python examples/serving/demo.py [--door wrapper|hook] [--dir DIR] [--model cpu]

Needs a GPU, torch, CRIU >= 4 and criu-gpushare installed, and root (--model cpu: no GPU, no torch).
The tree runs under the shim. CRIU options passed through: link-remap (multiprocessing's
semaphores), tcp-close (connections open at the dump are restored closed: their requests fail and
are sent again) and skip-in-flight (connections not yet accepted are dropped). Exit 0 when every
answer matches.
"""
import argparse
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from protocol import read_answer, request_line  # noqa: E402
REQUESTS = [[1, 2, 3], [7, 7, 7, 7], [100, 3], [42] * 20, [5, 11, 250, 31, 9], [300, 301]]
TIMEOUT_S = 300


def tool():
    exe = shutil.which("criu-gpushare")
    return [exe] if exe else [sys.executable, "-m", "criu_gpushare.cli"]


class ServingTree:
    def __init__(self, directory, env=None, model="cuda"):
        self.dir = directory
        self.env = dict(env or os.environ)
        ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: we reap what CRIU kills
        log = open(os.path.join(directory, "serve.log"), "ab")
        self.proc = subprocess.Popen([*tool(), "run", "--", sys.executable, os.path.join(HERE, "serve.py"),
                                      "--dir", directory, "--model", model], stdin=subprocess.DEVNULL, stdout=log,
                                     stderr=log, start_new_session=True, env=self.env)
        ready = os.path.join(directory, "ready")
        deadline = time.monotonic() + TIMEOUT_S
        while not os.path.exists(ready):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill_group()
                raise RuntimeError(f"the tree did not start: {self.log_tail()}")
            time.sleep(0.1)
        with open(ready) as f:
            info = json.load(f)
        self.port, self.pids = info["port"], info["pids"]

    def log_tail(self):
        with open(os.path.join(self.dir, "serve.log"), errors="replace") as f:
            return " | ".join(f.read().splitlines()[-8:])

    def ask(self, tokens, timeout=120):
        with socket.create_connection(("127.0.0.1", self.port), timeout=timeout) as s:
            s.sendall(request_line(tokens).encode())
            with s.makefile("r") as f:
                return read_answer(f.readline())

    def answers(self):
        return [self.ask(t) for t in REQUESTS]

    def reap(self):
        """After the dump: every zombie reaped (the tree's pids and session free for the restore)."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                while os.waitpid(-1, os.WNOHANG)[0]:
                    pass
            except ChildProcessError:
                pass
            if not any(os.path.exists(f"/proc/{p}") for p in self.pids):
                return
            time.sleep(0.05)

    def kill_group(self, sig=signal.SIGKILL):
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def kill(self, grace=10):
        """Ends the tree: SIGTERM, then SIGKILL whatever is left after grace seconds. SIGTERM first
        because multiprocessing's resource tracker ignores it: it outlives the others and then
        unlinks the tree's named semaphores (/dev/shm/sem.mp-*), which a SIGKILL of the whole tree
        would leave behind for good."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            self.kill_group(sig)
            for pid in getattr(self, "pids", []):  # the workers are not in the API's group alone
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + grace
            while self._alive() and time.monotonic() < deadline:
                time.sleep(0.05)
            if not self._alive():
                return

    def _alive(self):
        """Whether a process of the tree is left, once its zombies are reaped (this process is their
        subreaper)."""
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            pass
        if any(os.path.exists(f"/proc/{pid}") for pid in getattr(self, "pids", [])):
            return True
        try:
            os.killpg(self.proc.pid, 0)
            return True
        except ProcessLookupError:
            return False


class Traffic(threading.Thread):
    """Requests sent back to back until stopped; failures (a dump closing a connection) counted."""

    def __init__(self, tree):
        super().__init__(daemon=True)
        self.tree, self.stop, self.ok, self.failed = tree, threading.Event(), 0, 0

    def run(self):
        i = 0
        while not self.stop.is_set():
            try:
                self.tree.ask(REQUESTS[i % len(REQUESTS)], timeout=30)
                self.ok += 1
            except (OSError, ValueError):
                self.failed += 1
                time.sleep(0.05)
            i += 1


def run(cmd, env, what):
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    if r.returncode != 0:
        raise RuntimeError(f"{what} failed (exit {r.returncode}): {(r.stdout + r.stderr)[-3000:]}")
    return r


def dump_and_restore(tree, images, door, env=None):
    """One dump under traffic and one restore through `door`; -> (dump s, restore s, traffic)."""
    env = {k: v for k, v in (env or os.environ).items() if k != "LD_PRELOAD"}
    traffic = Traffic(tree)
    traffic.start()
    time.sleep(1.0)
    t0 = time.monotonic()
    if door == "wrapper":
        run([*tool(), "dump", str(tree.pids[0]), images, "--criu-opt", "tcp-close",
             "--criu-opt", "skip-in-flight"], env, "dump")
    else:
        hook = shutil.which("criu-gpushare-hook")
        run(["criu", "dump", "-t", str(tree.pids[0]), "-D", images, "--action-script", hook,
             "--link-remap", "--tcp-close", "--skip-in-flight", "-o", "dump.log", "-v4"], env, "criu dump")
    dump_s = time.monotonic() - t0
    traffic.stop.set()
    traffic.join(60)
    tree.reap()
    t0 = time.monotonic()
    if door == "wrapper":
        run([*tool(), "restore", images, "--criu-opt", "tcp-close"], env, "restore")
    else:
        run(["criu", "restore", "-d", "-D", images, "--action-script", hook, "--link-remap", "--tcp-close",
             "-o", "restore.log", "-v4"], env, "criu restore")
    return dump_s, time.monotonic() - t0, traffic


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--door", choices=("wrapper", "hook"), default="wrapper")
    ap.add_argument("--dir")
    ap.add_argument("--model", choices=("cuda", "cpu"), default="cuda",
                    help="cpu: serve.py's pure-Python model (no GPU: only CRIU and the tree)")
    args = ap.parse_args()
    directory = args.dir or tempfile.mkdtemp(prefix="serving-demo.")
    tree = ServingTree(directory, model=args.model)
    try:
        before = tree.answers()
        print(f"tree up, pids {tree.pids}; {len(before)} answers recorded, e.g. {before[0]}")
        images = os.path.join(directory, "images")
        os.makedirs(images, exist_ok=True)
        dump_s, restore_s, traffic = dump_and_restore(tree, images, args.door)
        print(f"dumped under traffic in {dump_s:.2f} s ({traffic.ok} requests answered, "
              f"{traffic.failed} cut by the dump), restored in {restore_s:.2f} s")
        after = tree.answers()
        same = after == before
        print("every answer the same as before the dump" if same else f"DIFFERENT: {before} vs {after}")
        return 0 if same else 1
    finally:
        tree.kill()


if __name__ == "__main__":
    sys.exit(main())
