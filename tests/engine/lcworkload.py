"""The shim tests' line-driven workload (tests/shim/workload.py) plus what suspend/resume tests need.

Extra commands:
  hostfill NAME VALUE      the CPU writes uint32 VALUE over host buffer NAME
  driverhost NAME SIZE     (fake driver) a page-locked buffer the driver keeps for itself, never
                           the shim's (as a runtime's internal buffers): the checkpoint unmaps it
  reader NAME              a CPU thread reads host buffer NAME in a loop from now on (a crash of
                           the process is what a test would see if the memory went away)
  readers                  -> reads: how many passes the reader thread made, value: what it read last
  trap SIGNAL              record deliveries of SIGNAL (a number)
  signals                  -> the signals delivered so far, in order
  closefd FD               close an fd (an fd passed to this process, or an export)
  fdtarget FD              -> what /proc/self/fd/FD points to
  allocloop COUNT          a thread allocates COUNT blocks of 2 MiB of stream-ordered memory,
                           one every 5 ms, and keeps them (no launch or copy: the gates do not
                           hold it)
  connect PATH             -> fd: a unix stream socket connected to a listener at PATH (outside
                           the tree, CRIU refuses to dump it: "External socket is used")
  unlinked PATH            -> fd: PATH created and held open, hard-linked to PATH.other, PATH
                           removed (a deleted path of a linked file: CRIU dumps it only with
                           link-remap)
"""
from __future__ import annotations

import ctypes
import os
import signal
import socket
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "shim"))

import workload as base  # noqa: E402  (tests/shim/workload.py)


class LifecycleWorkload(base.Workload):
    def __init__(self):
        super().__init__()
        self.reads = 0
        self.last = None
        self.delivered = []

    def cmd_hostfill(self, name, value):
        b = self.bufs[name]
        arr = (ctypes.c_uint32 * (b["size"] // 4)).from_address(b["ptr"])
        ctypes.memmove(arr, (ctypes.c_uint32 * len(arr))(*([int(value)] * len(arr))), b["size"])

    def cmd_driverhost(self, name, size):
        lib = ctypes.CDLL("libcuda.so.1")
        lib.fakecuda_internal_buffer.restype = ctypes.c_void_p
        ptr = lib.fakecuda_internal_buffer(ctypes.c_size_t(int(size)))
        if not ptr:
            raise RuntimeError("fakecuda_internal_buffer failed")
        self.bufs[name] = {"ptr": ptr, "size": int(size)}
        ctypes.memset(ptr, 0, int(size))
        return {"ptr": ptr}

    def cmd_reader(self, name):
        b = self.bufs[name]
        arr = (ctypes.c_uint32 * (b["size"] // 4)).from_address(b["ptr"])

        def loop():
            while True:
                self.last = arr[0] + arr[len(arr) - 1]
                self.reads += 1

        threading.Thread(target=loop, daemon=True, name="reader").start()

    def cmd_readers(self):
        return {"reads": self.reads, "value": self.last}

    def cmd_trap(self, signum):
        signal.signal(int(signum), lambda s, f: self.delivered.append(s))

    def cmd_signals(self):
        return {"signals": list(self.delivered)}

    def cmd_closefd(self, fd):
        os.close(int(fd))

    def cmd_allocloop(self, count):
        from cuda.bindings import driver as cu
        ctx = self.ctx

        def loop():
            base.ok(cu.cuCtxSetCurrent(ctx))
            stream = base.ok(cu.cuStreamCreate(0))
            for _ in range(int(count)):
                base.ok(cu.cuMemAllocAsync(2 << 20, stream))
                time.sleep(0.005)

        threading.Thread(target=loop, daemon=True, name="allocloop").start()

    def cmd_connect(self, path):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(path)
        return {"fd": s.detach()}  # the fd is the test's to close (closefd)

    def cmd_unlinked(self, path):
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        os.link(path, path + ".other")
        os.unlink(path)
        return {"fd": fd}

    def cmd_fdtarget(self, fd):
        return {"target": os.readlink(f"/proc/self/fd/{int(fd)}")}


if __name__ == "__main__":
    base.main(LifecycleWorkload)
