"""Careful file-system primitives for the store: no symlink is ever followed below the store root,
every path is opened relative to a directory fd, and writes are durable before they get a name.

Each OSError is turned into a StoreError that names the path, so a user sees which file is at fault.
"""
import ctypes
import ctypes.util
import errno
import fcntl
import os
import stat

from ..errors import StoreError
from .layout import temp_name

#: O_DIRECT needs the buffer address, the length and the file offset aligned to the logical block
#: size; 4096 covers every common device.
DIRECT_ALIGN = 4096
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
O_DIRECT = getattr(os, "O_DIRECT", 0)

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def describe(e):
    """A short reason for an OSError, with the symlink case spelled out."""
    if e.errno == errno.ELOOP:
        return "is a symlink (the store never follows symlinks)"
    return e.strerror or str(e)


def open_dir(path, name=None, dir_fd=None, create=False, mode=0o755, missing_ok=False):
    """Open directory `name` under `dir_fd` (or `path` itself) without following a symlink.

    `path` is the full path, for messages. With create=True a missing directory is made first;
    with missing_ok=True a missing one gives None.
    """
    target = name if name is not None else path
    for attempt in (0, 1):
        try:
            return os.open(target, _DIR_FLAGS, dir_fd=dir_fd)
        except FileNotFoundError:
            if missing_ok and not create:
                return None
            if not create or attempt:
                raise StoreError(f"{path}: no such directory")
            try:
                os.mkdir(target, mode, dir_fd=dir_fd)
            except FileExistsError:
                pass  # another writer made it first
            except OSError as e:
                raise StoreError(f"{path}: cannot create directory: {describe(e)}") from e
        except NotADirectoryError:
            # O_NOFOLLOW on a symlink to a directory gives ENOTDIR with O_DIRECTORY on Linux.
            if os.path.islink(path):
                raise StoreError(f"{path}: is a symlink (the store never follows symlinks)")
            raise StoreError(f"{path}: not a directory")
        except OSError as e:
            raise StoreError(f"{path}: {describe(e)}") from e


def open_dir_once(fds, lock, parent_fd, parent_path, name, create):
    """The fd of directory `name` under parent_fd, opened and checked trusted once, then kept in
    the dict `fds` (guarded by `lock`); None when it does not exist and create is False."""
    fd = fds.get(name)
    if fd is not None:
        return fd
    path = os.path.join(parent_path, name)
    fd = open_dir(path, name, dir_fd=parent_fd, create=create, missing_ok=True)
    if fd is None:
        return None
    check_trusted(fd, path, close_on_error=True)
    with lock:
        if name in fds:  # another thread opened it meanwhile
            os.close(fd)
            return fds[name]
        fds[name] = fd
    return fd


def check_trusted(fd, path, close_on_error=False):
    """Refuse a directory that someone other than us (or root) could write into.

    The chunk hash is not cryptographic and a restore trusts chunk names: whoever can write to the
    store can make a restore load bytes of their choosing.
    """
    try:
        _check_trusted(fd, path)
    except StoreError:
        if close_on_error:
            os.close(fd)
        raise


def _check_trusted(fd, path):
    st = os.fstat(fd)
    me = os.geteuid()
    if st.st_uid not in (0, me):
        raise StoreError(
            f"{path}: owned by uid {st.st_uid}, not by root or by us (uid {me}); refusing it "
            f"because whoever can write to a store decides what a restore loads")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise StoreError(
            f"{path}: writable by group or others (mode {stat.S_IMODE(st.st_mode):04o}); refusing "
            f"it because whoever can write to a store decides what a restore loads "
            f"(chmod go-w {path})")


def syncfs(fd, path):
    """Flush the whole file system holding `fd` (all chunk renames become durable at once)."""
    if _libc.syncfs(fd) != 0:
        e = ctypes.get_errno()
        raise StoreError(f"{path}: syncfs failed: {os.strerror(e)}")


def fsync_dir(fd, path):
    try:
        os.fsync(fd)
    except OSError as e:
        raise StoreError(f"{path}: fsync of the directory failed: {describe(e)}") from e


def buffer_address(view):
    """The address of a writable buffer, or None when it cannot be known (read-only buffers)."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(view))
    except (TypeError, ValueError):
        return None


def direct_ok(view):
    """Whether O_DIRECT may be used for this buffer: non-empty, address and length aligned."""
    n = view.nbytes
    if not O_DIRECT or n == 0 or n % DIRECT_ALIGN:
        return False
    addr = buffer_address(view)
    return addr is not None and addr % DIRECT_ALIGN == 0


def _clear_direct(fd):
    fl = fcntl.fcntl(fd, fcntl.F_GETFL)
    fcntl.fcntl(fd, fcntl.F_SETFL, fl & ~O_DIRECT)


def _whole_buffer(fd, view, step):
    """Calls step(rest, offset) over the buffer until it is done or a call returns 0; if the file
    system refuses O_DIRECT I/O (EINVAL), clears O_DIRECT once and goes on buffered. Returns the
    bytes done and whether O_DIRECT had to be dropped."""
    view = view.cast("B") if view.format != "B" or view.ndim != 1 else view
    done, dropped = 0, False
    while done < len(view):
        try:
            n = step(view[done:], done)
        except OSError as e:
            if e.errno == errno.EINVAL and O_DIRECT and not dropped:
                _clear_direct(fd)
                dropped = True
                continue
            raise
        if n == 0:
            break
        done += n
    return done, dropped


def write_all(fd, view):
    """Write the whole buffer; if the file system refuses O_DIRECT I/O (EINVAL), go on buffered.

    os.write releases the GIL. Returns True when O_DIRECT had to be dropped.
    """
    done, dropped = _whole_buffer(fd, view, lambda rest, _offset: os.write(fd, rest))
    if done < view.nbytes:
        raise OSError(errno.EIO, "write returned 0")
    return dropped


def read_into(fd, view):
    """Read into the whole buffer from offset 0; returns the bytes read (short at end of file)."""
    return _whole_buffer(fd, view, lambda rest, offset: os.preadv(fd, [rest], offset))[0]


def create_temp(dir_fd, dir_path, final_name, flags=0):
    """Create a fresh temp file for `final_name` (O_EXCL, random name); returns (fd, name).

    O_EXCL with O_CREAT never follows a symlink, so a planted link at the temp name fails instead
    of redirecting the write.
    """
    base = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    for _ in range(8):
        name = temp_name(final_name)
        try:
            return os.open(name, base | flags, 0o644, dir_fd=dir_fd), name
        except FileExistsError:
            continue
    raise StoreError(f"{dir_path}: cannot create a temporary file for {final_name} (8 names taken)")


def unlink_quiet(name, dir_fd):
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass


def write_file_atomic(dir_fd, dir_path, name, data):
    """Write a small file durably: temp, write, fsync, rename, fsync of the directory."""
    fd, tmp = create_temp(dir_fd, dir_path, name)
    try:
        try:
            write_all(fd, memoryview(data))
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except OSError as e:
        unlink_quiet(tmp, dir_fd)
        raise StoreError(f"{os.path.join(dir_path, name)}: write failed: {describe(e)}") from e
    except BaseException:
        unlink_quiet(tmp, dir_fd)
        raise
    fsync_dir(dir_fd, dir_path)


def read_small_file(dir_fd, dir_path, name, limit=64 << 20):
    """Read a small regular file without following a symlink; FileNotFoundError passes through."""
    path = os.path.join(dir_path, name)
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except FileNotFoundError:
        raise
    except OSError as e:
        raise StoreError(f"{path}: {describe(e)}") from e
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise StoreError(f"{path}: not a regular file")
        if st.st_size > limit:
            raise StoreError(f"{path}: {st.st_size} bytes, larger than the {limit}-byte limit")
        buf = bytearray(st.st_size)
        n = read_into(fd, memoryview(buf))
        return bytes(buf[:n])
    finally:
        os.close(fd)


def list_dir(dir_fd):
    """Names in a directory given by fd (os.listdir on a dup, so the fd stays usable)."""
    return os.listdir(dir_fd)
