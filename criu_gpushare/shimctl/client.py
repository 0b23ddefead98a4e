"""Client of the shim's control socket (protocol: shim/protocol.md).

Each process that runs with the shim and has initialized CUDA listens on the abstract unix socket
``@criu-gpushare.<pid>``, where <pid> is its pid in its own pid namespace. One connection carries
one request and one reply.

Namespaces (containers): the socket lives in the workload's network namespace and is named with the
workload's own pid. From the host, this client
  1. maps the host pid to the pid the workload sees (last field of ``NSpid`` in /proc/PID/status),
  2. creates its socket inside the workload's network namespace (setns on one thread, then back;
     needs CAP_SYS_ADMIN) when that differs from ours,
  3. after connecting, checks that the server's SO_PEERCRED pid, which the kernel translates into
     our pid namespace, is the host pid asked for, and that its uid (translated into our user
     namespace) is 0 or that process's effective uid. Abstract names carry no permissions, so this
     check is what stops another process that bound the name from answering.
The shim, for its part, only serves root or its own user (SO_PEERCRED uid).
"""
from __future__ import annotations

import array
import ctypes
import errno
import json
import os
import select
import socket
import struct
import threading
import time

from .. import waits
from ..errors import BusyError, ProcessError, ProcessNoAnswer, ShimError, ShimNoAnswer, ShimNotServing

PROTOCOL = 2  # CRIU_GPUSHARE_PROTOCOL in shim/include/criu_gpushare_shim.h
SOCKET_PREFIX = "criu-gpushare."
MAX_RECORD = 65536
MAX_REPLY = 64 << 20
MAX_FDS = 32  # fds one reply may carry (the shim's GS_REPLY_MAX_FDS: an export of "ids")
DEFAULT_TIMEOUT = 10.0
CONNECT_RETRY_S = 0.5  # how long a full listen backlog is retried
CLONE_NEWNET = 0x40000000

_setns_lock = threading.Lock()


def ns_pid(pid: int) -> int:
    """The pid that process `pid` (as we see it) has in its own pid namespace."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    return int(line.split()[-1])
    except FileNotFoundError:
        raise ProcessError(pid, "no such process") from None
    except PermissionError as e:
        raise ProcessError(pid, f"cannot read /proc/{pid}/status: {e.strerror}") from None
    return pid  # kernels without NSpid: no pid namespaces to map through


def socket_name(pid: int) -> str:
    """Abstract socket name (without the leading NUL) of the shim in process `pid`."""
    return f"{SOCKET_PREFIX}{ns_pid(pid)}"


def _same_netns(pid: int) -> bool:
    try:
        return os.stat("/proc/self/ns/net").st_ino == os.stat(f"/proc/{pid}/ns/net").st_ino
    except FileNotFoundError:
        raise ProcessError(pid, "no such process") from None
    except PermissionError:
        return False


def _libc_setns(fd: int, nstype: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, nstype) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def _socket_in_netns(pid: int) -> socket.socket:
    """A SOCK_SEQPACKET socket created in the network namespace of `pid`."""
    if _same_netns(pid):
        return socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    # setns(CLONE_NEWNET) affects only the calling thread: switch, create, switch back.
    with _setns_lock:
        own = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        try:
            try:
                target = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
            except OSError as e:
                raise ProcessError(pid, f"cannot open its network namespace: {e.strerror}") from None
            try:
                _libc_setns(target, CLONE_NEWNET)
            except OSError as e:
                raise ProcessError(pid, f"cannot enter its network namespace ({e.strerror}): "
                                        "run as root (CAP_SYS_ADMIN)") from None
            finally:
                os.close(target)
            try:
                return socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
            finally:
                _libc_setns(own, CLONE_NEWNET)
        finally:
            os.close(own)


def _connect(sock: socket.socket, pid: int, name: str, timeout: float) -> None:
    """Connects, retrying a full listen backlog (EAGAIN: the socket is non-blocking under a
    timeout) for at most CONNECT_RETRY_S, so a flooded name costs a bounded wait, not a hang."""
    deadline = time.monotonic() + min(timeout, CONNECT_RETRY_S)
    delay = 0.005
    while True:
        try:
            sock.connect("\0" + name)
            return
        except (ConnectionRefusedError, FileNotFoundError):
            raise ShimNotServing(f"process {pid} has no control socket @{name}: it does not run with "
                                 "the shim, or has not initialized CUDA yet") from None
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise BusyError(f"process {pid}: the listen backlog of @{name} stayed full for "
                                f"{CONNECT_RETRY_S:g} s (the shim is overloaded, or someone floods "
                                "the name): try again") from None
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
        except socket.timeout:
            raise ShimNoAnswer(f"process {pid}: connecting to @{name} timed out") from None
        except OSError as e:
            raise ShimError(f"process {pid}: cannot connect to @{name}: {e.strerror}") from None


def _peer_cred(sock: socket.socket) -> tuple[int, int]:
    """(pid, uid) of the server, as the kernel recorded them when it listened, translated into our
    pid and user namespaces."""
    cred = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _ = struct.unpack("3i", cred)
    return pid, uid


def owner_uid(pid: int) -> int:
    """The effective uid of process `pid` (/proc/PID/status, in our user namespace)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Uid:"):
                    return int(line.split()[2])
    except FileNotFoundError:
        raise ProcessError(pid, "no such process") from None
    except PermissionError as e:
        raise ProcessError(pid, f"cannot read /proc/{pid}/status: {e.strerror}") from None
    raise ProcessError(pid, f"/proc/{pid}/status has no Uid line")


def _check_server(sock: socket.socket, pid: int, name: str) -> None:
    """An answer counts only from the process the name promises, running as root or as that
    process's owner (protocol.md, "Authentication"): anyone can bind an abstract name."""
    server, uid = _peer_cred(sock)
    if server != pid:
        raise ShimError(f"@{name} is served by pid {server}, not {pid}: refusing to talk to it")
    owner = owner_uid(pid)
    if uid not in (0, owner):
        raise ShimError(f"@{name} is served as uid {uid}, but process {pid} runs as uid {owner}: "
                        "refusing to talk to it")


def _wait_readable(sock: socket.socket, pid: int, cmd: str, deadline: float, timeout: float) -> None:
    """Until the server's next record (or its close) can be read: ShimNoAnswer past the deadline;
    ProcessNoAnswer as soon as the process is seen stopped (SIGSTOP: its shim cannot answer until
    SIGCONT, so waiting longer only delays the error)."""
    while True:
        left = deadline - time.monotonic()
        if select.select([sock], [], [], min(max(left, 0.0), waits.POLL_S))[0]:
            return
        if left <= 0:
            raise ShimNoAnswer(f"process {pid}: no reply to {cmd!r} within {timeout:.1f} s")
        why = waits.stopped(pid)
        if why:
            raise ProcessNoAnswer(pid, f"is {why}: its shim cannot answer {cmd!r}; continue it "
                                  f"(kill -CONT {pid}) and try again")


def _recv_all(sock: socket.socket, pid: int, cmd: str, deadline: float,
              timeout: float) -> tuple[bytes, list[int]]:
    """Reads records until the server closes; returns the bytes and the fds received."""
    chunks, fds, total = [], [], 0
    fd_size = array.array("i").itemsize
    while True:
        try:
            _wait_readable(sock, pid, cmd, deadline, timeout)
        except (ShimError, ProcessNoAnswer):  # every way it fails: the fds received so far closed
            _close_all(fds)
            raise
        data, anc, flags, _ = sock.recvmsg(MAX_RECORD, socket.CMSG_SPACE(MAX_FDS * fd_size))
        for level, kind, payload in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                got = array.array("i")
                got.frombytes(payload[: len(payload) - len(payload) % fd_size])
                fds.extend(got)
        if flags & socket.MSG_TRUNC:
            _close_all(fds)
            raise ShimError(f"process {pid}: reply record larger than {MAX_RECORD} bytes")
        if flags & socket.MSG_CTRUNC:
            _close_all(fds)
            raise ShimError(f"process {pid}: reply with more than {MAX_FDS} fds")
        if not data:
            return b"".join(chunks), fds
        chunks.append(data)
        total += len(data)
        if total > MAX_REPLY:
            _close_all(fds)
            raise ShimError(f"process {pid}: reply larger than {MAX_REPLY} bytes")


def _close_all(fds):
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def request(pid: int, cmd: str, fds: tuple[int, ...] = (), timeout: float = DEFAULT_TIMEOUT,
            **fields) -> tuple[dict, list[int]]:
    """Sends one request to the shim of `pid`; returns (reply, received fds).

    The caller owns the received fds. `timeout` bounds the whole request (seconds; what is left of
    the caller's deadline). Errors: ProcessError (no such process, cannot reach it), ShimError (no
    shim socket, a server that is not that process's shim, a refusal, a malformed reply),
    ShimNoAnswer (no reply within `timeout`), ProcessNoAnswer (the process is stopped), BusyError
    (the shim is busy or its backlog stays full: retry). Never a bare OSError.
    """
    deadline = time.monotonic() + timeout
    name = socket_name(pid)
    msg = json.dumps({"v": PROTOCOL, "cmd": cmd, **fields}).encode()
    sock = _socket_in_netns(pid)
    try:
        sock.settimeout(max(timeout, 0.001))  # 0 would make the socket non-blocking
        _connect(sock, pid, name, timeout)
        _check_server(sock, pid, name)
        try:
            try:
                if fds:
                    socket.send_fds(sock, [msg], list(fds))
                else:
                    sock.send(msg)
            except (BrokenPipeError, ConnectionResetError):
                pass  # a refusal is sent before the request is read: read it below
            raw, got_fds = _recv_all(sock, pid, cmd, deadline, timeout)
        except socket.timeout:  # a send that could not go out
            raise ShimNoAnswer(f"process {pid}: no reply to {cmd!r} within {timeout:.1f} s") from None
        except OSError as e:
            if e.errno in (errno.ECONNRESET, errno.EPIPE):
                raise ShimError(f"process {pid} closed the connection during {cmd!r}") from None
            raise ShimError(f"process {pid}: {cmd!r} failed on the socket: {e.strerror}") from None
    finally:
        sock.close()
    try:
        reply = json.loads(raw)
        if not isinstance(reply, dict):
            raise ValueError("not an object")
    except ValueError as e:
        _close_all(got_fds)
        raise ShimError(f"process {pid}: malformed reply to {cmd!r}: {e}") from None
    if not reply.get("ok"):
        _close_all(got_fds)
        code, reason = reply.get("error", "failed"), reply.get("reason", "")
        if code == "version":
            # A shim of protocol 2 or later says which it speaks; a protocol 1 shim only puts its
            # own version in "v".
            theirs = reply.get("protocol", reply.get("v", "?"))
            raise ShimError(f"process {pid} runs a criu-gpushare shim of control protocol {theirs}; "
                            f"this criu-gpushare speaks {PROTOCOL}: restart the workload with this "
                            "version's shim (`criu-gpushare run`)")
        if code == "busy":
            raise BusyError(f"process {pid}: {reason}")
        raise ShimError(f"process {pid}: {cmd} {code}: {reason}")
    return reply, got_fds


def status(pid: int, timeout: float = DEFAULT_TIMEOUT) -> dict:
    """What the shim of `pid` tracks: allocations, mappings, imports, exports, host buffers, gates."""
    return request(pid, "status", timeout=timeout)[0]


def quiesce(pid: int, timeout_ms: int = 2000, timeout: float = None) -> dict:
    """Holds the GPU work of `pid` (both gates closed, GPU drained). BusyError: retry later.
    timeout: the request's bound (default: room for both of the shim's drain stages)."""
    if timeout is None:
        timeout = timeout_ms / 1000 * 3 + DEFAULT_TIMEOUT
    return request(pid, "quiesce", timeout=timeout, timeout_ms=timeout_ms)[0]


def resume(pid: int, timeout: float = DEFAULT_TIMEOUT) -> dict:
    """Opens both gates of `pid` again (also after a refused or busy quiesce)."""
    return request(pid, "resume", timeout=timeout)[0]


def shim_pids() -> list[int]:
    """Pids with a shim control socket in our network namespace (pids as named in the sockets)."""
    pids = set()
    try:
        with open("/proc/net/unix") as f:
            for line in f:
                path = line.split()[-1] if line.strip() else ""
                if path.startswith("@" + SOCKET_PREFIX):
                    tail = path[len(SOCKET_PREFIX) + 1:]
                    if tail.isdigit():
                        pids.add(int(tail))
    except OSError:
        return []
    return sorted(pids)
