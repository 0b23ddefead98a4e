"""Shared helpers of the driver probe programs in this directory.

The probes are small cuda-python programs that run unchanged against the fake driver (CI) and the
real one (the GPU machine). They talk to the test that started them only through files in one
directory (the "rendezvous" directory): a role announces a state by creating a file, the test asks
for an action by creating a file, and every wait has a deadline. Figures are printed as
`PROBE <name> <key>=<value> ...` lines so the test and the GPU summary can collect them.

Nothing here may use NVLink multicast; every program runs with the NVLS variables set by the test.
"""
import ctypes
import json
import os
import socket
import struct
import sys
import threading
import time

from cuda.bindings import driver as cu

MiB = 1 << 20
CHUNK = 64 * MiB  # fill/verify granularity: one pattern value per chunk, so a shifted copy shows
FD_HANDLE = cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
IPC_HANDLE_SIZE = 64  # CU_IPC_HANDLE_SIZE
DEFAULT_WAIT_S = 120.0
MAX_LIFE_S = 900.0  # a role never outlives this, even if its test died without saying stop


class ProbeFailure(Exception):
    """A driver call or a wait failed; the role reports it in its `error` file and exits 1."""


def check(result, what):
    """Unwrap a cuda-python result tuple, raising ProbeFailure with the call and error name."""
    err = result[0]
    if err != cu.CUresult.CUDA_SUCCESS:
        raise ProbeFailure(f"{what}: {err.name}")
    if len(result) == 1:
        return None
    return result[1] if len(result) == 2 else result[1:]


def result_name(result):
    """The CUresult name of a cuda-python result tuple (or of a bare CUresult)."""
    err = result[0] if isinstance(result, tuple) else result
    return err.name


_print_lock = threading.Lock()


def probe_line(name, **figures):
    """Print one parseable figure line: PROBE <name> key=value ... (values without spaces).

    One write under a lock: print() from several threads can interleave a line with another."""
    parts = [f"{k}={str(v).replace(' ', '_')}" for k, v in figures.items()]
    line = " ".join(["PROBE", name] + parts) + "\n"
    with _print_lock:
        sys.stdout.write(line)
        sys.stdout.flush()


# ---------------------------------------------------------------- rendezvous through files
class Rendezvous:
    """Files in one directory: `announce` creates one atomically, `wait` polls with a deadline."""

    def __init__(self, directory, role="probe"):
        self.dir = directory
        self.role = role
        self.born = time.monotonic()

    def path(self, name):
        return os.path.join(self.dir, name)

    def announce(self, name, payload=None):
        tmp = self.path(f".{name}.{os.getpid()}.tmp")
        with open(tmp, "w") as f:
            json.dump(payload if payload is not None else {}, f)
        os.rename(tmp, self.path(name))

    def poll(self, name):
        """The payload of `name` if it exists, else None."""
        try:
            with open(self.path(name)) as f:
                return json.load(f)
        except FileNotFoundError:
            return None

    def wait(self, name, timeout=DEFAULT_WAIT_S):
        deadline = time.monotonic() + timeout
        while True:
            payload = self.poll(name)
            if payload is not None:
                return payload
            if time.monotonic() > deadline:
                raise ProbeFailure(f"{self.role}: no {self.path(name)} after {timeout:.0f} s")
            time.sleep(0.02)

    def serve(self, handlers=None):
        """Answer requests until `stop` (or MAX_LIFE_S after start, then return anyway).

        A request is a file `<role>.<name>`; it is removed, handlers[name](payload) runs, and its
        result dict is announced as `<role>.<name>.done`.
        """
        handlers = handlers or {}
        while self.poll("stop") is None:
            if time.monotonic() - self.born > MAX_LIFE_S:
                print(f"{self.role}: no stop request within {MAX_LIFE_S:.0f} s; exiting", flush=True)
                return
            for name, handler in handlers.items():
                request = self.poll(f"{self.role}.{name}")
                if request is not None:
                    os.unlink(self.path(f"{self.role}.{name}"))
                    self.announce(f"{self.role}.{name}.done", handler(request))
            time.sleep(0.02)


def run_role(rendezvous, body):
    """Run body(); a ProbeFailure is announced as `<role>.error` and the program exits 1."""
    try:
        body()
    except ProbeFailure as e:
        print(f"{rendezvous.role}: {e}", file=sys.stderr, flush=True)
        rendezvous.announce(f"{rendezvous.role}.error", {"pid": os.getpid(), "message": str(e)})
        sys.exit(1)


# ---------------------------------------------------------------- CUDA setup and memory
def init_context(device=0):
    """cuInit, then make the device's primary context current; returns the CUdevice."""
    check(cu.cuInit(0), "cuInit")
    dev = check(cu.cuDeviceGet(device), "cuDeviceGet")
    ctx = check(cu.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
    check(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    return dev


def access_desc(device=0):
    desc = cu.CUmemAccessDesc()
    desc.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    desc.location.id = device
    desc.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    return [desc]


def create_exportable(size, device=0):
    """cuMemCreate of `size` bytes on `device`, exportable as a POSIX fd; returns the handle."""
    prop = cu.CUmemAllocationProp()
    prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = device
    prop.requestedHandleTypes = FD_HANDLE
    return check(cu.cuMemCreate(size, prop, 0), "cuMemCreate")


def map_handle(handle, size, va=None, device=0):
    """Map `handle` at a new reservation (or at `va`, already reserved); returns the VA as int."""
    if va is None:
        va = int(check(cu.cuMemAddressReserve(size, 0, 0, 0), "cuMemAddressReserve"))
    check(cu.cuMemMap(va, size, 0, handle, 0), "cuMemMap")
    check(cu.cuMemSetAccess(va, size, access_desc(device), 1), "cuMemSetAccess")
    return va


def chunk_value(seed, index):
    return (seed * 0x9E3779B1 + index * 0x01000193 + 1) & 0xFFFFFFFF


def chunk_ranges(size):
    for index, offset in enumerate(range(0, size, CHUNK)):
        yield index, offset, min(CHUNK, size - offset)


def expected_chunk(seed, index, length):
    return struct.pack("<I", chunk_value(seed, index)) * (length // 4)


def fill(va, size, seed):
    """Fill with one 32-bit value per 64 MiB chunk (see chunk_value); synchronous."""
    for index, offset, length in chunk_ranges(size):
        check(cu.cuMemsetD32(va + offset, chunk_value(seed, index), length // 4), "cuMemsetD32")
    check(cu.cuCtxSynchronize(), "cuCtxSynchronize")


def verify(va, size, seed):
    """Copy back chunk by chunk and compare with the fill pattern; returns (ok, first bad offset)."""
    buf = bytearray()
    for index, offset, length in chunk_ranges(size):
        if len(buf) != length:
            buf = bytearray(length)  # bytearray == bytes is a memcmp; a memoryview is not
        check(cu.cuMemcpyDtoH(buf, va + offset, length), "cuMemcpyDtoH")
        if buf != expected_chunk(seed, index, length):
            return False, offset
    return True, None


def ipc_handle_bytes(handle):
    return ctypes.string_at(handle.getPtr(), IPC_HANDLE_SIZE)


def ipc_handle_from_bytes(data):
    handle = cu.CUipcMemHandle()
    ctypes.memmove(handle.getPtr(), data, IPC_HANDLE_SIZE)
    return handle


def fd_target(pid, fd):
    """What /proc/PID/fd/FD points at, or None when the fd is closed."""
    try:
        return os.readlink(f"/proc/{pid}/fd/{fd}")
    except OSError:
        return None


# ---------------------------------------------------------------- fd passing (SCM_RIGHTS)
def serve_fd_forever(sock_path, fd):
    """Send `fd` to every client of the unix socket `sock_path`, from a daemon thread."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(sock_path)
    server.listen(8)

    def loop():
        while True:
            conn, _ = server.accept()
            with conn:
                socket.send_fds(conn, [b"f"], [fd])

    threading.Thread(target=loop, name="fd-server", daemon=True).start()


def fetch_fd(sock_path, timeout=30.0):
    """Connect to an fd server and receive one fd."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(timeout)
        conn.connect(sock_path)
        _, fds, _, _ = socket.recv_fds(conn, 16, 1)
    if not fds:
        raise ProbeFailure(f"no fd received from {sock_path}")
    return fds[0]
