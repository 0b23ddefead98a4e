"""The control socket: who may talk to it, what bad input does (nothing to the workload), fork,
namespaces, and the Python client's own checks (fake driver)."""
from __future__ import annotations

import json
import os
import queue
import random
import shutil
import socket
import subprocess
import sys
import textwrap
import threading
import time

import psutil
import pytest

from criu_gpushare.shimctl import client as control
from criu_gpushare.errors import ProcessError, ShimError
from shimtest import WORKLOAD

ERROR_CODES = {"denied", "bad-request", "busy", "refused", "not-ours", "gone", "unknown-command",
               "failed", "version"}


def raw(pid, payload: bytes, fds=(), timeout=5.0):
    """Sends payload as one record to pid's shim; returns the parsed reply (or None on EOF)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
        s.settimeout(timeout)
        s.connect(f"\0criu-gpushare.{pid}")
        try:
            if fds:
                socket.send_fds(s, [payload], list(fds))
            else:
                s.send(payload)
        except BrokenPipeError:
            pass  # refused before the request was read: the reply is still there
        out = b""
        while True:
            chunk = s.recv(1 << 17)
            if not chunk:
                break
            out += chunk
    return json.loads(out) if out else None


def as_other_user(uid, fn):
    """Runs fn() in a forked child that dropped to uid; returns what it returned (as JSON)."""
    r, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: only socket calls until _exit
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            out = json.dumps(fn()).encode()
        except BaseException as e:  # noqa: BLE001 - report anything to the parent
            out = json.dumps({"child_error": repr(e)}).encode()
        os.write(wfd, out)
        os._exit(0)
    os.close(wfd)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    os.waitpid(pid, 0)
    return json.loads(data)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as a second user")
def test_peer_of_another_user_is_refused(workload):
    w = workload()
    reply = as_other_user(65534, lambda: raw(w.pid, b'{"v":2,"cmd":"status"}'))
    assert reply["ok"] is False and reply["error"] == "denied", reply
    assert "uid 65534" in reply["reason"]
    assert w.status()["ok"]  # root (the test) is still served


def test_malformed_truncated_and_oversized_requests_fail_with_a_reason(workload):
    w = workload()
    w.do("malloc buf 2097152")
    valid = b'{"v":2,"cmd":"status"}'
    cases = [
        b"", b"{", b"[]", b"null", b'"status"', valid[:-1], valid + b"x", b'{"v":2}',
        b'{"v":1,"cmd":"status"}', b'{"v":"2","cmd":"status"}', b'{"v":2,"cmd":"status","v":2}',
        b'{"v":2,"cmd":{"x":1}}', b'{"v":2,"cmd":"nope"}', b'{"v":2,"cmd":"export"}',
        b'{"v":2,"cmd":"export","id":-3}', b'{"v":2,"cmd":"export","id":99999}',
        b'{"v":2,"cmd":"whose"}', b'{"v":2,"cmd":"quiesce","timeout_ms":0}',
        b'{"v":2,"cmd":"quiesce","timeout_ms":1.5}', b'{"v":2,"cmd":"st\\u0000atus"}',
        b'{"v":2,"cmd":"' + b"s" * 300 + b'"}', b'{"v":2,"cmd":"status","x":"\x01"}',
        b'{"v":2,"cmd":"status",' + b",".join(b'"k%d":1' % i for i in range(40)) + b"}",
        b'{"v":99999999999999999999999,"cmd":"status"}', b"\x00" * 100, b"\xff\xfe{}",
        b'{"v":2,"cmd":"status"}' + b" " * (70 << 10),  # larger than a request may be
    ]
    for payload in cases:
        reply = raw(w.pid, payload) if payload else None
        if payload:
            assert reply["ok"] is False, payload[:80]
            assert reply["error"] in ERROR_CODES and reply["reason"], reply
    assert raw(w.pid, valid)["ok"]
    assert len(w.status()["allocations"]) == 1


def test_a_request_of_another_protocol_version_gets_the_version_this_shim_speaks(workload):
    w = workload()
    assert raw(w.pid, b'{"v":1,"cmd":"status"}') == {
        "v": 2, "ok": False, "error": "version", "protocol": 2,
        "reason": "protocol version 1 is not supported (this shim speaks 2)"}
    reply = raw(w.pid, b'{"cmd":"status"}')
    assert (reply["error"], reply["protocol"]) == ("version", 2)
    assert raw(w.pid, b'{"v":2,"cmd":"status"}')["protocol"] == 2


def test_the_client_names_both_versions_when_a_shim_speaks_another(tmp_path):
    """An old shim (protocol 1) answers a version-2 request with its own terms."""
    old = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    old.bind(f"\0criu-gpushare.{os.getpid()}")
    old.listen(1)

    def serve():
        conn, _ = old.accept()
        conn.recv(65536)
        conn.send(b'{"v":1,"ok":false,"error":"version",'
                  b'"reason":"protocol version 2 is not supported (this shim speaks 1)"}')
        conn.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        with pytest.raises(ShimError) as e:
            control.status(os.getpid(), timeout=5)
        assert str(e.value) == "shim: " + (
            f"process {os.getpid()} runs a criu-gpushare shim of control protocol 1; this "
            "criu-gpushare speaks 2: restart the workload with this version's shim "
            "(`criu-gpushare run`)")
    finally:
        t.join(5)
        old.close()


def test_random_bytes_never_crash_the_workload(workload):
    w = workload()
    rng = random.Random(4)
    base = b'{"v":2,"cmd":"status","id":12,"timeout_ms":5}'
    for _ in range(300):
        if rng.random() < 0.5:
            payload = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200)))
        else:  # mutations of a valid request reach deeper into the parser
            b = bytearray(base)
            for _ in range(rng.randrange(1, 4)):
                b[rng.randrange(len(b))] = rng.randrange(256)
            payload = bytes(b[: rng.randrange(1, len(b) + 1)])
        reply = raw(w.pid, payload)
        assert reply is not None and reply["ok"] in (True, False)
    w.do("malloc buf 2097152")
    assert w.status()["allocations"]


def test_unexpected_fds_are_refused_and_closed(workload):
    w = workload()
    before = len(os.listdir(f"/proc/{w.pid}/fd"))
    r, wfd = os.pipe()
    try:
        for _ in range(5):
            reply = raw(w.pid, b'{"v":2,"cmd":"status"}', fds=[r, wfd])
            assert reply["error"] == "bad-request" and "fd" in reply["reason"]
        reply = raw(w.pid, b'{"v":2,"cmd":"whose"}', fds=[r, r, r, r, r, r])
        assert reply["ok"] is False
    finally:
        os.close(r)
        os.close(wfd)
    time.sleep(0.2)
    assert len(os.listdir(f"/proc/{w.pid}/fd")) == before, "received fds must not leak"


def test_clients_that_connect_and_hang_do_not_block_others(workload):
    w = workload()
    hangers = []
    try:
        for _ in range(6):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            s.connect(f"\0criu-gpushare.{w.pid}")
            hangers.append(s)
        t0 = time.monotonic()
        assert control.status(w.pid)["ok"]
        assert time.monotonic() - t0 < 1.0
        w.do("malloc buf 2097152")  # the app is not blocked either
        hangers[0].settimeout(5)
        reply = json.loads(hangers[0].recv(65536))
        assert reply["error"] == "bad-request" and "no request within" in reply["reason"]
    finally:
        for s in hangers:
            s.close()


def test_client_refuses_a_socket_served_by_another_process():
    victim = subprocess.Popen(["sleep", "30"])
    squatter = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        squatter.bind(f"\0criu-gpushare.{victim.pid}")
        squatter.listen(1)
        with pytest.raises(ShimError, match=f"served by pid {os.getpid()}, not {victim.pid}"):
            control.status(victim.pid, timeout=2)
    finally:
        squatter.close()
        victim.kill()
        victim.wait()


def test_client_errors_name_the_pid():
    p = subprocess.Popen(["sleep", "30"])
    try:
        with pytest.raises(ShimError, match=f"process {p.pid} has no control socket"):
            control.status(p.pid)
    finally:
        p.kill()
        p.wait()
    with pytest.raises(ProcessError, match=f"process {p.pid}: no such process"):
        control.status(p.pid)


FORK_PROGRAM = textwrap.dedent("""
    import os, sys
    from cuda.bindings import driver as cu
    assert cu.cuInit(0)[0] == 0
    pid = os.fork()
    if pid == 0:
        os.write(1, b"%d\\n" % os.getpid())  # one write: both processes share the pipe
        sys.stdin.readline()
        # CUDA is not usable in a child forked after cuInit; a program it execs is a new start.
        os.execv(sys.executable, [sys.executable, sys.argv[1]])
    os.write(1, b"%d\\n" % os.getpid())
    os.waitpid(pid, 0)
""")


def listener_inode(pid):
    with open("/proc/net/unix") as f:
        for line in f:
            if line.rstrip().endswith(f"@criu-gpushare.{pid}"):
                return line.split()[6]
    return None


def test_fork_child_drops_the_parents_socket_and_an_exec_starts_its_own(shim_env):
    p = subprocess.Popen([sys.executable, "-c", FORK_PROGRAM, WORKLOAD], env=shim_env, text=True,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        q = queue.Queue()
        threading.Thread(target=lambda: [q.put(x) for x in p.stdout], daemon=True).start()
        pids = {int(q.get(timeout=30)), int(q.get(timeout=30))}
        (child,) = pids - {p.pid}
        inode = listener_inode(p.pid)
        assert inode, "the parent serves its socket"
        held = {os.readlink(f"/proc/{child}/fd/{fd}") for fd in os.listdir(f"/proc/{child}/fd")}
        assert f"socket:[{inode}]" not in held, "the child must not keep the parent's listener"
        assert control.status(p.pid)["pid"] == p.pid
        p.stdin.write("go\n")
        p.stdin.flush()
        hello = json.loads(q.get(timeout=30))
        assert hello["pid"] == child
        assert control.status(child)["pid"] == child
    finally:
        p.stdin.close()
        for proc in psutil.Process(p.pid).children(recursive=True):
            proc.kill()
        p.kill()
        p.wait(10)


def test_server_threads_are_named_for_the_freezer(workload):
    w = workload()
    names = [open(f"/proc/{w.pid}/task/{t}/comm").read().strip()
             for t in os.listdir(f"/proc/{w.pid}/task")]
    assert "criu-gpushare" in names


def can_unshare():
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    res = subprocess.run(["unshare", "--pid", "--net", "--fork", "--mount-proc", "true"],
                         capture_output=True)
    return res.returncode == 0


@pytest.mark.skipif(not can_unshare(), reason="needs root and unshare(1) allowed to make pid and "
                                              "network namespaces")
def test_workload_in_its_own_pid_and_network_namespaces_is_reached_from_the_host(shim_env):
    outer = subprocess.Popen(["unshare", "--pid", "--net", "--fork", "--mount-proc",
                              sys.executable, WORKLOAD], env=shim_env, text=True,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        hello = json.loads(outer.stdout.readline())
        assert hello["ok"] and hello["pid"] == 1, hello  # pid 1 in its namespace
        inner = next(c.pid for c in psutil.Process(outer.pid).children(recursive=True)
                     if c.name().startswith("python"))
        outer.stdin.write("malloc buf 4194304\n")
        outer.stdin.flush()
        assert json.loads(outer.stdout.readline())["ok"]
        assert control.socket_name(inner) == "criu-gpushare.1"
        st = control.status(inner)
        assert st["pid"] == 1 and len(st["allocations"]) == 1
        control.quiesce(inner)
        control.resume(inner)
    finally:
        outer.kill()
        outer.wait()


def test_a_process_that_never_uses_cuda_gets_no_socket_and_no_threads(shim_env):
    code = ("import ctypes, os, sys\n"
            "libc = ctypes.CDLL(None)\n"
            "assert libc.getpid() == os.getpid()  # dlsym of ordinary names is untouched\n"
            "print(len(os.listdir('/proc/self/task')), flush=True)\n"
            "sys.stdin.readline()\n")
    p = subprocess.Popen([sys.executable, "-c", code], env=shim_env, text=True,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert int(p.stdout.readline()) == 1
        assert p.pid not in control.shim_pids()
    finally:
        p.stdin.close()
        p.wait(10)
    assert p.returncode == 0
    out = subprocess.run(["sh", "-c", "echo hello"], env=shim_env, capture_output=True, text=True)
    assert out.stdout == "hello\n" and out.stderr == ""


def test_too_many_requests_at_once_get_busy_and_the_workload_goes_on(workload):
    w = workload()
    hangers = []
    try:
        for _ in range(16):  # every worker waits for a request that never comes
            s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            s.connect(f"\0criu-gpushare.{w.pid}")
            hangers.append(s)
        time.sleep(0.2)
        reply = raw(w.pid, b'{"v":2,"cmd":"status"}')
        assert reply["error"] == "busy" and "too many" in reply["reason"]
        w.do("malloc buf 2097152")
    finally:
        for s in hangers:
            s.close()
    time.sleep(0.3)
    assert control.status(w.pid)["allocations"]
