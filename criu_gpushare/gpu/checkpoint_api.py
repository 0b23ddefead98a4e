"""The driver's process checkpoint API (cuCheckpointProcess*), called from threads of this process.

Rules from the driver's behaviour (see README "Why it exists" and tests/probes):
- Every call is made from this one long-lived process; several pids are handled at once by threads.
  Calls made at the same time from two *processes* never returned on driver 580 and ignored SIGTERM,
  so a node-wide lock (DriverLock) keeps two criu-gpushare runs from overlapping. Its file lives in
  the tool's private state directory (0700, ours), so no other user can hold it or plant it.
- A call that does not return in time cannot be cancelled: it is reported with the pid and the
  operation, and its thread is left behind (daemon) rather than blocking the tool for ever. Every
  call goes through the target's own restore thread, so a target that is stopped (SIGSTOP) never
  answers: that is seen while waiting and reported at once (criu_gpushare/waits.py).
- The caller must have called cuInit (restore needs it, or persistence mode).
"""
import ctypes
import enum
import errno
import fcntl
import os
import stat
import sys
import threading
import time

from . import driver as drv
from .. import waits
from ..config import state_dir_path
from ..errors import BusyError, DriverError, DriverNoAnswer, Error, ProcessNoAnswer
from .devices import parse_uuid

QUERY_S = 30.0  # the default bound of a state or restore-thread query

#: The node-wide driver lock's file, in the tool's private state directory (as root).
DEFAULT_LOCK_PATH = "/run/criu-gpushare/driver.lock"
DRIVER_LOCK_NAME = "driver.lock"


class State(enum.Enum):
    RUNNING = "running"
    LOCKED = "locked"
    CHECKPOINTED = "checkpointed"
    FAILED = "failed"
    CHECKPOINTING = "checkpointing"
    RESTORING = "restoring"


def _state_from_driver(value):
    cu = drv.driver()
    names = {cu.CUprocessState.CU_PROCESS_STATE_RUNNING: State.RUNNING,
             cu.CUprocessState.CU_PROCESS_STATE_LOCKED: State.LOCKED,
             cu.CUprocessState.CU_PROCESS_STATE_CHECKPOINTED: State.CHECKPOINTED,
             cu.CUprocessState.CU_PROCESS_STATE_FAILED: State.FAILED}
    for extra in ("CHECKPOINTING", "RESTORING"):  # newer bindings only
        member = getattr(cu.CUprocessState, f"CU_PROCESS_STATE_{extra}", None)
        if member is not None:
            names[member] = State[extra]
    return names[value]


def _state(pid):
    cu = drv.driver()
    return _state_from_driver(drv.check(cu.cuCheckpointProcessGetState(pid), f"get state of pid {pid}"))


def _ask(pid, op, timeout_s, what):
    """op(pid) in a thread of its own, its answer within timeout_s (see _run_all)."""
    values, errors = _run_all([pid], op, (), timeout_s, what)
    if errors:
        raise errors[pid]
    return values[pid]


def state(pid, timeout_s=QUERY_S):
    return _ask(pid, _state, timeout_s, "state query")


def state_if_initialized(pid, timeout_s=QUERY_S):
    """The driver state of pid, or None when it never called cuInit (it has no GPU state)."""
    try:
        return state(pid, timeout_s)
    except DriverError as e:
        if e.result == "CUDA_ERROR_NOT_INITIALIZED":
            return None
        raise


def _restore_thread_id(pid):
    cu = drv.driver()
    return drv.check(cu.cuCheckpointProcessGetRestoreThreadId(pid), f"get restore thread of pid {pid}")


def restore_thread_id(pid, timeout_s=QUERY_S):
    """The thread of `pid` that carries out checkpoint operations (a freezer must spare it)."""
    return _ask(pid, _restore_thread_id, timeout_s, "restore thread query")


def _lock(pid, timeout_ms):
    cu = drv.driver()
    args = cu.CUcheckpointLockArgs()
    args.timeoutMs = timeout_ms
    drv.check(cu.cuCheckpointProcessLock(pid, args), f"lock pid {pid}")


def _checkpoint(pid):
    cu = drv.driver()
    drv.check(cu.cuCheckpointProcessCheckpoint(pid, None), f"checkpoint pid {pid}")


def _restore(pid, gpu_pairs):
    cu = drv.driver()
    args = None
    if gpu_pairs:
        args = cu.CUcheckpointRestoreArgs()
        pairs = []
        for old, new in gpu_pairs:
            pair = cu.CUcheckpointGpuPair()
            pair.oldUuid = _cuuuid(old)
            pair.newUuid = _cuuuid(new)
            pairs.append(pair)
        args.gpuPairs = pairs
        args.gpuPairsCount = len(pairs)
    drv.check(cu.cuCheckpointProcessRestore(pid, args), f"restore pid {pid}")


def _unlock(pid):
    cu = drv.driver()
    drv.check(cu.cuCheckpointProcessUnlock(pid, None), f"unlock pid {pid}")


def _cuuuid(text):
    cu = drv.driver()
    raw = parse_uuid(text)
    u = cu.CUuuid()
    ctypes.memmove(u.getPtr(), raw, 16)  # cuda-python's CUuuid.bytes is read-only
    return u


def gpu_map(checkpointed_uuids, current_uuids, explicit=None):
    """Pairs (old, new) for a restore: identity where a checkpointed GPU is present, else by order.

    explicit: {old: new} given by the user wins. The driver needs every checkpointed GPU listed once
    the map is non-trivial; returns [] when every GPU is where it was (no map needed).
    """
    explicit = dict(explicit or {})
    missing = [u for u in explicit.values() if u not in current_uuids]
    if missing:
        raise DriverError(f"GPU map names GPUs that are not visible here: {', '.join(missing)}")
    pairs = {old: explicit[old] for old in checkpointed_uuids if old in explicit}
    for old in checkpointed_uuids:  # a GPU still here stays itself, unless the user moved it
        if old not in pairs and old in current_uuids and old not in pairs.values():
            pairs[old] = old
    free = [u for u in current_uuids if u not in pairs.values()]
    for old in checkpointed_uuids:
        if old in pairs:
            continue
        new = free[0] if free else None
        if new is None:
            raise DriverError(f"{len(checkpointed_uuids)} GPU(s) were checkpointed but only "
                              f"{len(current_uuids)} are visible here")
        pairs[old] = new
        free.remove(new)
    if all(old == new for old, new in pairs.items()):
        return []
    return [(old, pairs[old]) for old in checkpointed_uuids]


def _run_all(pids, op, args, timeout_s, what):
    """op(pid, *args) for every pid at once, one thread each -> ({pid: value}, {pid: Exception}).

    A call still running after timeout_s, or whose pid is seen stopped (SIGSTOP) while it runs,
    gets DriverNoAnswer or ProcessNoAnswer: it cannot be cancelled, so its thread is left as a
    daemon and the pid must be treated as in an unknown state.
    """
    values, errors = {}, {}

    def run(pid):
        try:
            values[pid] = op(pid, *args)
        except Exception as e:  # reported per pid, never lost
            errors[pid] = e

    threads = {pid: threading.Thread(target=run, args=(pid,), daemon=True, name=f"{what}-{pid}")
               for pid in pids}
    for t in threads.values():
        t.start()
    deadline = waits.Deadline(timeout_s)
    waiting, gave_up = dict(threads), {}
    while waiting:
        next(iter(waiting.values())).join(min(waits.POLL_S, deadline.left()))
        for pid, t in list(waiting.items()):
            if not t.is_alive():
                del waiting[pid]
            elif why := waits.stopped(pid):
                gave_up[pid] = ProcessNoAnswer(pid, f"is {why}: the driver's {what} cannot reach it; "
                                               f"continue it (kill -CONT {pid}) and try again")
            elif deadline.passed():
                gave_up[pid] = DriverNoAnswer(f"{what} of pid {pid} did not return within "
                                              f"{timeout_s:g} s")
            if pid in gave_up:
                del waiting[pid]
    # A call given up on that returns later changes nothing here.
    return ({p: v for p, v in values.items() if p not in gave_up},
            {**{p: e for p, e in errors.items() if p not in gave_up}, **gave_up})


def for_each(pids, op, *args, timeout_s, what):
    """Run op(pid, *args) for every pid at once, one thread each; {pid: None | Exception}
    (a call that does not return in time, or whose pid is stopped: see _run_all)."""
    _, errors = _run_all(pids, op, args, timeout_s, what)
    return {pid: errors.get(pid) for pid in pids}


#: How much longer than its own timeoutMs a lock call may take to come back.
LOCK_GRACE_S = 5.0


def lock_all(pids, timeout_ms):
    return for_each(pids, _lock, timeout_ms, timeout_s=timeout_ms / 1000 + LOCK_GRACE_S, what="lock")


def checkpoint_all(pids, timeout_s=waits.DRIVER_MOVE_S):
    return for_each(pids, _checkpoint, timeout_s=timeout_s, what="checkpoint")


def restore_all(pids, gpu_pairs=None, timeout_s=waits.DRIVER_MOVE_S):
    return for_each(pids, _restore, gpu_pairs, timeout_s=timeout_s, what="restore")


def unlock_all(pids, timeout_s=waits.UNDO_WAIT_S):
    return for_each(pids, _unlock, timeout_s=timeout_s, what="unlock")


def raise_first(results):
    """Raise the first failure of a for_each result (the rest are in its message); a pid that did
    not answer keeps its error's kind (NoAnswer's exit code)."""
    failed = {pid: e for pid, e in results.items() if e is not None}
    if failed:
        detail = "; ".join(str(e) for e in failed.values())
        kind = DriverNoAnswer if any(isinstance(e, (DriverNoAnswer, ProcessNoAnswer))
                                     for e in failed.values()) else DriverError
        raise kind(detail) from next(iter(failed.values()))


def default_state_dir():
    """The tool's private state directory, by the engine's rule (config.state_dir_path)."""
    return state_dir_path()


def open_private_dir(path):
    """Open (making it, mode 0700, when missing) a directory only we may use; its fd.

    Refuses a symlink, a non-directory, one owned by another uid, or any mode but 0700: whoever
    can write there could plant the lock file (a symlink, a FIFO) or hold it to block us.
    """
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as e:
        raise Error(f"{path}: cannot create the state directory: {e.strerror}") from e
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        what = "is a symlink" if os.path.islink(path) else (e.strerror or str(e))
        raise Error(f"{path}: {what}; the state directory must be a real directory owned by uid "
                    f"{os.geteuid()} with mode 0700 (remove it, or set CRIU_GPUSHARE_RUN_DIR)") from e
    st = os.fstat(fd)
    if st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) != 0o700:
        os.close(fd)
        raise Error(f"{path}: owned by uid {st.st_uid} with mode {stat.S_IMODE(st.st_mode):04o}; "
                    f"the state directory must be owned by uid {os.geteuid()} with mode 0700 "
                    f"(someone else could plant or hold the driver lock): remove or fix it")
    return fd


def _my_command():
    name = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"
    words = [name] + [a for a in sys.argv[1:3] if not a.startswith("-")]
    return " ".join(words)[:120].replace("\n", " ")


def _stderr(message):
    print(f"criu-gpushare: {message}", file=sys.stderr, flush=True)


class DriverLock:
    """Node-wide lock around driver checkpoint calls: an flock on `driver.lock` in the tool's
    private state directory (mode 0700, ours), released when we exit.

    Two criu-gpushare processes on one node must never make checkpoint calls at the same time.
    The holder writes "<pid> <command>" into the file once it has the lock; a waiter says once
    who it waits for (`on_wait(message)`, default: a line on stderr), and its timeout (BusyError)
    names the holder.

    DriverLock()                    the default place (default_state_dir()/driver.lock)
    DriverLock(state_dir=DIR)       DIR/driver.lock
    DriverLock(PATH)                an explicit file; its directory is held to the same rules
    """

    def __init__(self, path=None, timeout_s=600, *, state_dir=None, on_wait=None):
        if path is None:
            path = os.path.join(state_dir or default_state_dir(), DRIVER_LOCK_NAME)
        self.path, self.timeout_s, self.fd = path, timeout_s, None
        self.on_wait = _stderr if on_wait is None else on_wait

    def holder(self):
        """(pid, command) written by the holder, or None when unknown (file empty)."""
        try:
            text = os.pread(self.fd, 512, 0).decode(errors="replace").strip()
        except OSError:
            return None
        pid, _, cmd = text.partition(" ")
        return (int(pid), cmd.strip() or "?") if pid.isdigit() else None

    def _holder_text(self):
        h = self.holder()
        return f"pid {h[0]} ({h[1]})" if h else "an unknown process (it has just taken it)"

    def _open(self):
        directory, name = os.path.split(os.path.abspath(self.path))
        dfd = open_private_dir(directory)
        try:
            fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
                         | os.O_NONBLOCK, 0o600, dir_fd=dfd)
        except OSError as e:
            why = "is a symlink" if e.errno == errno.ELOOP else (e.strerror or str(e))
            raise Error(f"{self.path}: {why}; refusing it as the driver lock") from e
        finally:
            os.close(dfd)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            os.close(fd)
            raise Error(f"{self.path}: not a regular file of uid {os.geteuid()}; refusing it as "
                        f"the driver lock (remove it)")
        return fd

    def __enter__(self):
        self.fd = self._open()
        deadline = waits.Deadline(self.timeout_s)
        first_busy, told = None, False
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as e:
                if e.errno not in (errno.EAGAIN, errno.EACCES):
                    os.close(self.fd)
                    self.fd = None
                    raise
            now = time.monotonic()
            first_busy = now if first_busy is None else first_busy
            # Say once who holds it; give a holder that just took it a moment to write its name.
            if not told and (self.holder() is not None or now - first_busy > 1.0):
                told = True
                self.on_wait(f"waiting for the driver lock held by {self._holder_text()} "
                             f"({self.path}; at most {self.timeout_s:g}s)")
            if deadline.passed():
                who = self._holder_text()
                os.close(self.fd)
                self.fd = None
                raise BusyError(f"the driver lock {self.path} is held by {who}, another "
                                f"criu-gpushare making driver checkpoint calls; waited "
                                f"{self.timeout_s:g}s")
            time.sleep(0.05)
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, f"{os.getpid()} {_my_command()}\n".encode(), 0)
        return self

    def __exit__(self, *exc):
        try:
            os.ftruncate(self.fd, 0)  # nobody holds it now
        except OSError:
            pass
        os.close(self.fd)  # closing drops the flock
        self.fd = None
