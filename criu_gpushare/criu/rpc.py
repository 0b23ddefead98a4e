"""CRIU through its RPC: one `criu swrk` worker per request, over a socketpair.

Why RPC and not the command line: with ``notify_scripts`` CRIU stops at every action-script point
(pre-dump, post-dump, pre-restore, post-restore, pre-resume, post-resume, ...) and waits for this
process to answer, so GPU steps run inside the tool, with its state and its locks, instead of in a
script that CRIU executes with no arguments. pycriu's client sends one request and reads one
answer, so the conversation is driven here; pycriu only provides the message classes.

Notifications, in CRIU 4.2.1's order (pinned by tests/criu/test_rpc.py for a plain tree and, as
action scripts, by tests/criu/test_runc.py for a container):
  dump     pre-dump (tasks running), [network-lock], query-ext-files (RPC only: CRIU asks for
           external files; answering success adds none), post-dump (tasks seized),
           [network-unlock: only after a failure or with leave_running]
  restore  pre-restore (no task yet), [setup-namespaces, post-setup-namespaces], post-restore,
           [network-unlock], pre-resume (tasks restored, stopped), post-resume (tasks running)
  network-*: only for a tree with its own network namespace; *-namespaces: only for a tree with
  namespaces of its own (a container). Only setup-namespaces and post-restore carry a pid (the
  restored root's, as seen from here); the callback gets None for the others.
"""
from __future__ import annotations

import dataclasses
import os
import re
import select
import shutil
import socket
import subprocess
import tempfile
from typing import Callable, Optional

from ..errors import CriuError
from . import _pycriu

MIN_MAJOR = 4
# One SEQPACKET read returns one whole message, truncated to the buffer; CRIU's are far smaller.
_MAX_MESSAGE = 1 << 20
# swrk exits right after its final answer; waiting longer than this means it hangs.
_EXIT_WAIT_S = 30
_KILLED_EXIT_WAIT_S = 5  # a restored root CRIU has SIGKILLed
_LOG_ERROR_LINES = 5

NotifyCallback = Callable[[str, Optional[int]], None]


@dataclasses.dataclass
class CriuOptions:
    """The CRIU options the tool passes through; each means what criu's flag of that name does."""

    shell_job: bool = False
    tcp_established: bool = False
    ext_unix_sk: bool = False
    file_locks: bool = False
    manage_cgroups: bool = False
    leave_running: bool = False  # dump only
    link_remap: bool = False  # dump only: deleted files still open (multiprocessing's semaphores)
    extra: tuple = ()  # (option, value or None) pairs, written into CRIU's config file (check_extra)
    log_level: int = 4
    log_file: str | None = None  # a name in the image directory; None: dump.log or restore.log
    libdir: str | None = None  # CRIU's plugin directory; RPC has no field, it goes in a config file
    binary: str = "criu"
    timeout_s: float | None = None  # the longest wait for CRIU's next message; then CRIU is killed


def dump(images_dir: str, pid: int, options: CriuOptions,
         on_notify: NotifyCallback | None = None, on_worker=None) -> None:
    """Dump the tree rooted at pid into images_dir, an existing directory. CRIU kills the tree
    afterwards unless options.leave_running. on_notify(action, pid) runs at each action-script
    point while CRIU waits; if it raises (at any dump action), CRIU fails the dump and lets the
    tree run on, and the callback's exception propagates once CRIU has answered. on_worker(pid):
    called with the `criu swrk` process's pid once it runs, before the request is sent."""
    binary, rpc = _criu_and_messages(options)
    opts = _request_options(rpc, options, "dump.log")
    opts.pid = pid
    opts.leave_running = options.leave_running
    opts.link_remap = options.link_remap
    _request(binary, rpc, rpc.DUMP, opts, images_dir, options, on_notify, f"dump of pid {pid}", on_worker)


def restore(images_dir: str, options: CriuOptions,
            on_notify: NotifyCallback | None = None) -> int:
    """Restore the tree in images_dir and return its root pid; the tree runs when this returns.

    The root task is made a child of this process (rst_sibling), not of the CRIU worker, which
    exits: the tree never gets a parent-death signal from CRIU, and when this process exits it is
    reparented to init (or the nearest subreaper). A long-lived caller must reap it (waitpid) once
    it ends, or it stays a zombie. on_notify is called as for dump(). If it raises up to
    post-restore, CRIU kills what it restored, and the root it named there is reaped here; at
    pre-resume or post-resume CRIU only logs the failure and the tree runs on, so the exception
    propagates with the tree running (its pid was given to the callback at post-restore)."""
    binary, rpc = _criu_and_messages(options)
    opts = _request_options(rpc, options, "restore.log")
    opts.rst_sibling = True
    killed_on_failure = {}  # the root CRIU named at post-restore, until pre-resume lets the tree run

    def notify(action, pid):
        if action in ("post-restore", "pre-resume"):
            killed_on_failure["root"] = pid if action == "post-restore" else None
        on_notify(action, pid)

    try:
        resp = _request(binary, rpc, rpc.RESTORE, opts, images_dir, options,
                        notify if on_notify is not None else None, f"restore of {images_dir}")
    except BaseException:
        if killed_on_failure.get("root"):
            _reap_killed(killed_on_failure["root"])
        raise
    return resp.restore.pid


def _reap_killed(root, timeout_s=_KILLED_EXIT_WAIT_S):
    """The root of a restore that failed between post-restore and pre-resume, our child
    (rst_sibling), which CRIU kills then: reaped once it has ended, not left a zombie."""
    try:
        pidfd = os.pidfd_open(root)
    except ProcessLookupError:
        return
    try:
        if select.select([pidfd], [], [], timeout_s)[0]:
            os.waitpid(root, os.WNOHANG)
    except ChildProcessError:
        pass  # not ours after all
    finally:
        os.close(pidfd)


def check(binary: str = "criu") -> str:
    """CRIU's version (e.g. "4.2.1") once `criu check` passes; CriuError saying why if CRIU is
    missing, older than 4, or cannot checkpoint on this kernel."""
    path, version = _criu_version(binary)
    result = subprocess.run([path, "check"], capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        lines = (result.stdout + result.stderr).strip().splitlines()
        raise CriuError(f"`{path} check` failed (exit {result.returncode})",
                        None, lines[-_LOG_ERROR_LINES:])
    return version


def _criu_version(binary: str) -> tuple[str, str]:
    path = shutil.which(binary)
    if path is None:
        raise CriuError(f"{binary} not found (CRIU >= {MIN_MAJOR} is needed)")
    out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
    m = re.search(r"Version:\s*(\d+(?:\.\d+)+)", out)
    if m is None:
        raise CriuError(f"`{path} --version` did not give a version: {out.strip()!r}")
    version = m.group(1)
    if int(version.split(".")[0]) < MIN_MAJOR:
        raise CriuError(f"{path} is CRIU {version}; CRIU >= {MIN_MAJOR} is needed "
                        "(3.x fails on recent kernels)")
    return path, version


def _criu_and_messages(options: CriuOptions):
    """The CRIU binary to run (CRIU >= 4) and pycriu's RPC messages, or CriuError saying why not."""
    binary, _ = _criu_version(options.binary)
    return binary, _pycriu.load("rpc_pb2")


def _request_options(rpc, options: CriuOptions, default_log: str):
    return rpc.criu_opts(
        images_dir_fd=-1,  # set once the directory is open
        shell_job=options.shell_job, tcp_established=options.tcp_established,
        ext_unix_sk=options.ext_unix_sk, file_locks=options.file_locks,
        manage_cgroups=options.manage_cgroups, log_level=options.log_level,
        log_file=options.log_file or default_log)


def _request(binary, rpc, req_type, opts, images_dir, options, on_notify, what, on_worker=None):
    """Send one request with images_dir open as its image directory; answer notifications until
    CRIU's final response, which is returned if it succeeded."""
    log_path = os.path.join(images_dir, opts.log_file)
    try:
        # CRIU opens it as /proc/<this pid>/fd/<fd>: no path lookup on its side, no fd passing.
        dir_fd = os.open(images_dir, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as e:
        raise CriuError(f"{what}: image directory {images_dir}: {e.strerror}") from None
    config = None
    try:
        opts.images_dir_fd = dir_fd
        opts.notify_scripts = on_notify is not None
        if options.libdir or options.extra:
            config = _config_file(options.libdir, options.extra)
            opts.config_file = config
        with _Worker(binary, options.timeout_s, what, log_path) as worker:
            if on_worker is not None:
                on_worker(worker.pid)
            resp = worker.converse(rpc, rpc.criu_req(type=req_type, opts=opts), on_notify)
    finally:
        os.close(dir_fd)
        if config:
            os.unlink(config)
    if not resp.success:
        raise _failed(what, resp, log_path)
    return resp


def _failed(what: str, resp, log_path: str) -> CriuError:
    """CRIU's own account of a failed request: its errno, and its log's last errors. CRIU's
    cr_errmsg is the first error it logged, often a harmless one, so it comes second."""
    message = f"{what} failed"
    if resp.cr_errno:
        message += f" (errno {resp.cr_errno}: {os.strerror(resp.cr_errno)})"
    lines = _log_errors(log_path)
    first = resp.cr_errmsg.strip()
    if first and not any(first in line for line in lines):
        lines.insert(0, f"first error: {first}")
    return CriuError(message, log_path, lines)


# Options the tool sets itself, or that would break its conversation with CRIU or its GPU steps.
RESERVED_OPTIONS = frozenset({
    "tree", "images-dir", "work-dir", "log-file", "output", "libdir", "config", "pidfile",
    "action-script", "restore-detached", "restore-sibling", "leave-running", "leave-stopped",
    "link-remap", "exec-cmd", "daemon", "status-fd", "lazy-pages", "track-mem", "prev-images-dir"})
_OPTION_NAME = re.compile(r"^[a-z][a-z0-9-]*$")


def check_extra(items) -> tuple:
    """CRIU options given as OPTION[=VALUE] (CRIU's long names, without dashes) -> (option, value)
    pairs for its config file; ValueError naming a malformed or reserved one."""
    out = []
    for item in items:
        name, sep, value = item.partition("=")
        name = name.strip().lstrip("-")
        if not _OPTION_NAME.match(name):
            raise ValueError(f"{item!r}: not a CRIU option name (give OPTION or OPTION=VALUE, e.g. "
                             "ext-mount-map=auto)")
        if name in RESERVED_OPTIONS:
            raise ValueError(f"{name!r} is set by criu-gpushare itself and cannot be passed through")
        if any(c in value for c in '"\n\r'):
            raise ValueError(f"{item!r}: a value cannot hold quotes or line breaks")
        out.append((name, value if sep else None))
    return tuple(out)


def _config_file(libdir: str | None, extra=()) -> str:
    """An RPC config file (CRIU reads it after every other setting) carrying what RPC cannot: the
    plugin directory, and the options passed through (check_extra)."""
    if libdir and ('"' in libdir or "\n" in libdir):
        raise CriuError(f"plugin directory {libdir!r}: CRIU's config files cannot name it")
    fd, path = tempfile.mkstemp(prefix="criu-gpushare-", suffix=".conf")
    with os.fdopen(fd, "w") as f:
        if libdir:
            f.write(f'libdir "{os.path.abspath(libdir)}"\n')
        for name, value in extra:
            f.write(f'{name} "{value}"\n' if value is not None else f"{name}\n")
    return path


def _log_errors(log_path: str) -> list[str]:
    """The last error lines of a CRIU log (all its last lines if none says "Error")."""
    try:
        with open(log_path, errors="replace") as f:
            lines = [line.rstrip("\n") for line in f]
    except OSError:
        return []
    errors = [line for line in lines if "Error (" in line]
    return (errors or lines)[-_LOG_ERROR_LINES:]


class _Worker:
    """One `criu swrk` process and this end of its socket. It never outlives the `with`: killed on
    any exception (KeyboardInterrupt included), else waited for."""

    def __init__(self, binary: str, timeout_s: float | None, what: str, log_path: str):
        self._timeout_s = timeout_s
        self._what = what
        self._log_path = log_path
        self._output = tempfile.TemporaryFile()  # what swrk prints before its log is open
        self._sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            # Its own session: a terminal's Ctrl-C reaches the tool, which then kills CRIU itself.
            self._proc = subprocess.Popen(
                [binary, "swrk", str(theirs.fileno())], pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL, stdout=self._output, stderr=self._output,
                start_new_session=True)
        except OSError as e:
            self._close()
            raise CriuError(f"{what}: cannot start {binary} swrk: {e.strerror}") from None
        finally:
            theirs.close()  # else this process holds the peer open and never sees swrk die

    @property
    def pid(self):
        return self._proc.pid

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        try:
            if exc_type is None:
                try:
                    self._proc.wait(_EXIT_WAIT_S)
                except subprocess.TimeoutExpired:
                    self._kill()
            else:
                self._kill()
        finally:
            self._close()

    def converse(self, rpc, request, on_notify: NotifyCallback | None):
        """Send request, answer each NOTIFY (success unless on_notify raised), return the final
        response. on_notify is called for every notification, even after one of its calls
        raised; the first exception is re-raised once CRIU has answered."""
        self._send(request)
        failure = None
        while True:
            resp = self._receive(rpc)
            if resp.type != rpc.NOTIFY:
                break
            pid = resp.notify.pid if resp.notify.HasField("pid") else None
            success = True
            if on_notify is not None:
                try:
                    on_notify(resp.notify.script, pid)
                except Exception as e:  # noqa: BLE001 - CRIU must hear of any failure
                    failure = failure or e
                    success = False
            self._send(rpc.criu_req(type=rpc.NOTIFY, notify_success=success))
        if failure is not None:
            raise failure
        if resp.type != request.type:
            raise self._error(f"CRIU answered a {rpc.criu_req_type.Name(request.type)} request "
                              f"with {rpc.criu_req_type.Name(resp.type)}")
        return resp

    def _send(self, message):
        try:
            self._sock.send(message.SerializeToString())
        except (BrokenPipeError, ConnectionResetError):
            # It ended before reading: the same failure as ending before answering, whichever
            # of the two the race between its exit and this send shows.
            raise self._died("criu swrk ended without an answer") from None
        except OSError as e:
            raise self._died(f"cannot send to criu swrk ({e.strerror})") from None

    def _receive(self, rpc):
        if self._timeout_s is not None:
            ready, _, _ = select.select([self._sock], [], [], self._timeout_s)
            if not ready:
                raise self._error(f"no answer from CRIU in {self._timeout_s:g} s (killed it)")
        try:
            data = self._sock.recv(_MAX_MESSAGE)
        except ConnectionResetError:  # it ended with our request unread
            data = b""
        except OSError as e:
            raise self._died(f"cannot read from criu swrk ({e.strerror})") from None
        if not data:
            raise self._died("criu swrk ended without an answer")
        resp = rpc.criu_resp()
        resp.ParseFromString(data)
        return resp

    def _died(self, message: str) -> CriuError:
        try:
            status = self._proc.wait(5)
            message += f" (exit status {status})" if status >= 0 else f" (killed by signal {-status})"
        except subprocess.TimeoutExpired:
            pass
        self._output.seek(0)
        output = self._output.read().decode(errors="replace").strip().splitlines()
        return self._error(message, output[-_LOG_ERROR_LINES:])

    def _error(self, message: str, extra_lines=()) -> CriuError:
        log_path = self._log_path if os.path.exists(self._log_path) else None
        return CriuError(f"{self._what}: {message}", log_path,
                         [*extra_lines, *_log_errors(self._log_path)])

    def _kill(self):
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()

    def _close(self):
        self._sock.close()
        self._output.close()
