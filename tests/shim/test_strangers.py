"""Another local user (uid 1001, tests/shim/stranger.py) against a root workload: she binds
@criu-gpushare.<her own pid> names, fills their backlogs, holds idle connections, sends bytes that
are not UTF-8. None of it reaches the workload's memory or slows it down, and every reply stays
valid JSON (protocol.md, "Authentication")."""
from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import time

import pytest

from criu_gpushare.shimctl import client as control
from procs import ReadyProcesses
from shimtest import fd_pass
from stranger import stranger_cmd

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as uid 1001")

# What waiting on her costs, by the shim's own timeouts: a peer's shim asked whose an fd is has 2 s
# to answer (shim/src/ipc.c, find_exporter), and a connection to a shim's server 2 s to send its
# request (server.c, GS_REQ_TIMEOUT_MS). A call that took less than that waited on nobody: the
# bounds below are those timeouts, not a speed this machine must reach.
PEER_ANSWER_S = 2.0
REQUEST_ARRIVAL_S = 2.0


@pytest.fixture
def stranger():
    """stranger(mode, *args): starts tests/shim/stranger.py as uid 1001; returns (process, hello)."""
    strangers = ReadyProcesses()
    yield lambda *args: strangers.start(stranger_cmd(*args))
    strangers.stop()


def unclaimed_fd(exporter, importer, tmp_path, name):
    """An fd of memory exported by a process without the shim, received by importer: nobody
    claims it, so the importer's shim asks every @criu-gpushare.* name about it."""
    exporter.do(f"cumem {name} 2097152")
    return fd_pass(exporter, importer, name, tmp_path)


def test_an_import_never_sends_its_fd_to_another_users_socket(workload, cuda_env, stranger,
                                                             tmp_path):
    p, hello = stranger("answer")  # claims every fd it is sent as its own export
    plain, root = workload(env=cuda_env), workload()
    fd = unclaimed_fd(plain, root, tmp_path, "x")
    root.do(f"import x {fd} 2097152")
    (imp,) = root.status()["imports"]
    assert imp["exporter"] is None, f"uid 1001 (pid {hello['pid']}) was believed: {imp}"
    time.sleep(0.3)  # let her log what she got
    p.stdin.close()
    events = [json.loads(line) for line in p.stdout]
    assert events, "the shim was expected to look at her name (and refuse it)"
    assert all(e["fds"] == 0 and e["bytes"] == 0 for e in events), events


def test_full_backlogs_of_squatted_names_cost_an_import_nothing(workload, cuda_env, stranger,
                                                               tmp_path):
    plain, root = workload(env=cuda_env), workload()
    fd = unclaimed_fd(plain, root, tmp_path, "x")
    stranger("squat", "20")
    t0 = time.monotonic()
    root.do(f"import x {fd} 2097152", timeout=120)
    took = time.monotonic() - t0
    assert took < PEER_ANSWER_S, (f"cuMemImportFromShareableHandle took {took:.2f} s behind 20 "
                                  "squatted names: it waited on one")


def test_a_stopped_shim_costs_an_import_nothing(workload, cuda_env, tmp_path):
    """A process stopped by a signal (SIGSTOP, or criu-gpushare's hand-over to CRIU) would take its
    shim's connection and answer nothing: it is not asked."""
    plain, root, stopped = workload(env=cuda_env), workload(), workload()
    fd = unclaimed_fd(plain, root, tmp_path, "x")
    os.kill(stopped.pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        root.do(f"import x {fd} 2097152", timeout=120)
        took = time.monotonic() - t0
    finally:
        os.kill(stopped.pid, signal.SIGCONT)
    assert took < PEER_ANSWER_S, (f"cuMemImportFromShareableHandle took {took:.2f} s behind a "
                                  "stopped shim: it asked it, and waited")
    assert stopped.status()["ok"]


def test_idle_connections_of_another_user_do_not_slow_status(workload, stranger):
    w = workload()
    stranger("idle", str(w.pid), "64")
    t0 = time.monotonic()
    assert control.status(w.pid, timeout=30)["ok"]
    took = time.monotonic() - t0
    assert took < REQUEST_ARRIVAL_S, (f"status took {took:.2f} s behind 64 idle connections of uid "
                                      "1001: it waited for one of them to send a request")


def test_a_refused_client_still_reads_why(workload, stranger):
    """The refusal does not wait for her request, yet a client that sends one sees the reason."""
    w = workload()
    code = ("import json, socket\n"
            "s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)\n"
            f"s.connect('\\0criu-gpushare.{w.pid}')\n"
            "try:\n"
            "    s.send(b'{\"v\":2,\"cmd\":\"status\"}')\n"
            "except BrokenPipeError:\n"
            "    pass\n"
            "print(s.recv(65536).decode())\n")
    for _ in range(20):
        out = subprocess.run(stranger_cmd()[:-1] + ["-c", code], capture_output=True, text=True,
                             timeout=30)
        reply = json.loads(out.stdout)
        assert reply["error"] == "denied" and "uid 1001" in reply["reason"], out


def strict(payload: bytes) -> dict:
    """Sends payload to the shim and parses the reply as strict UTF-8 JSON."""
    return json.loads(payload.decode("utf-8", errors="strict"))


def raw_reply(pid, payload: bytes) -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
        s.settimeout(5)
        s.connect(f"\0criu-gpushare.{pid}")
        s.send(payload)
        out = b""
        while chunk := s.recv(1 << 17):
            out += chunk
    return out


def test_every_reply_is_valid_json_whatever_the_request_bytes(workload):
    w = workload()
    cases = [b'{"v":2,"cmd":"\xff\xfe"}', b'{"v":2,"cmd":"' + "\u00e9".encode() * 40 + b'"}',
             b'{"v":2,"cmd":"a\\u0001b\\u001f\\u007f"}', b'{"v":2,"cmd":"\xed\xa0\x80"}',
             b'{"v":2,"cmd":"\xc0\xaf\xf5\x80"}']
    rng = random.Random(7)
    for _ in range(200):
        cases.append(b'{"v":2,"cmd":"' + bytes(rng.choice([*range(0x20, 0x22), *range(0x23, 0x5c),
                                                             *range(0x5d, 0x100)])
                                               for _ in range(rng.randrange(1, 90))) + b'"}')
    for payload in cases:
        reply = strict(raw_reply(w.pid, payload))
        assert reply["ok"] is False and reply["error"] == "unknown-command", (payload, reply)
    reply = strict(raw_reply(w.pid, cases[0]))
    assert reply["reason"] == 'unknown command "\ufffd\ufffd"'
    reply = strict(raw_reply(w.pid, cases[2]))
    assert reply["reason"] == 'unknown command "a\x01b\x1f\x7f"'
    assert control.status(w.pid)["ok"]
