"""The tool's private state directory, and the only ways files in it are read and written.

Where it is: config.state_dir_path ($CRIU_GPUSHARE_RUN_DIR if set, else /run/criu-gpushare as root,
else $XDG_RUNTIME_DIR/criu-gpushare, or /tmp/criu-gpushare-<uid>). It must be a real directory (not
a link) owned by us with mode 0700, so nobody else can plant files, links or sockets in it; every
file in it is opened without following links and must be a regular file. What lives there is listed in engine/journal.py and
engine/holder.py.
"""
import json
import os
import stat
import time

from ..config import state_dir_path
from ..errors import Error, StateFileError
from ..procfs import state_and_start


def state_dir():
    path = state_dir_path()
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) != 0o700:
        raise Error(f"{path} must be a directory owned by uid {os.geteuid()} with mode 0700, not a "
                    "link (someone else could plant files in it); remove or fix it")
    return path


def path_of(name):
    return os.path.join(state_dir(), name)


def read_json(name):
    """The object in state file `name`, or None when there is none. A link, a non-regular file,
    a file owned by another uid (only root could have put it there: not ours to trust), or one that
    is not JSON is refused with StateFileError, naming it."""
    path = path_of(name)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise bad_file(name, f"cannot be opened ({e.strerror}); a state file must be a regular "
                             "file, not a link") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise bad_file(name, "is not a regular file")
        if st.st_uid != os.geteuid():
            raise bad_file(name, f"is owned by uid {st.st_uid}, not {os.geteuid()}: criu-gpushare "
                                 "did not write it")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read()
    finally:
        os.close(fd)
    try:
        return json.loads(data)
    except ValueError:
        raise bad_file(name, "is not valid JSON (truncated or overwritten)") from None


def bad_file(name, what):
    """The error for a state file that cannot be trusted: names it and what to do."""
    return StateFileError(f"state file {path_of(name)} {what}; criu-gpushare cannot tell what it "
                          "held: check that the processes it names run normally (`criu-gpushare "
                          "status PID`), then remove it")


def write_json(name, obj):
    """Write state file `name` atomically and durably (temp file, fsync, rename, fsync dir)."""
    path = path_of(name)
    tmp = f"{path}.tmp-{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, json.dumps(obj, indent=1, sort_keys=True).encode() + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, path)
    _sync_dir()


def create_exclusive(name, obj):
    """Create state file `name` holding obj; False if it exists (another claim won the race)."""
    path = path_of(name)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        return False
    try:
        os.write(fd, json.dumps(obj).encode() + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)
    _sync_dir()
    return True


def remove(name):
    try:
        os.unlink(path_of(name))
    except FileNotFoundError:
        pass


LOG_KEEP_S = 7 * 24 * 3600


def prune_logs(keep_s=LOG_KEEP_S, now=None):
    """Remove the logs (*.log) of holders and dump watches that ended keep_s ago or more: written
    to last that long ago, with no socket beside them (a holder that still serves, a suspend's for
    one, may write nothing for weeks). The directory is in /run, in memory, and a node that
    checkpoints often would otherwise keep every log until it reboots. Best effort; run by
    open_log, as each holder or dump watch starts."""
    directory = state_dir()
    now = time.time() if now is None else now
    for name in os.listdir(directory):
        if not name.endswith(".log") or os.path.exists(os.path.join(directory, name[:-4] + ".sock")):
            continue
        path = os.path.join(directory, name)
        try:
            st = os.lstat(path)
            if stat.S_ISREG(st.st_mode) and now - st.st_mtime >= keep_s:
                os.unlink(path)
        except OSError:
            pass  # gone meanwhile, or not ours to remove


def open_log(path):
    """An fd appending to the log at `path` (in this directory; created 0600, never through a
    link), once the logs of what ended long ago are removed (prune_logs)."""
    prune_logs()
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)


def names(prefix):
    return sorted(n for n in os.listdir(state_dir()) if n.startswith(prefix) and ".tmp-" not in n)


def _sync_dir():
    fd = os.open(state_dir(), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def start_time(pid):
    """The process's start time (clock ticks since boot, /proc/PID/stat field 22), or None when it
    is gone: a pid and its start time name one process, even after the pid is reused."""
    stat = state_and_start(pid)
    if stat is None or stat[0] in ("Z", "X"):
        return None  # a zombie has no GPU state and will never answer
    return stat[1]


def same_process(pid, started):
    return started is not None and start_time(pid) == started
