"""A `chunks/` tree: content-addressed files under two-hex-digit fan-out directories.

Both the store and the node cache hold one. This module owns how a chunk file is written (temp name,
data, fdatasync, rename: a name never points at torn data), read (O_DIRECT when aligned, with a
buffered fallback), touched and listed. It never follows a symlink: every open is relative to a
directory fd with O_NOFOLLOW.
"""
import errno
import os
import stat
import threading
from dataclasses import dataclass

from ..errors import StoreError
from . import fsutil
from .layout import CHUNKS_DIR, chunk_id, fanout, is_chunk_id, is_temp_name


class ChunkMissing(StoreError):
    """chunk store: {}"""

    def __init__(self, message, chunk=None, path=None):
        super().__init__(message)
        self.chunk, self.path = chunk, path


class ChunkDamaged(StoreError):
    """chunk store: {}"""

    def __init__(self, message, kind, chunk=None, path=None):
        super().__init__(message)
        self.kind = kind  # "truncated", "corrupt", "bad-file" or "unreadable"
        self.chunk, self.path = chunk, path  # the chunk id and its file


def check_bytes(cid, view, path):
    """Raise ChunkDamaged (kind "corrupt", naming `path`) unless `view` hashes to `cid`."""
    got = chunk_id(view)
    if got != cid:
        raise ChunkDamaged(f"{path}: chunk {cid} is corrupted: its content hashes to {got}",
                           "corrupt", cid, path)


_FANOUT_NAMES = frozenset(f"{i:02x}" for i in range(256))


def open_root(path, create, what, build):
    """Opens the directory `path` that holds a chunks/ directory (with create, makes it and its
    parents first) and returns build(fd); refuses the directory or its chunks/ when not trusted
    (fsutil.check_trusted), closing the fd when anything fails. `what` names it in errors."""
    if create:
        try:
            os.makedirs(path, mode=0o755, exist_ok=True)
        except OSError as e:
            raise StoreError(f"{path}: cannot create the {what}: {fsutil.describe(e)}") from e
    fd = fsutil.open_dir(path)
    try:
        fsutil.check_trusted(fd, path)
        opened = build(fd)
        fsutil.check_trusted(opened.chunks.fd, opened.chunks.path)
        return opened
    except BaseException:
        os.close(fd)
        raise


@dataclass(frozen=True)
class ChunkFile:
    """One entry found in a chunks/ tree."""
    name: str          # a chunk id, or a temp name
    fanout: str
    size: int
    mtime_ns: int
    is_temp: bool
    is_regular: bool


class ChunkDir:
    """The chunks/ directory under `root_fd` (the store or cache root, already checked)."""

    def __init__(self, root_fd, root_path, create):
        self.path = os.path.join(root_path, CHUNKS_DIR)
        self.fd = fsutil.open_dir(self.path, CHUNKS_DIR, dir_fd=root_fd, create=create)
        self._fanout_fds = {}
        self._lock = threading.Lock()
        # Set once a file system refused O_DIRECT, so later chunks do not retry it.
        self.direct_refused = False

    def close(self):
        with self._lock:
            for fd in self._fanout_fds.values():
                os.close(fd)
            self._fanout_fds.clear()
            if self.fd >= 0:
                os.close(self.fd)
                self.fd = -1

    def chunk_path(self, cid):
        return os.path.join(self.path, fanout(cid), cid)

    def fanout_fd(self, name, create=False):
        """The fd of fan-out directory `name`, or None when it does not exist and create is False."""
        return fsutil.open_dir_once(self._fanout_fds, self._lock, self.fd, self.path, name, create)

    # -- single chunks --------------------------------------------------------------------------

    def stat(self, cid):
        """lstat of a chunk file, or None when absent. A non-file under a chunk name is an error."""
        dfd = self.fanout_fd(fanout(cid))
        if dfd is None:
            return None
        try:
            st = os.stat(cid, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        if not stat.S_ISREG(st.st_mode):
            kind = "a symlink" if stat.S_ISLNK(st.st_mode) else "not a regular file"
            raise StoreError(f"{self.chunk_path(cid)}: is {kind} (planted? the store never "
                             f"follows symlinks; remove it)")
        return st

    def touch(self, cid):
        """Set a chunk's mtime to now (the file system's clock). False when it vanished meanwhile."""
        dfd = self.fanout_fd(fanout(cid))
        if dfd is None:
            return False
        try:
            os.utime(cid, dir_fd=dfd, follow_symlinks=False)
            return True
        except FileNotFoundError:
            return False
        except OSError as e:
            raise StoreError(f"{self.chunk_path(cid)}: cannot update its time: "
                             f"{fsutil.describe(e)}") from e

    def write(self, cid, view, free_space_path, replace=False):
        """Write `view` as chunk `cid`: temp file, data, fdatasync, then publish under its name.

        Publishing links the temp file to the name, so a chunk another writer published meanwhile
        is kept (returns False: not written by us); with replace=True (a damaged file is there) it
        renames over it. On any failure the temp file is removed; a full disk becomes a
        StoreError that names the store and the bytes needed.
        """
        name = fanout(cid)
        dfd = self.fanout_fd(name, create=True)
        dir_path = os.path.join(self.path, name)
        use_direct = not self.direct_refused and fsutil.direct_ok(view)
        try:
            fd, tmp = fsutil.create_temp(dfd, dir_path, cid, fsutil.O_DIRECT if use_direct else 0)
        except OSError as e:
            if not (use_direct and e.errno == errno.EINVAL):
                raise self._write_error(e, cid, len(view), free_space_path) from e
            self.direct_refused = True  # some file systems refuse O_DIRECT at open
            try:
                fd, tmp = fsutil.create_temp(dfd, dir_path, cid)
            except OSError as e2:
                raise self._write_error(e2, cid, len(view), free_space_path) from e2
        try:
            try:
                if fsutil.write_all(fd, view):
                    self.direct_refused = True
                os.fdatasync(fd)
            finally:
                os.close(fd)
            published = self._publish(tmp, cid, dfd, replace)
        except OSError as e:
            fsutil.unlink_quiet(tmp, dfd)
            raise self._write_error(e, cid, len(view), free_space_path) from e
        except BaseException:
            fsutil.unlink_quiet(tmp, dfd)  # killed by an exception: never leave a temp behind
            raise
        return published

    def _write_error(self, e, cid, length, free_space_path):
        """The StoreError for a failed chunk write; a full disk names the store and the bytes."""
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            return StoreError(f"{free_space_path}: file system full writing chunk {cid}: needed "
                              f"{length} bytes, {_free_bytes(free_space_path)} bytes free "
                              f"({e.strerror})")
        return StoreError(f"{self.chunk_path(cid)}: write failed: {fsutil.describe(e)}")

    @staticmethod
    def _publish(tmp, cid, dfd, replace):
        """Give the synced temp file its final name; False when another writer got there first."""
        if not replace:
            try:
                os.link(tmp, cid, src_dir_fd=dfd, dst_dir_fd=dfd, follow_symlinks=False)
            except FileExistsError:
                fsutil.unlink_quiet(tmp, dfd)
                return False
            except OSError as e:
                if e.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK):
                    raise
                # A file system without hard links: rename (replacing equal bytes is harmless).
            else:
                fsutil.unlink_quiet(tmp, dfd)
                return True
        os.rename(tmp, cid, src_dir_fd=dfd, dst_dir_fd=dfd)
        return True

    def read(self, cid, view):
        """Read chunk `cid` into `view`, which must be exactly the chunk's length.

        FileNotFoundError when the chunk is absent; StoreError when it is not exactly len(view) bytes.
        """
        use_direct = not self.direct_refused and fsutil.direct_ok(view)
        fd, path = self.open_chunk(cid, len(view), direct=use_direct)
        try:
            try:
                n = fsutil.read_into(fd, view)
            except OSError as e:
                raise StoreError(f"{path}: read failed: {fsutil.describe(e)}") from e
            if n != len(view):
                raise ChunkDamaged(f"{path}: read {n} of {len(view)} bytes (truncated chunk)",
                                   "truncated", cid, path)
        finally:
            os.close(fd)

    def open_chunk(self, cid, length, direct=False):
        """(an fd open for reading, the path) of chunk `cid`'s file, checked to be a regular file of
        `length` bytes (ChunkDamaged otherwise); FileNotFoundError when it is absent. direct: with
        O_DIRECT, where the file system takes it (refused once, never asked again)."""
        dfd = self.fanout_fd(fanout(cid))
        if dfd is None:
            raise FileNotFoundError(errno.ENOENT, "no such chunk", self.chunk_path(cid))
        path = self.chunk_path(cid)
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            try:
                fd = os.open(cid, flags | (fsutil.O_DIRECT if direct else 0), dir_fd=dfd)
            except OSError as e:
                if not (direct and e.errno == errno.EINVAL):
                    raise
                self.direct_refused = True
                fd = os.open(cid, flags, dir_fd=dfd)
        except FileNotFoundError:
            raise
        except OSError as e:
            kind = "bad-file" if e.errno == errno.ELOOP else "unreadable"
            raise ChunkDamaged(f"{path}: {fsutil.describe(e)}", kind, cid, path) from e
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise ChunkDamaged(f"{path}: not a regular file", "bad-file", cid, path)
            if st.st_size != length:
                raise ChunkDamaged(f"{path}: {st.st_size} bytes, expected {length} "
                                   f"(truncated or damaged chunk)", "truncated", cid, path)
        except BaseException:
            os.close(fd)
            raise
        return fd, path

    def check(self, cid, view):
        """Raise ChunkDamaged (kind "corrupt") unless `view` hashes to `cid`."""
        check_bytes(cid, view, self.chunk_path(cid))

    def remove(self, name, fanout_name):
        dfd = self.fanout_fd(fanout_name)
        if dfd is not None:
            fsutil.unlink_quiet(name, dfd)

    # -- listing ----------------------------------------------------------------------------------

    def fanouts(self):
        """Names of the fan-out directories present (other names are ignored)."""
        return sorted(n for n in fsutil.list_dir(self.fd) if n in _FANOUT_NAMES)

    def scan(self):
        """Every chunk file and temp file in the tree, with lstat facts. Other names are skipped."""
        for name in self.fanouts():
            dfd = self.fanout_fd(name)
            if dfd is None:
                continue
            for entry in os.scandir(dfd):
                temp = is_temp_name(entry.name)
                if not temp and not (is_chunk_id(entry.name) and fanout(entry.name) == name):
                    continue
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                yield ChunkFile(entry.name, name, st.st_size, st.st_mtime_ns, temp,
                                stat.S_ISREG(st.st_mode))


def _free_bytes(path):
    try:
        st = os.statvfs(path)
        return st.f_bavail * st.f_frsize
    except OSError:
        return "unknown"
