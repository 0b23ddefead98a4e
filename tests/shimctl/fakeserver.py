"""A process that serves @criu-gpushare.<its own pid> the ways a shim never does, for tests of the
tool's client (fixture `fake_server`, tests/conftest.py). Standard library only; run as root.

  python fakeserver.py MODE [--uid U] [--listen-uid U] [--reply JSON]

  squat    listen(0) plus one connection of its own that is never accepted: a full backlog
  mute     accepts every connection and never answers
  reply    answers every request with the JSON text given by --reply

  --uid U         runs as uid U from the start (another user's process)
  --listen-uid U  listens with effective uid U, then takes uid 0 back: SO_PEERCRED names U while
                  /proc says the process runs as root (a server that is not the process it claims)

Prints {"ready": true, "pid": N} once listening, then holds until stdin closes.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import threading


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=("squat", "mute", "reply"))
    ap.add_argument("--uid", type=int)
    ap.add_argument("--listen-uid", type=int)
    ap.add_argument("--reply", default="{}")
    args = ap.parse_args()
    if args.uid is not None:
        os.setgroups([])
        os.setresgid(args.uid, args.uid, args.uid)
        os.setresuid(args.uid, args.uid, args.uid)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.bind(f"\0criu-gpushare.{os.getpid()}")
    if args.listen_uid is not None:
        os.seteuid(args.listen_uid)
    s.listen(0 if args.mode == "squat" else 64)
    if args.listen_uid is not None:
        os.seteuid(0)
    held = []
    if args.mode == "squat":
        filler = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        filler.setblocking(False)
        filler.connect(f"\0criu-gpushare.{os.getpid()}")  # the one connection a backlog of 0 queues
        held.append(filler)
    else:
        def serve():
            while True:
                c, _ = s.accept()
                if args.mode == "mute":
                    held.append(c)  # never answered, never closed
                    continue
                try:
                    c.settimeout(3)
                    c.recv(65536)
                    c.send(args.reply.encode())
                except OSError:
                    pass
                c.close()

        threading.Thread(target=serve, daemon=True).start()
    sys.stdout.write(json.dumps({"ready": True, "pid": os.getpid()}) + "\n")
    sys.stdout.flush()
    sys.stdin.read()


if __name__ == "__main__":
    main()
