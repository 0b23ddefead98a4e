"""The holder: a detached process that does a group's work and then keeps it, answering requests.

`criu-gpushare suspend` and the hook's `pre-dump` and `pre-restore` fork it before anything
touches CUDA (fork and CUDA do not mix). It makes every driver checkpoint call of the group (the
driver hangs when two processes make them at once), keeps the group's CPU threads frozen with
ptrace where the work froze them (a freeze lasts only as long as its tracer lives), and waits for
requests, or for an event its work watches (the hook's holders watch the CRIU process that ran
them), or looks again every so often where its work asks (a suspend held for a stopped member
finishes its rollback once that member runs again). It is a convenience, not the keeper of
record: the journal (engine/journal.py) is, so a holder that dies loses nothing.

Nothing the starting command does can interrupt it mid-step: it runs in its own session, ignores
SIGINT, SIGHUP and SIGPIPE, and its writes to a client that went away are dropped. A cancellable
start passes the command's Ctrl-C on as a request that the work asks between steps
(engine/cancel.py).

State files (engine/statedir.py): holder-K.sock (its socket), holder-K.log (its log; opening it
removes the logs of holders and dump watches that ended a week ago or more: statedir.open_log).
Wire format: one JSON object per line. The client sends {"cmd": ...}; the holder answers with
zero or more {"event": "progress", "message": ...} lines and one final
{"event": "done", "ok": bool, "message": ..., "exit_code": int, "result": {...}}.
"""
import json
import os
import select
import signal
import socket
import struct
import sys
import traceback

from ..errors import EXIT_BUG, Error, Failed, GroupHeld, Interrupted, ProcessError
from . import cancel
from .statedir import open_log, path_of


def _paths(key):
    return path_of(f"holder-{key}.sock"), path_of(f"holder-{key}.log")


def log_path(key):
    return _paths(key)[1]


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


class NoHolder(ProcessError):
    """process {}: {}"""
    # No holder listens for the key: it never started, or it has ended (nothing was asked of it).


def criu_restore_key(criu_pid):
    """The key of the holder that the hook's pre-restore starts for the CRIU restore run by
    criu_pid, and that its post-restore and post-resume ask (engine/jobs.py)."""
    return f"restore-{criu_pid}"


def ask(key, cmd, on_progress=print, **fields):
    """Send a command to the holder of group `key`; relay progress; return the final object.
    NoHolder when none listens; ProcessError when it closes without an answer (the caller then
    works from the journal)."""
    sock_path, log = _paths(key)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        try:
            conn.connect(sock_path)
        except (FileNotFoundError, ConnectionRefusedError):
            raise NoHolder(key, f"its holder is gone ({sock_path}); see {log}") from None
        try:
            send_line(conn, {"cmd": cmd, **fields})
            for obj in _lines(conn):
                if obj.get("event") == "progress":
                    on_progress(obj["message"])
                elif obj.get("event") == "done":
                    return obj
        except (ConnectionResetError, BrokenPipeError):
            pass  # it was closing as we connected
    finally:
        conn.close()
    raise ProcessError(key, f"the holder closed the connection without an answer: see {log}")


class Work:
    """What a holder runs (engine/suspension.py's SuspendWork, engine/jobs.py's _CriuDumpWork,
    engine/restore_holder.py's RestoreHolder)."""

    key = 0
    pids = ()
    cancel = None  # in the holder of a cancellable start: an engine/cancel.Cancel for begin()

    def begin(self, report):
        """The work done at start -> (result dict, keep: bool: whether the holder stays).
        Raise Error to fail; a GroupHeld error keeps the holder, for `resume`."""
        raise NotImplementedError

    def handle(self, cmd, fields, report):  # -> (result dict, keep_running: bool)
        raise NotImplementedError

    def stays_after_failure(self, error):
        """Whether the holder stays after a request failed (by default: a failed request
        changes nothing)."""
        return True

    def watched_fd(self):
        """An fd whose readiness means an event for `on_event` (None: requests only)."""
        return None

    def on_event(self, report):  # -> keep_running: bool
        return True

    def poll_s(self):
        """Seconds between calls of on_tick while no request comes (None: never)."""
        return None

    def on_tick(self, report):  # -> keep_running: bool
        return True

    def finish(self):
        """Last work, once the holder answered its last request and before it ends (its process
        ends with os._exit: Python's exit handlers do not run)."""


class CriuWork(Work):
    """A holder for one CRIU run by the hook: it watches that CRIU process (on_event: it ended)."""

    def __init__(self, criu_pid):
        self.criu_pid = criu_pid
        self.criu_fd = None

    def watch_criu(self):
        self.criu_fd = os.pidfd_open(self.criu_pid)  # before the work: CRIU waits for us anyway

    def watched_fd(self):
        return self.criu_fd


def start(work, on_progress=print, cancellable=False):
    """Fork the holder, run work.begin() in it, relay its progress; return the final object.

    cancellable: the first Ctrl-C here asks the holder to cancel (work.cancel) and waits for its
    answer, marked "interrupted": true; a second one stops waiting (Interrupted's exit code: the
    holder goes on). Must be called before this process initialises CUDA (fork and CUDA do not mix).
    """
    _standard_fds_open()
    rfd, wfd = os.pipe()
    cancel_r, cancel_w = os.pipe() if cancellable else (None, None)
    pid = os.fork()
    if pid == 0:  # intermediate child: detach, fork the holder, exit
        os.close(rfd)
        os.setsid()
        if os.fork() == 0:
            try:
                if cancellable:
                    os.close(cancel_w)
                    work.cancel = cancel.Cancel(cancel_r)
                _holder_main(work, wfd)
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(0)
        os._exit(0)
    os.close(wfd)
    os.waitpid(pid, 0)
    if not cancellable:
        return _follow(rfd, work, on_progress)

    def first_interrupt():
        cancel.ask_holder(cancel_w)
        on_progress("interrupt: cancelling before the next step, then rolling back (Ctrl-C again "
                    "stops waiting; the rollback then goes on without this command)")

    os.close(cancel_r)
    try:
        with cancel.on_interrupt(first_interrupt) as seen:
            final = _follow(rfd, work, on_progress)
    except KeyboardInterrupt:
        return _done(False, f"not waiting any more: the holder goes on (its log: {log_path(work.key)}); "
                     f"`criu-gpushare status {work.key}` shows the group as it is", Interrupted.exit_code)
    finally:
        os.close(cancel_w)
    final["interrupted"] = bool(seen)
    return final


def _follow(rfd, work, on_progress):
    """Relay the holder's progress from its start pipe; -> its final object."""
    final = None
    with os.fdopen(rfd, "rb") as r:
        for line in r:
            obj = json.loads(line)
            if obj.get("event") == "progress":
                on_progress(obj["message"])
            elif obj.get("event") == "done":
                final = obj
    if final is None:
        final = {"event": "done", "ok": False, "exit_code": GroupHeld.exit_code,
                 "message": f"the holder died without an answer (its log: {log_path(work.key)}); "
                            "`criu-gpushare status` shows the group, and `criu-gpushare resume` "
                            "finishes its rollback from the journal"}
    return final


def _standard_fds_open():
    """CRIU runs action scripts with stdin closed: a pipe or log opened then would take fd 0, and
    the holder's own dup2 onto 0-2 would overwrite it. Fill any gap with /dev/null first."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)


class _Reporter:
    """Progress to a client connection (or the start pipe) and to the log; a client that went
    away costs nothing."""

    def __init__(self, write):
        self.write = write

    def __call__(self, message):
        print(message, flush=True)
        self.send({"event": "progress", "message": message})

    def send(self, obj):
        if self.write is None:
            return
        try:
            self.write(obj)
        except (OSError, ValueError):  # ValueError: its file is closed
            self.write = None  # the client went away; the work goes on


def _done(ok, message="", exit_code=0, result=None):
    return {"event": "done", "ok": ok, "message": message, "exit_code": exit_code, "result": result or {}}


def _run(fn, report, keep_on_error):
    """-> (final object, keep: whether the holder stays). keep_on_error(error) decides after a
    failure."""
    try:
        result, keep = fn(report)
        return _done(True, result=result), keep
    except Error as e:
        return _done(False, str(e), e.exit_code), keep_on_error(e)
    except Exception as e:  # a bug: keep the traceback in the log
        traceback.print_exc()
        return _done(False, f"internal error: {e!r}", EXIT_BUG), keep_on_error(e)


def _holder_main(work, wfd):
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_IGN)
    sock_path, log = _paths(work.key)
    logfd = open_log(log)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(logfd, 1)
    os.dup2(logfd, 2)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    pipe = os.fdopen(wfd, "wb", buffering=0)
    to_pipe = _Reporter(lambda obj: pipe.write(json.dumps(obj).encode() + b"\n"))

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
        to_pipe.send(_done(False, f"cannot listen on {sock_path}: {e.strerror}", Error.exit_code))
        return
    # A failed begin leaves the holder only where the work says the group is held (GroupHeld).
    final, keep = _run(work.begin, to_pipe, lambda e: isinstance(e, GroupHeld))
    to_pipe.send(final)
    try:
        pipe.close()
    except OSError:
        pass
    if keep:
        _serve(work, listener)
    listener.close()
    os.unlink(sock_path)
    work.finish()
    print("holder done", flush=True)


def _serve(work, listener):
    while True:
        watched = work.watched_fd()
        ready, _, _ = select.select([listener] + ([watched] if watched is not None else []), [], [],
                                    work.poll_s())
        if not ready:
            if not work.on_tick(_Reporter(None)):
                return
            continue
        if watched is not None and watched in ready:
            if not work.on_event(_Reporter(None)):
                return
            continue
        conn, _ = listener.accept()
        with conn:
            if _peer_uid(conn) not in (0, os.geteuid()):
                continue  # the directory is 0700; this is belt and braces
            conn.settimeout(30)
            try:
                request = next(_lines(conn))
            except (StopIteration, ValueError, OSError):
                continue
            conn.settimeout(None)
            cmd = request.pop("cmd", "")
            reporter = _Reporter(lambda obj, c=conn: send_line(c, obj))
            final, keep = _run(lambda report: work.handle(cmd, request, report), reporter,
                               work.stays_after_failure)
            reporter.send(final)
            if not keep:
                return


def _peer_uid(conn):
    cred = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", cred)[1]


def outcome(final, consequence=None):
    """A holder's final object -> its result; Failed, with the holder's message and exit code, when
    it failed (the entry point that called says it and exits with that code). consequence: what
    follows from the failure (the hook says what CRIU then does), added to the message."""
    if not final["ok"]:
        suffix = f" ({consequence})" if consequence else ""
        raise Failed(final["message"] + suffix, final["exit_code"])
    return final["result"]
