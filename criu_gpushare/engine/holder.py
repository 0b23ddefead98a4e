"""The holder: the one long-lived process that keeps a suspended group suspended.

`criu-gpushare suspend` forks it before anything touches CUDA. It makes every driver checkpoint call
of the group (the driver hangs when two processes make them at once), keeps the group's CPU threads
frozen with ptrace (a freeze lasts only as long as its tracer lives), and waits. `criu-gpushare
resume`, `status` and `abort` talk to it over a unix socket in the private state directory.

State directory: $CRIU_GPUSHARE_RUN_DIR if set, else /run/criu-gpushare as root, else
$XDG_RUNTIME_DIR/criu-gpushare (or /tmp/criu-gpushare-<uid>); it must be a real directory owned by us with mode 0700, so nobody else can
plant files or sockets in it. For a group keyed by its lowest pid K it holds:
  holder-K.sock   the holder's socket        holder-K.log   its log
  pid-P           K, for every pid P of the group (how `resume P` finds the holder)

Wire format: one JSON object per line. The client sends {"cmd": ...}; the holder answers with
zero or more {"event": "progress", "message": ...} lines and one final
{"event": "done", "ok": bool, "message": ..., "exit_code": int, "result": {...}}.
"""
import json
import os
import socket
import stat
import struct
import sys
import traceback

from ..errors import EXIT_BUG, Error, ProcessError


def state_dir():
    if os.environ.get("CRIU_GPUSHARE_RUN_DIR"):
        path = os.environ["CRIU_GPUSHARE_RUN_DIR"]
    elif os.geteuid() == 0:
        path = "/run/criu-gpushare"
    else:
        base = os.environ.get("XDG_RUNTIME_DIR")
        path = os.path.join(base, "criu-gpushare") if base else f"/tmp/criu-gpushare-{os.geteuid()}"
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) != 0o700:
        raise Error(f"{path} must be a directory owned by uid {os.geteuid()} with mode 0700 "
                    "(someone else could plant files in it); remove or fix it")
    return path


def _paths(key):
    d = state_dir()
    return os.path.join(d, f"holder-{key}.sock"), os.path.join(d, f"holder-{key}.log")


def holder_key(pid):
    """The key of the holder keeping pid suspended, or None."""
    try:
        with open(os.path.join(state_dir(), f"pid-{pid}")) as f:
            return int(f.read().strip())
    except (FileNotFoundError, ValueError):
        return None


def send_line(conn, obj):
    conn.sendall(json.dumps(obj).encode() + b"\n")


def _lines(conn):
    buf = b""
    while True:
        data = conn.recv(65536)
        if not data:
            return
        buf += data
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            yield json.loads(line)


def ask(pid, cmd, on_progress=print, **fields):
    """Send a command to the holder of pid; print progress; return the final 'done' object."""
    key = holder_key(pid)
    if key is None:
        raise ProcessError(pid, "is not suspended by criu-gpushare (no holder)")
    sock_path, log = _paths(key)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        try:
            conn.connect(sock_path)
        except (FileNotFoundError, ConnectionRefusedError):
            raise ProcessError(pid, f"its holder is gone ({sock_path}); the processes may be "
                                    f"left checkpointed: see {log}") from None
        send_line(conn, {"cmd": cmd, **fields})
        for obj in _lines(conn):
            if obj.get("event") == "progress":
                on_progress(obj["message"])
            elif obj.get("event") == "done":
                return obj
    finally:
        conn.close()
    raise ProcessError(pid, f"the holder closed the connection without an answer: see {log}")


class Work:
    """What a holder runs; the suspend/resume logic implements it."""

    key = 0
    pids = ()

    def suspend(self, report):  # -> result dict; raise Error to fail (after rolling back)
        raise NotImplementedError

    def handle(self, cmd, fields, report):  # -> (result dict, keep_running: bool)
        raise NotImplementedError


def start(work, on_progress=print):
    """Fork the holder, run work.suspend() in it, relay its progress; return the final object.

    Must be called before this process initialises CUDA (fork and CUDA do not mix).
    """
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # intermediate child: detach, fork the holder, exit
        os.close(rfd)
        os.setsid()
        if os.fork() == 0:
            try:
                _holder_main(work, wfd)
            finally:
                os._exit(0)
        os._exit(0)
    os.close(wfd)
    os.waitpid(pid, 0)
    final = None
    with os.fdopen(rfd, "rb") as r:
        for line in r:
            obj = json.loads(line)
            if obj.get("event") == "progress":
                on_progress(obj["message"])
            elif obj.get("event") == "done":
                final = obj
    if final is None:
        _, log = _paths(work.key)
        final = {"event": "done", "ok": False, "exit_code": EXIT_BUG,
                 "message": f"the holder died without an answer: see {log}"}
    return final


class _Reporter:
    """Progress to a client connection (or the start pipe) and to the log."""

    def __init__(self, write):
        self.write = write

    def __call__(self, message):
        print(message, flush=True)
        try:
            self.write({"event": "progress", "message": message})
        except OSError:
            pass  # the client went away; the work goes on


def _done(ok, message="", exit_code=0, result=None):
    return {"event": "done", "ok": ok, "message": message, "exit_code": exit_code, "result": result or {}}


def _run(fn, report):
    try:
        return _done(True, result=fn(report))
    except Error as e:
        final = _done(False, str(e), e.exit_code)
        # A failure that leaves the group held (a rollback that failed too): the holder stays, so
        # that `resume` can retry once the cause is fixed.
        final["held"] = bool(getattr(e, "group_held", False))
        return final
    except Exception as e:  # a bug: keep the traceback in the log
        traceback.print_exc()
        return _done(False, f"internal error: {e!r}", EXIT_BUG)


def _holder_main(work, wfd):
    sock_path, log = _paths(work.key)
    logfd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(logfd, 1)
    os.dup2(logfd, 2)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    pipe = os.fdopen(wfd, "wb", buffering=0)

    def to_pipe(obj):
        pipe.write(json.dumps(obj).encode() + b"\n")

    print(f"holder {os.getpid()} for pids {' '.join(map(str, work.pids))}", flush=True)
    try:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            os.unlink(sock_path)
        except FileNotFoundError:
            pass
        listener.bind(sock_path)
        listener.listen(4)
    except OSError as e:
        to_pipe(_done(False, f"cannot listen on {sock_path}: {e.strerror}", Error.exit_code))
        return
    final = _run(work.suspend, _Reporter(to_pipe))
    held = final["ok"] or final.get("held")
    if held:
        for pid in work.pids:
            _write_pid_file(pid, work.key)
    to_pipe(final)
    pipe.close()
    if not held:
        listener.close()
        os.unlink(sock_path)
        return
    _serve(work, listener, sock_path)


def _write_pid_file(pid, key):
    path = os.path.join(state_dir(), f"pid-{pid}")
    with open(path + ".tmp", "w") as f:
        f.write(f"{key}\n")
    os.rename(path + ".tmp", path)


def _remove_pid_files(pids):
    for pid in pids:
        try:
            os.unlink(os.path.join(state_dir(), f"pid-{pid}"))
        except FileNotFoundError:
            pass


def _serve(work, listener, sock_path):
    while True:
        conn, _ = listener.accept()
        with conn:
            peer_uid = _peer_uid(conn)
            if peer_uid not in (0, os.geteuid()):
                continue  # the directory is 0700; this is belt and braces
            try:
                request = next(_lines(conn))
            except (StopIteration, ValueError, OSError):
                continue
            cmd = request.pop("cmd", "")
            reporter = _Reporter(lambda obj, c=conn: send_line(c, obj))
            keep = [True]

            def handle(report, cmd=cmd, request=request):
                result, keep[0] = work.handle(cmd, request, report)
                return result

            final = _run(handle, reporter)
            if not keep[0]:
                _remove_pid_files(work.pids)  # before answering: the group is no longer held
            try:
                send_line(conn, final)
            except OSError:
                pass
            if not keep[0]:
                listener.close()
                os.unlink(sock_path)
                print("holder done", flush=True)
                return


def _peer_uid(conn):
    cred = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", cred)[1]


def finish(final, stream=sys.stderr):
    """Turn a holder's final object into the CLI's exit: message on stderr, exit code."""
    if not final["ok"]:
        print(f"criu-gpushare: {final['message']}", file=stream)
        sys.exit(final["exit_code"] or EXIT_BUG)
