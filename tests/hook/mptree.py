"""A Python multiprocessing tree CRIU can dump: this parent (no CUDA) serves a unix socket and talks
to a spawned child over multiprocessing queues (their locks are POSIX semaphores whose /dev/shm
files are deleted while open: CRIU needs link-remap) and shares a multiprocessing Event with it.
The child uses CUDA through the shim: 4 MiB of device memory filled with the value it is given.

    python mptree.py SOCKET

Commands, one per connection, a JSON reply each: `write V` (the child fills its GPU memory with V),
`read` -> {"values": [first and last uint32 of the GPU memory]}, `pids` -> {"pids": [parent, child]}.
"""
import ctypes
import json
import multiprocessing as mp
import os
import socket
import sys

SIZE = 4 << 20


def child(inbox, outbox, ready):
    from cuda.bindings import driver as cu

    def ok(r):
        err, *rest = r if isinstance(r, tuple) else (r,)
        assert err == cu.CUresult.CUDA_SUCCESS, err
        return rest[0] if len(rest) == 1 else rest

    ok(cu.cuInit(0))
    ctx = ok(cu.cuDevicePrimaryCtxRetain(ok(cu.cuDeviceGet(0))))
    ok(cu.cuCtxSetCurrent(ctx))
    mem = ok(cu.cuMemAlloc(SIZE))
    ok(cu.cuMemsetD32(mem, 0, SIZE // 4))
    ready.set()
    outbox.put(os.getpid())
    host = (ctypes.c_uint32 * (SIZE // 4))()
    while True:
        cmd, arg = inbox.get()
        if cmd == "write":
            ok(cu.cuMemsetD32(mem, arg, SIZE // 4))
            ok(cu.cuCtxSynchronize())
            outbox.put(None)
        elif cmd == "read":
            ok(cu.cuMemcpyDtoH(host, mem, SIZE))
            outbox.put([host[0], host[-1]])


def main():
    path = sys.argv[1]
    ctx = mp.get_context("spawn")
    inbox, outbox, ready = ctx.Queue(), ctx.Queue(), ctx.Event()
    proc = ctx.Process(target=child, args=(inbox, outbox, ready), daemon=True)
    proc.start()
    child_pid = outbox.get(timeout=60)
    ready.wait(60)
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)  # its own name: CRIU restores a listening socket at the name it was bound to
    srv.listen(8)
    while True:
        conn, _ = srv.accept()
        with conn, conn.makefile("rw") as f:
            words = f.readline().split()
            if words[0] == "write":
                inbox.put(("write", int(words[1])))
                outbox.get(timeout=60)
                reply = {"ok": True}
            elif words[0] == "read":
                inbox.put(("read", None))
                reply = {"ok": True, "values": outbox.get(timeout=60)}
            else:
                reply = {"ok": True, "pids": [os.getpid(), child_pid]}
            f.write(json.dumps(reply) + "\n")


if __name__ == "__main__":
    main()
