"""Another local user against a shim (run as that user: `setpriv --reuid=1001 ...`, see
stranger_cmd). Standard library only. Prints one JSON line when set up, then holds until stdin
closes (and exits at once when it does).

  squat N      N processes, each binding @criu-gpushare.<its own pid> with a full listen backlog
               (listen(0) plus one connection of its own that is never accepted)
  answer       one process binding @criu-gpushare.<its own pid> that accepts every connection,
               claims whatever fd comes as its export, and logs each connection on stdout:
               {"event": "conn", "bytes": N, "fds": N}
  idle PID N   N connections to @criu-gpushare.PID that never send anything
"""
from __future__ import annotations

import json
import os
import socket
import sys
import threading

STRANGER_UID = 1001


def stranger_cmd(*args: str) -> list[str]:
    """The command line that runs this script as uid STRANGER_UID (the tests run as root)."""
    return ["setpriv", f"--reuid={STRANGER_UID}", f"--regid={STRANGER_UID}", "--clear-groups",
            sys.executable, os.path.abspath(__file__), *args]


def name(pid: int) -> str:
    return f"\0criu-gpushare.{pid}"


def say(obj) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def hold() -> None:
    sys.stdin.read()


def squat(n: int) -> None:
    pids, ends = [], []
    for _ in range(n):
        r, w = os.pipe()
        ready_r, ready_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(w)
            os.close(ready_r)
            s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            s.bind(name(os.getpid()))
            s.listen(0)
            filler = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            filler.setblocking(False)
            filler.connect(name(os.getpid()))  # the one connection a backlog of 0 queues
            os.write(ready_w, b"x")
            os.read(r, 1)  # EOF when the parent goes
            os._exit(0)
        os.close(r)
        os.close(ready_w)
        os.read(ready_r, 1)
        os.close(ready_r)
        pids.append(pid)
        ends.append(w)
    say({"ready": True, "pids": pids})
    hold()
    for w in ends:
        os.close(w)
    for pid in pids:
        os.waitpid(pid, 0)


def answer() -> None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.bind(name(os.getpid()))
    s.listen(64)

    def serve():
        while True:
            c, _ = s.accept()
            c.settimeout(3)
            try:
                data, fds, _, _ = socket.recv_fds(c, 65536, 8)
            except OSError:
                data, fds = b"", []
            say({"event": "conn", "bytes": len(data), "fds": len(fds)})
            for fd in fds:
                os.close(fd)
            try:  # claim it: "I exported that"
                c.send(json.dumps({"v": 2, "ok": True, "id": 7, "multicast": False,
                                   "size": 4 << 20}).encode())
            except OSError:
                pass
            c.close()

    threading.Thread(target=serve, daemon=True).start()
    say({"ready": True, "pid": os.getpid()})
    hold()


def idle(pid: int, n: int) -> None:
    conns = []
    for _ in range(n):
        c = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        c.connect(name(pid))
        conns.append(c)
    say({"ready": True, "connections": len(conns)})
    hold()


if __name__ == "__main__":
    mode, rest = sys.argv[1], sys.argv[2:]
    if mode == "squat":
        squat(int(rest[0]))
    elif mode == "answer":
        answer()
    elif mode == "idle":
        idle(int(rest[0]), int(rest[1]))
    else:
        sys.exit(f"unknown mode {mode}")
