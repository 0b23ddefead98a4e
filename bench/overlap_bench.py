"""Can the driver checkpoint a process while this process still copies out the memory that
process has released? (GPU)

A dump or suspend now runs save, then release, lock and checkpoint, one after the other: the
driver's checkpoint (0.36-0.48 s, most of it fixed) waits for the whole save. This process maps each
allocation by importing the owner's exported fd, and an import keeps the physical memory alive
after the owner drops its own handle. If the driver then checkpoints the owner without that memory
and leaves this process's mapping intact, the checkpoint can run beside the save.

Each scenario starts a fresh owner (a child of this process, its own CUDA context) holding --gib
GiB in one exportable allocation, every 64 MiB chunk set to its own 32-bit pattern:

  nothing held    the owner releases it, nobody imported it: the checkpoint alone
  save, then      this process imports it, the owner releases it; the save (device to a pinned ring,
  checkpoint      written as 64 MiB files under --dir), then lock + checkpoint
  beside          the same, with lock + checkpoint in a thread started as the save starts
  beside, owner   the same, the owner keeping its exported fd open (the memory then outlives this
  keeps its fd    process too); after the restore the owner maps that fd again at its old address

then restore + unlock of the owner. Every chunk's first and last words are checked as they are
saved; after "beside" this process exports its import again and the owner maps it at its old
address and checks it (the way a resume could hand memory back without a copy). Driver calls come
from this one process only. Seconds per part, and what failed, with the driver's error.

    NCCL_NVLS_ENABLE=0 python3 bench/overlap_bench.py --gib 16 --dir /dev/shm
"""
import argparse
import concurrent.futures
import ctypes
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from criu_gpushare.gpu import checkpoint_api as ck, driver as drv  # noqa: E402
from criu_gpushare.gpu.memory import (  # noqa: E402
    ImportedAllocation, PinnedBuffer, fd_handle_type, set_read_write, use_device)

import exportable  # noqa: E402

CHUNK = 64 << 20
SLOTS = 16


def pattern(i):
    return (0x5A000001 + i * 0x01010101) & 0xFFFFFFFF


def _words(cu, ptr, size):
    """(first, last) 32-bit word of each chunk of device memory at ptr."""
    out = []
    buf = (ctypes.c_uint32 * 1)()
    for off in range(0, size, CHUNK):
        pair = []
        for at in (off, off + CHUNK - 4):
            drv.check(cu.cuMemcpyDtoH(ctypes.addressof(buf), int(ptr) + at, 4), "read a word")
            pair.append(buf[0])
        out.append(tuple(pair))
    return out


# -- the owner (a child process) -------------------------------------------------------------------

def owner(sock_path, size, device):
    cu = drv.driver()
    use_device(device)
    handle, va = exportable.allocation(size, device)
    va = int(va)
    for i in range(size // CHUNK):
        drv.check(cu.cuMemsetD32(va + i * CHUNK, pattern(i), CHUNK // 4), "memset")
    drv.check(cu.cuCtxSynchronize(), "sync")
    fd = exportable.export(handle)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(sock_path)
    socket.send_fds(conn, [b"fd"], [fd])
    while True:
        msg, fds, _, _ = socket.recv_fds(conn, 64, 1)
        cmd = msg.decode()
        if cmd in ("release", "release, keep the fd"):
            drv.check(cu.cuMemUnmap(va, size), "unmap")
            drv.check(cu.cuMemRelease(handle), "release")
            if cmd == "release":
                os.close(fd)
                fd = None
            conn.sendall(b"released")
        elif cmd in ("adopt", "adopt the kept fd"):
            try:
                h = drv.check(cu.cuMemImportFromShareableHandle(fds[0] if cmd == "adopt" else fd,
                                                                fd_handle_type()), "import")
                drv.check(cu.cuMemMap(va, size, 0, h, 0), "map at the old address")
                set_read_write(va, size, device)
                good = _words(cu, va, size) == [(pattern(i), pattern(i)) for i in range(size // CHUNK)]
                conn.sendall(b"adopted, contents " + (b"intact" if good else b"WRONG"))
            except Exception as e:  # noqa: BLE001 - reported to the bench
                conn.sendall(f"adopt failed: {e}".encode())
        else:
            return


class Owner:
    def __init__(self, size, device, workdir):
        self.path = os.path.join(workdir, f"owner-{time.monotonic_ns()}.sock")
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        srv.bind(self.path)
        srv.listen(1)
        srv.settimeout(120)
        self.proc = subprocess.Popen([sys.executable, __file__, "--owner", self.path, "--size",
                                      str(size), "--device", str(device)])
        self.conn, _ = srv.accept()
        srv.close()
        self.conn.settimeout(120)
        _, fds, _, _ = socket.recv_fds(self.conn, 64, 1)
        self.fd = fds[0]
        self.pid = self.proc.pid

    def ask(self, cmd, fds=()):
        socket.send_fds(self.conn, [cmd.encode()], list(fds))
        return self.conn.recv(4096).decode()

    def close(self):
        try:
            self.conn.sendall(b"exit")
        except OSError:
            pass
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self.fd)


# -- this process's side ---------------------------------------------------------------------------

def timed(fn, *args):
    t = time.monotonic()
    value = fn(*args)
    return time.monotonic() - t, value


def checkpoint(pid):
    ck.raise_first(ck.lock_all([pid], 10_000))
    ck.raise_first(ck.checkpoint_all([pid]))


def bring_back(pid):
    ck.raise_first(ck.restore_all([pid]))
    ck.raise_first(ck.unlock_all([pid]))


def save(cu, ptr, size, ring, streams, outdir, device):
    """ptr's bytes to 64 MiB files under outdir through the ring -> chunks whose words were wrong."""
    wrong = []
    writers = concurrent.futures.ThreadPoolExecutor(SLOTS)
    pending = [None] * SLOTS

    def write(i, slot):
        buf = ring[slot]
        words = struct.unpack_from("<I", buf.view, 0)[0], struct.unpack_from("<I", buf.view, CHUNK - 4)[0]
        if words != (pattern(i), pattern(i)):
            wrong.append(i)
        fd = os.open(os.path.join(outdir, f"{i:05d}"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            view = buf.view
            done = 0
            while done < CHUNK:
                done += os.write(fd, view[done:])
        finally:
            os.close(fd)

    use_device(device)
    for i in range(size // CHUNK):
        slot = i % SLOTS
        if pending[slot] is not None:
            pending[slot].result()
        drv.check(cu.cuMemcpyDtoHAsync(ring[slot].ptr, int(ptr) + i * CHUNK, CHUNK, streams[slot]), "copy")
        drv.check(cu.cuStreamSynchronize(streams[slot]), "sync")
        pending[slot] = writers.submit(write, i, slot)
    for f in pending:
        if f is not None:
            f.result()
    writers.shutdown()
    return wrong


def scenario(name, size, device, workdir, ring, streams):
    cu = drv.driver()
    row = {"scenario": name}
    own = Owner(size, device, workdir)
    outdir = tempfile.mkdtemp(prefix="overlap-", dir=workdir)
    mem = None
    try:
        if name != "nothing held":
            mem = ImportedAllocation(own.fd, size, device)
        keeps_fd = name.endswith("owner keeps its fd")
        row["owner release"] = timed(own.ask, "release, keep the fd" if keeps_fd else "release")[0]
        if name == "nothing held":
            row["checkpoint"] = timed(checkpoint, own.pid)[0]
        elif name == "save, then checkpoint":
            row["save"], wrong = timed(save, cu, mem.ptr, size, ring, streams, outdir, device)
            row["checkpoint"] = timed(checkpoint, own.pid)[0]
            row["wall"] = row["save"] + row["checkpoint"]
            row["chunks wrong"] = len(wrong)
        else:
            result = {}

            def beside():
                try:
                    result["secs"] = timed(checkpoint, own.pid)[0]
                except Exception as e:  # noqa: BLE001 - reported in the row
                    result["error"] = str(e)
            t = time.monotonic()
            thread = threading.Thread(target=beside)
            thread.start()
            row["save"], wrong = timed(save, cu, mem.ptr, size, ring, streams, outdir, device)
            thread.join()
            row["wall"] = time.monotonic() - t
            row["checkpoint"] = result.get("secs")
            if "error" in result:
                row["checkpoint error"] = result["error"]
            row["chunks wrong"] = len(wrong)
        row["state"] = ck.state(own.pid).name
        if row["state"] == "CHECKPOINTED":
            row["restore + unlock"] = timed(bring_back, own.pid)[0]
        if mem is not None:
            row["after: words here"] = "intact" if _words(cu, mem.ptr, size) == [
                (pattern(i), pattern(i)) for i in range(size // CHUNK)] else "WRONG"
            if keeps_fd:
                # what a rollback after this process died would do: the owner maps its own
                # exported fd again (this process's import is dropped first)
                mem.close()
                mem = None
                row["owner adopts it"] = own.ask("adopt the kept fd")
            elif name == "beside":
                try:
                    fd = exportable.export(mem.handle, "export the import again")
                    row["owner adopts it"] = own.ask("adopt", [fd])
                    os.close(fd)
                except Exception as e:  # noqa: BLE001 - reported in the row
                    row["owner adopts it"] = f"export failed: {e}"
    except Exception as e:  # noqa: BLE001 - a row says what failed
        row["error"] = str(e)
    finally:
        if mem is not None:
            mem.close()
        own.close()
        shutil.rmtree(outdir, ignore_errors=True)
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gib", type=int, default=16)
    ap.add_argument("--dir", default="/dev/shm", help="where the save writes (a tmpfs)")
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=2, help="rounds of the three scenarios")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--owner", help=argparse.SUPPRESS)
    ap.add_argument("--size", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.owner:
        return owner(args.owner, args.size, args.device)
    cu = drv.driver()
    use_device(args.device)
    size = args.gib << 30
    ring = [PinnedBuffer(CHUNK) for _ in range(SLOTS)]
    streams = [drv.check(cu.cuStreamCreate(1), "stream") for _ in range(SLOTS)]
    workdir = tempfile.mkdtemp(prefix="overlap-bench-", dir=args.dir)
    rows = []
    try:
        for r in range(args.repeat):
            for name in ("nothing held", "save, then checkpoint", "beside",
                         "beside, owner keeps its fd"):
                row = scenario(name, size, args.device, workdir, ring, streams)
                row["round"] = r + 1
                rows.append(row)
                print(json.dumps(row) if args.json else
                      "  ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()),
                      flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"\n{'scenario':24} {'save s':>7} {'ckpt s':>7} {'wall s':>7}  check")
    for row in rows:
        def f(key):
            v = row.get(key)
            return f"{v:7.3f}" if isinstance(v, float) else f"{'-':>7}"
        check = row.get("error") or row.get("checkpoint error") or \
            f"{row.get('chunks wrong', '-')} wrong, after: {row.get('after: words here', '-')}, " \
            f"{row.get('owner adopts it', '')}"
        print(f"{row['scenario']:24} {f('save')} {f('checkpoint')} {f('wall')}  {check}")


if __name__ == "__main__":
    sys.exit(main())
