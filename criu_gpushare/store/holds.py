"""Holds: a live suspension or dump keeps its checkpoint (ref) from being removed.

A hold is one small file per holder, holds/<ref>/<host>.<pid>.<starttime>.<r>.hold, written
durably, whose JSON names the holder: host, boot id, pid namespace, pid, the process's start time
(/proc/PID/stat field 22) and what it is ("suspension" or "dump"). `store rm` refuses a ref with
a live hold unless forced; gc removes stale holds (their holder is gone) and keeps the manifest a
live hold recorded as a root, like a ref (store/FORMAT.md, "Holds").

A hold is *live* unless this node can tell its holder is gone: same host and boot, same pid
namespace, and the pid is absent, a zombie, or another process (a different start time). A hold
from another host or pid namespace, or one that cannot be read, counts as live.
"""
import fcntl
import json
import os
import re
import socket
import stat
import time
from dataclasses import asdict, dataclass, field

from ..errors import StoreError
from ..procfs import state_and_start
from . import fsutil
from .layout import HOLD_SUFFIX, HOLDS_DIR, is_chunk_id, is_ref_name, is_temp_name

HOLD_FORMAT = "criu-gpushare-hold"
HOLD_VERSION = 1
KINDS = ("suspension", "dump")
#: A hold temp file older than this was left by a holder that died while writing it.
HOLD_TEMP_MAX_AGE_NS = 600 * 10**9


class RefHeld(StoreError):
    """chunk store: {}"""

    def __init__(self, message, holders):
        super().__init__(message)
        self.holders = holders  # the live HoldInfo objects


@dataclass
class HoldInfo:
    """One holder of a ref, as read back from its hold file."""
    ref: str
    name: str                 # the hold file's name in holds/<ref>/
    path: str
    kind: str                 # "suspension", "dump", or "?" when unreadable
    host: str
    pid: object               # int, or None when unreadable
    starttime: object         # int (clock ticks since boot), or None
    created: str
    alive: bool
    why: str                  # how `alive` was decided, for messages
    manifest: object = None   # the manifest id the ref named when the hold was taken
    meta: dict = field(default_factory=dict)

    def describe(self):
        who = f"pid {self.pid} on {self.host}" if self.pid is not None else self.path
        return f"{self.kind} by {who} since {self.created or '?'} ({self.why})"

    def as_dict(self):
        return asdict(self)


class Hold:
    """A hold this process took; release() removes it (idempotent). Also a context manager.
    This one is in a directory store; an S3 store's (S3Hold) removes its object instead."""

    def __init__(self, store, info):
        self.store, self.info = store, info
        self.ref, self.name, self.path = info.ref, info.name, info.path
        self.released = False

    def release(self):
        if not self.released:
            self._remove()
            self.released = True

    def _remove(self):
        dfd = _ref_dir(self.store, self.ref, create=False)
        if dfd is not None:
            try:
                fsutil.unlink_quiet(self.name, dfd)
                fsutil.fsync_dir(dfd, os.path.dirname(self.path))
            finally:
                os.close(dfd)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()

    def __repr__(self):
        return f"{type(self).__name__}({self.path!r})"


# -- who we are, and whether a process is the one a hold names ------------------------------------

def _read_text(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def boot_id():
    return _read_text("/proc/sys/kernel/random/boot_id") or ""


def pid_namespace():
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def _host_name():
    return socket.gethostname()


def _safe(text, limit=64):
    return (re.sub(r"[^A-Za-z0-9-]", "_", text)[:limit]) or "host"


# -- the holds/<ref>/ directory -------------------------------------------------------------------

def _holds_path(store, ref=None):
    base = os.path.join(store.path, HOLDS_DIR)
    return base if ref is None else os.path.join(base, ref)


def _check_ref(store, ref):
    if not is_ref_name(ref):
        raise StoreError(f"{_holds_path(store, str(ref))}: bad checkpoint name {ref!r}")


def _ref_dir(store, ref, create):
    """An fd of holds/<ref>/ (made, durably, when create), or None when absent."""
    holds_fd = store.dir_fd(HOLDS_DIR, create=create)
    if holds_fd is None:
        return None
    path = _holds_path(store, ref)
    made = False
    if create:
        try:
            os.mkdir(ref, 0o755, dir_fd=holds_fd)
            made = True
        except FileExistsError:
            pass
        except OSError as e:
            raise StoreError(f"{path}: cannot create directory: {fsutil.describe(e)}") from e
    fd = fsutil.open_dir(path, ref, dir_fd=holds_fd, missing_ok=True)
    if fd is None:
        return None
    fsutil.check_trusted(fd, path, close_on_error=True)
    if made:
        fsutil.fsync_dir(holds_fd, _holds_path(store))
        fsutil.fsync_dir(store.root_fd, store.path)
    return fd


class _Locked:
    """holds/<ref>/ opened and flocked exclusively: hold, rm and gc of one ref serialize on it.
    A directory gc removed between our open and our lock is noticed (no links) and made again."""

    def __init__(self, store, ref, create):
        self.store, self.ref, self.create, self.fd = store, ref, create, None

    def __enter__(self):
        for _ in range(100):
            fd = _ref_dir(self.store, self.ref, self.create)
            if fd is None:
                return None
            fcntl.flock(fd, fcntl.LOCK_EX)
            if os.fstat(fd).st_nlink > 0:
                self.fd = fd
                return fd
            os.close(fd)  # removed by gc meanwhile
        raise StoreError(f"{_holds_path(self.store, self.ref)}: keeps disappearing")

    def __exit__(self, *exc):
        if self.fd is not None:
            os.close(self.fd)  # drops the flock


def _hold_names(dfd):
    return sorted(n for n in fsutil.list_dir(dfd)
                  if n.endswith(HOLD_SUFFIX) and not n.startswith("."))


def _read_hold(store, ref, dfd, name, here):
    path = os.path.join(_holds_path(store, ref), name)
    try:
        data = fsutil.read_small_file(dfd, os.path.dirname(path), name, limit=1 << 20)
    except FileNotFoundError:
        return None  # released meanwhile
    except StoreError as e:
        return _unreadable(ref, name, path, e.args[0])
    return parse_hold(data, ref, name, path, here)


def _unreadable(ref, name, path, why):
    return HoldInfo(ref, name, path, "?", "?", None, None, "", True,
                    f"unreadable, counted as live: {why}")


def parse_hold(data, ref, name, path, here):
    """The HoldInfo of a hold file's bytes, judged from `here` (see this_host); an unreadable one
    counts as live."""
    try:
        doc = json.loads(data)
        if not isinstance(doc, dict) or doc.get("format") != HOLD_FORMAT:
            raise ValueError("not a hold file")
        if not isinstance(doc.get("version"), int) or doc["version"] > HOLD_VERSION:
            raise ValueError(f"hold format version {doc.get('version')!r} is newer than "
                             f"{HOLD_VERSION}")
        pid, start = int(doc["pid"]), int(doc["starttime"])
        host = str(doc["host"])
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
        return _unreadable(ref, name, path, str(e))
    alive, why = _judge(doc, host, pid, start, here)
    manifest = doc.get("manifest") if is_chunk_id(doc.get("manifest")) else None
    meta = doc.get("meta") if isinstance(doc.get("meta"), dict) else {}
    return HoldInfo(ref, name, path, str(doc.get("kind", "?")), host, pid, start,
                    str(doc.get("created", "")), alive, why, manifest, meta)


def _judge(doc, host, pid, start, here):
    my_host, my_boot, my_ns = here
    if host != my_host:
        return True, "on another host: cannot tell, counted as live"
    if doc.get("boot_id") and my_boot and doc["boot_id"] != my_boot:
        return False, "stale: the host rebooted since"
    if doc.get("pid_ns") != my_ns:
        return True, "in another pid namespace: cannot tell, counted as live"
    st = state_and_start(pid)
    if st is None:
        return False, f"stale: pid {pid} is gone"
    state, now_start = st
    if now_start != start:
        return False, f"stale: pid {pid} is another process now"
    if state in ("Z", "X"):
        return False, f"stale: pid {pid} has exited"
    return True, "running"


def this_host():
    """(host, boot id, pid namespace) of this process: what judging a hold compares with."""
    return _host_name(), boot_id(), pid_namespace()


# -- the API ----------------------------------------------------------------------------------------

def take(store, ref, kind, pid=None, meta=None):
    """Write a hold on `ref` for process `pid` (default: this one); returns a Hold.

    The ref need not exist yet: a writer MAY take the hold before it commits the ref, so that no
    `store rm` can come in between. When it exists, the hold also records its manifest id.
    """
    _check_ref(store, ref)
    info, data = new_hold(store, ref, kind, pid, _holds_path(store, ref), meta)
    with _Locked(store, ref, create=True) as dfd:
        fsutil.write_file_atomic(dfd, os.path.dirname(info.path), info.name, data)
    return Hold(store, info)


def new_hold(store, ref, kind, pid, dir_path, meta=None):
    """(HoldInfo, file bytes) of a new hold on `ref` for `pid` (default: this process), to be
    written as dir_path/<info.name> (for any store: `store.read_ref` gives the manifest)."""
    if kind not in KINDS:
        raise ValueError(f"hold kind {kind!r}: one of {', '.join(KINDS)}")
    pid = os.getpid() if pid is None else int(pid)
    st = state_and_start(pid)
    if st is None:
        raise StoreError(f"{dir_path}: cannot hold for pid {pid}: no such process")
    host = _host_name()
    try:
        manifest = store.read_ref(ref).manifest
    except StoreError:
        manifest = None  # no ref yet, or a damaged one: the hold protects the name anyway
    doc = {"format": HOLD_FORMAT, "version": HOLD_VERSION, "ref": ref, "kind": kind,
           "host": host, "boot_id": boot_id(), "pid_ns": pid_namespace(), "pid": pid,
           "starttime": st[1], "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "manifest": manifest, "meta": meta or {}}
    name = f"{_safe(host)}.{pid}.{st[1]}.{os.urandom(8).hex()}{HOLD_SUFFIX}"
    info = HoldInfo(ref, name, f"{dir_path}/{name}", kind, host, pid, st[1],
                    doc["created"], True, "running", manifest, doc["meta"])
    return info, json.dumps(doc, indent=1, sort_keys=True).encode() + b"\n"


def list_holds(store, ref):
    """Every holder of `ref` (a HoldInfo each, with `alive`); [] when none."""
    _check_ref(store, ref)
    dfd = _ref_dir(store, ref, create=False)
    if dfd is None:
        return []
    try:
        return _scan(store, ref, dfd, this_host())
    finally:
        os.close(dfd)


def _scan(store, ref, dfd, here):
    out = []
    for name in _hold_names(dfd):
        info = _read_hold(store, ref, dfd, name, here)
        if info is not None:
            out.append(info)
    return out


def held_refs(store):
    """Names of the refs that have a hold directory with at least one hold file (cheap: no
    hold is read, so stale holds count too)."""
    holds_fd = store.dir_fd(HOLDS_DIR)
    if holds_fd is None:
        return set()
    out = set()
    for ref in fsutil.list_dir(holds_fd):
        if not is_ref_name(ref):
            continue
        dfd = fsutil.open_dir(_holds_path(store, ref), ref, dir_fd=holds_fd, missing_ok=True)
        if dfd is None:
            continue
        try:
            if _hold_names(dfd):
                out.add(ref)
        except StoreError:
            pass
        finally:
            os.close(dfd)
    return out


def remove_ref(store, ref, force=False):
    """Delete ref `ref` unless a live hold protects it (RefHeld names each holder).

    With force, the ref and all its hold files go, and the live holds overridden are returned
    (the caller warns about them). Stale hold files of the ref are removed either way.
    """
    from . import catalog
    _check_ref(store, ref)
    with _Locked(store, ref, create=False) as dfd:
        holds = [] if dfd is None else _scan(store, ref, dfd, this_host())
        live = [h for h in holds if h.alive]
        if live and not force:
            raise RefHeld(f"{catalog.ref_path(store, ref)}: checkpoint {ref} is held, not "
                          f"removed: " + "; ".join(h.describe() for h in live)
                          + " (end them first, or pass --force)", live)
        catalog.remove_ref(store, ref)
        if dfd is not None:
            for h in holds:
                if force or not h.alive:
                    fsutil.unlink_quiet(h.name, dfd)
            fsutil.fsync_dir(dfd, _holds_path(store, ref))
    return live


@dataclass
class HoldSweep:
    live: list = field(default_factory=list)      # HoldInfo of every live hold
    stale_removed: int = 0


def sweep(store, now_ns, dry_run=False):
    """For gc: classify every hold, remove stale ones (and old temp files), and remove hold
    directories left empty. Returns a HoldSweep."""
    out = HoldSweep()
    holds_fd = store.dir_fd(HOLDS_DIR)
    if holds_fd is None:
        return out
    here = this_host()
    for ref in fsutil.list_dir(holds_fd):
        if not is_ref_name(ref):
            continue
        with _Locked(store, ref, create=False) as dfd:
            if dfd is None:
                continue
            for info in _scan(store, ref, dfd, here):
                if info.alive:
                    out.live.append(info)
                else:
                    out.stale_removed += 1
                    if not dry_run:
                        fsutil.unlink_quiet(info.name, dfd)
            left = False
            for name in fsutil.list_dir(dfd):
                if is_temp_name(name) and not dry_run:
                    try:
                        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                    except FileNotFoundError:
                        continue
                    if stat.S_ISREG(st.st_mode) and st.st_mtime_ns < now_ns - HOLD_TEMP_MAX_AGE_NS:
                        fsutil.unlink_quiet(name, dfd)
                        continue
                left = True
            if not left and not dry_run:
                try:
                    os.rmdir(ref, dir_fd=holds_fd)  # under its lock: a hold() retries
                except OSError:
                    pass
    return out
