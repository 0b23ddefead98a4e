"""The stand-in of `criu-gpushare dump` should that command die mid-dump (SIGKILL, OOM).

The command makes the GPU side of the dump in its own process (CRIU's RPC notifications arrive
there), so once it has checkpointed the tree's GPU state only it would give that state back. If it
dies, its CRIU, the answer lost, fails the dump and lets the tasks go: the processes with GPU state
stay stopped (they never run on missing memory) and the journal says how to bring them back. This
watch, a process of its own session started before anything touches CUDA, does that without anyone:
it waits for the command to end; if the command did not stand it down first, it waits for the
command's exit to complete (its GPU context gone) and for the CRIU process to end (no driver call
can reach a task CRIU still holds), then runs `criu-gpushare resume` on the tree when a journal
still holds it, exactly as a user would.

Wire: the command writes "criu PID" once CRIU runs, "done" when it ends by any path it controls
(success, error, Ctrl-C: it has then settled the tree itself), one line each, on the watch's stdin.
End of file without "done" means the command died. Its log: dumpwatch-KEY.log in the state directory
(removed when it stood down with nothing to say).
"""
import contextlib
import os
import select
import signal
import subprocess
import sys
import time

from .faults import FAULT_ENV
from .statedir import open_log, path_of

CRIU_EXIT_WAIT_S = 600  # CRIU without its RPC peer fails at its next notification; a large dump's
# memory pass may come first. Past this, resume runs anyway and says what holds the tasks.
COMMAND_EXIT_WAIT_S = 60  # from its pipe's end (its files closing) to its exit (all of them closed)
_PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def log_path(key):
    return path_of(f"dumpwatch-{key}.log")


class DumpWatch:
    """The command's side: start() before the dump, criu_started(pid) once CRIU runs,
    stand_down() at the end of every path the command controls."""

    def __init__(self, proc, fd, log):
        self._proc, self._fd, self._log = proc, fd, log

    @classmethod
    def start(cls, key, report=print):
        """The watch of the dump of the tree whose key is `key`; without one (it could not be
        started: report says so) the dump goes on as before, a `resume` away from recovery."""
        try:
            return cls._start(key)
        except OSError as e:
            report(f"no watch for this dump ({e}): should this command die mid-dump, "
                   f"`criu-gpushare resume {key}` gives the tree back")
            return cls(None, None, None)

    @classmethod
    def _start(cls, key):
        read_end, write_end = os.pipe()
        # a fault injected into the dump (engine/faults.py) is not the recovery's
        env = {k: v for k, v in os.environ.items() if not k.startswith(FAULT_ENV)}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_PARENT, env.get("PYTHONPATH")) if p)
        path = log_path(key)
        try:
            with os.fdopen(open_log(path), "ab") as log:
                proc = subprocess.Popen([sys.executable, "-m", __name__, str(key), str(os.getpid())],
                                        stdin=read_end,
                                        stdout=log, stderr=log, env=env, start_new_session=True)
        finally:
            os.close(read_end)
        return cls(proc, write_end, path)

    def _say(self, line):
        if self._fd is None:
            return  # never started
        try:
            os.write(self._fd, line.encode() + b"\n")
        except OSError:
            pass  # the watch is gone: nothing to tell

    def criu_started(self, pid):
        self._say(f"criu {pid}")

    def stand_down(self):
        if self._fd is None:
            return
        self._say("done")
        os.close(self._fd)
        self._fd = None
        try:
            self._proc.wait(5)  # it exits at once on "done"
        except subprocess.TimeoutExpired:
            return
        with contextlib.suppress(OSError):  # an empty log says nothing: not left behind
            if os.path.getsize(self._log) == 0:
                os.unlink(self._log)


def _pidfd(pid):
    try:
        return os.pidfd_open(pid)
    except ProcessLookupError:
        return None  # already gone


def _wait_for_command():
    """-> (whether the command stood down, CRIU's pidfd or None)."""
    criu_fd, buf = None, b""
    while True:
        data = os.read(0, 4096)
        if not data:
            return False, criu_fd
        buf += data
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            if line == b"done":
                return True, criu_fd
            if line.startswith(b"criu "):
                try:
                    criu_fd = _pidfd(int(line.split()[1]))
                except ValueError:
                    criu_fd = None  # not a pid: nothing to wait for


def _wait_for_exit(pidfd, timeout_s, ended, still_running):
    """Wait up to timeout_s for the process of pidfd (None: gone already) to exit; say which."""
    if pidfd is not None:
        _say(ended if select.select([pidfd], [], [], timeout_s)[0] else still_running)


def _say(message):
    """A line of the log, timed: what the watch did is read after the fact."""
    print(f"{time.strftime('%H:%M:%S')} {message}", flush=True)


def main(argv):
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_IGN)
    key = int(argv[1])
    command_fd = _pidfd(int(argv[2]))
    stood_down, criu_fd = _wait_for_command()
    if stood_down:
        return 0
    _say(f"dump of the tree of {key}: its command died before it gave the GPU state back")
    # The pipe ends as the dead command's files close, one by one: its GPU context may still be
    # going away. No driver call is made until it has (the driver hangs on calls from two
    # processes at once).
    _wait_for_exit(command_fd, COMMAND_EXIT_WAIT_S, "its command has exited",
                   f"its command has not exited {COMMAND_EXIT_WAIT_S} s after its end; going on")
    _wait_for_exit(criu_fd, CRIU_EXIT_WAIT_S, "its CRIU has ended",
                   f"CRIU still runs after {CRIU_EXIT_WAIT_S} s; resuming anyway")
    from . import journal
    try:
        held = journal.owner_of(key) is not None
    except Exception as e:  # a state file it cannot read: resume names it
        _say(f"its journal: {e}")
        held = True
    if not held:
        _say("no journal holds it: nothing to give back")
        return 0
    _say(f"running: criu-gpushare resume {key}")
    os.execv(sys.executable, [sys.executable, "-m", "criu_gpushare.cli", "resume", str(key)])


if __name__ == "__main__":
    sys.exit(main(sys.argv))
