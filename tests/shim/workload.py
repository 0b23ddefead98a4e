"""A cuda-python workload driven line by line, for the shim tests (the fake driver or a real GPU).

Reads one command a line on stdin and answers one JSON line on stdout: {"ok": true, ...} or
{"ok": false, "error": "<CUresult name or message>"}. Buffers are named; numbers are integers.

  malloc NAME BYTES [DEV]        cuMemAlloc (on device DEV's primary context) -> ptr
  free NAME                      cuMemFree
  pool NAME [FD] [DEV]           cuMemPoolCreate on DEV (FD=1: POSIX-fd exportable) -> handle
  threshold POOL BYTES           CU_MEMPOOL_ATTR_RELEASE_THRESHOLD of POOL ("default": the
                                 device 0 default pool)
  allocasync NAME BYTES [POOL] [STREAM]   cuMemAllocAsync (or cuMemAllocFromPoolAsync of POOL,
                                 "-" for none) on the worker stream (STREAM "capture": the
                                 capture stream) -> ptr
  freeasync NAME [STREAM]        cuMemFreeAsync on the worker (or capture) stream, not waited for
  capture MODE / endcapture      cuStreamBeginCapture (global|relaxed) / cuStreamEndCapture of a
                                 second stream, the capture stream
  trim POOL BYTES                cuMemPoolTrimTo
  poolexport POOL / poolimport NAME FD   pool export as a POSIX fd / its import
  cumem NAME BYTES [DEV] [FD]    cuMemCreate (FD=1 asks for POSIX fd), reserve, map, access DEV
                                                                            -> ptr, handle
  access NAME DEV PROT           cuMemSetAccess on NAME for device DEV, PROT rw|r|none
  unmap NAME / release NAME      cuMemUnmap / cuMemRelease
  retain NAME                    cuMemRetainAllocationHandle(ptr)           -> handle
  export NAME                    cuMemExportToShareableHandle (POSIX fd)    -> fd
  listen PATH / sendfd FD PATH / recvfd   pass an fd between workloads (SCM_RIGHTS, datagram)
  import NAME FD BYTES           cuMemImportFromShareableHandle, reserve, map, access -> ptr
  ipcget NAME [OFFSET] / ipcopen NAME HEX [BYTES] / ipcclose NAME   legacy CUDA IPC
  hostalloc NAME BYTES FLAGS / allochost NAME BYTES / freehost NAME
  hostreg NAME BYTES / hostunreg NAME            mmap'd memory registered by the app
  peer DEV                       cuCtxEnablePeerAccess to device DEV's primary context
  fill NAME VALUE / add NAME VALUE   kernel over NAME on the worker stream (not waited for)
  memset NAME VALUE              cuMemsetD32Async on the worker stream (not waited for)
  sleep US                       sleep_us kernel on the worker stream (not waited for)
  newctx                         cuCtxCreate; later work runs in that context
  stack [BYTES]                  cuCtxSetLimit(CU_LIMIT_STACK_SIZE, BYTES) in the work's context,
                                 then its value                             -> stack
  sync                           cuStreamSynchronize(worker stream)
  read NAME [COUNT]              cuMemcpyDtoH of COUNT uint32 (default 4)   -> values
  hammer SECONDS THREADS         THREADS threads each loop {launch add32 +1, async copy} on its
                                 own stream for SECONDS       -> counts, values, stalls per thread
  mc NAME                        multicast object of NAME's size (1 device), add device 0, bind
                                 NAME's handle                              -> handle
  unbind NAME                    cuMulticastUnbind of that bind
  mcexport NAME                  export NAME's multicast object as a POSIX fd -> fd
  mcimport NAME FD               import a multicast object, add device 1
  exit
"""
from __future__ import annotations

import array
import ctypes
import json
import mmap
import os
import socket
import sys
import threading
import time

from cuda.bindings import driver as cu

import kernels  # tests/shim/kernels.py: the fake driver's kernels or the same as PTX

FD_TYPE = cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
PROT = {"rw": cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        "r": cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READ,
        "none": cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_NONE}


class CudaError(Exception):
    pass


def ok(result):
    err = result[0]
    if err != cu.CUresult.CUDA_SUCCESS:
        raise CudaError(cu.cuGetErrorName(err)[1].decode())
    rest = result[1:]
    return rest[0] if len(rest) == 1 else (rest if rest else None)


def access_desc(dev, prot="rw"):
    d = cu.CUmemAccessDesc()
    d.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    d.location.id = dev
    d.flags = PROT[prot]
    return d


class Workload:
    def __init__(self):
        ok(cu.cuInit(0))
        self.ctxs = {}
        self.ctx = self.primary(0)
        ok(cu.cuCtxSetCurrent(self.ctx))
        self.module = kernels.load_module(cu)
        self.funcs = {k: ok(cu.cuModuleGetFunction(self.module, k.encode()))
                      for k in ("sleep_us", "fill32", "add32")}
        self.stream = ok(cu.cuStreamCreate(0))
        self.bufs = {}
        self.pools = {}
        self.capture_stream = None
        self.sock = None

    def primary(self, dev):
        if dev not in self.ctxs:
            self.ctxs[dev] = ok(cu.cuDevicePrimaryCtxRetain(ok(cu.cuDeviceGet(dev))))
        return self.ctxs[dev]

    def launch(self, kernel, args, types, stream=None):
        ok(cu.cuLaunchKernel(self.funcs[kernel], 1, 1, 1, 1, 1, 1, 0, stream or self.stream,
                             (args, types), 0))

    def map(self, handle, size, dev):
        va = ok(cu.cuMemAddressReserve(size, 0, 0, 0))
        ok(cu.cuMemMap(va, size, 0, handle, 0))
        ok(cu.cuMemSetAccess(va, size, [access_desc(dev)], 1))
        return int(va)

    # -- device memory -----------------------------------------------------------------------------
    def cmd_malloc(self, name, size, dev="0"):
        ok(cu.cuCtxSetCurrent(self.primary(int(dev))))
        try:
            ptr = int(ok(cu.cuMemAlloc(int(size))))
        finally:
            ok(cu.cuCtxSetCurrent(self.ctx))
        self.bufs[name] = {"ptr": ptr, "size": int(size)}
        return {"ptr": ptr}

    def cmd_free(self, name):
        ok(cu.cuMemFree(self.bufs.pop(name)["ptr"]))

    def pool(self, name):
        if name == "default":
            return ok(cu.cuDeviceGetDefaultMemPool(ok(cu.cuDeviceGet(0))))
        return self.pools[name]

    def cmd_pool(self, name, fd="0", dev="0"):
        props = cu.CUmemPoolProps()
        props.allocType = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        props.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        props.location.id = int(dev)
        if fd == "1":
            props.handleTypes = FD_TYPE
        self.pools[name] = ok(cu.cuMemPoolCreate(props))
        return {"handle": int(self.pools[name])}

    def cmd_threshold(self, pool, size):
        attr = cu.CUmemPool_attribute.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD
        ok(cu.cuMemPoolSetAttribute(self.pool(pool), attr, cu.cuuint64_t(int(size))))

    def stream_named(self, name):
        if name == "capture":
            if self.capture_stream is None:
                self.capture_stream = ok(cu.cuStreamCreate(0))
            return self.capture_stream
        return self.stream

    def cmd_allocasync(self, name, size, pool="-", stream="worker"):
        s = self.stream_named(stream)
        if pool == "-":
            ptr = int(ok(cu.cuMemAllocAsync(int(size), s)))
        else:
            ptr = int(ok(cu.cuMemAllocFromPoolAsync(int(size), self.pool(pool), s)))
        self.bufs[name] = {"ptr": ptr, "size": int(size)}
        return {"ptr": ptr}

    def cmd_freeasync(self, name, stream="worker"):
        ok(cu.cuMemFreeAsync(self.bufs.pop(name)["ptr"], self.stream_named(stream)))

    def cmd_capture(self, mode):
        modes = {"global": cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL,
                 "relaxed": cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED}
        ok(cu.cuStreamBeginCapture(self.stream_named("capture"), modes[mode]))

    def cmd_endcapture(self):
        ok(cu.cuStreamEndCapture(self.stream_named("capture")))

    def cmd_trim(self, pool, size):
        ok(cu.cuMemPoolTrimTo(self.pool(pool), int(size)))

    def cmd_poolexport(self, pool):
        return {"fd": int(ok(cu.cuMemPoolExportToShareableHandle(self.pool(pool), FD_TYPE, 0)))}

    def cmd_poolimport(self, name, fd):
        self.pools[name] = ok(cu.cuMemPoolImportFromShareableHandle(int(fd), FD_TYPE, 0))

    def cmd_cumem(self, name, size, dev="0", fd="1"):
        size, dev = int(size), int(dev)
        prop = cu.CUmemAllocationProp()
        prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        prop.location.id = dev
        if fd == "1":
            prop.requestedHandleTypes = FD_TYPE
        handle = ok(cu.cuMemCreate(size, prop, 0))
        ptr = self.map(handle, size, dev)
        self.bufs[name] = {"ptr": ptr, "size": size, "handle": handle}
        return {"ptr": ptr, "handle": int(handle)}

    def cmd_churn(self, cycles, size="2097152"):
        """cycles x (cuMemCreate, map, export a POSIX fd, import it back, unmap, release, close;
        then a cuMemAlloc and cuMemFree): everything the shim tracks, created and dropped."""
        size = int(size)
        prop = cu.CUmemAllocationProp()
        prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        prop.location.id = 0
        prop.requestedHandleTypes = FD_TYPE
        for _ in range(int(cycles)):
            handle = ok(cu.cuMemCreate(size, prop, 0))
            va = self.map(handle, size, 0)
            fd = int(ok(cu.cuMemExportToShareableHandle(handle, FD_TYPE, 0)))
            imported = ok(cu.cuMemImportFromShareableHandle(fd, FD_TYPE))
            os.close(fd)
            ok(cu.cuMemRelease(imported))
            ok(cu.cuMemUnmap(va, size))
            ok(cu.cuMemAddressFree(va, size))
            ok(cu.cuMemRelease(handle))
            ptr = ok(cu.cuMemAlloc(size))
            ok(cu.cuMemFree(ptr))

    def cmd_access(self, name, dev, prot):
        b = self.bufs[name]
        ok(cu.cuMemSetAccess(b["ptr"], b["size"], [access_desc(int(dev), prot)], 1))

    def cmd_unmap(self, name):
        b = self.bufs[name]
        ok(cu.cuMemUnmap(b["ptr"], b["size"]))

    def cmd_release(self, name):
        ok(cu.cuMemRelease(self.bufs[name]["handle"]))

    def cmd_retain(self, name):
        h = ok(cu.cuMemRetainAllocationHandle(self.bufs[name]["ptr"]))
        self.bufs[name]["handle"] = h
        return {"handle": int(h)}

    def cmd_export(self, name):
        return {"fd": int(ok(cu.cuMemExportToShareableHandle(self.bufs[name]["handle"], FD_TYPE, 0)))}

    def cmd_listen(self, path):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(path)

    def cmd_sendfd(self, fd, path):
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.sendmsg([b"fd"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [int(fd)]))],
                      0, path)

    def cmd_recvfd(self):
        self.sock.settimeout(10)
        _, fds, _, _ = socket.recv_fds(self.sock, 16, 1)
        return {"fd": fds[0]}

    def cmd_import(self, name, fd, size):
        handle = ok(cu.cuMemImportFromShareableHandle(int(fd), FD_TYPE))
        ptr = self.map(handle, int(size), 0)
        self.bufs[name] = {"ptr": ptr, "size": int(size), "handle": handle}
        return {"ptr": ptr}

    # cuda-bindings 13 exposes no field of CUipcMemHandle: its 64 bytes are reached by address.
    def cmd_ipcget(self, name, offset="0"):
        h = ok(cu.cuIpcGetMemHandle(self.bufs[name]["ptr"] + int(offset)))
        return {"handle": ctypes.string_at(h.getPtr(), 64).hex()}

    def cmd_ipcopen(self, name, hexdata, size="0"):
        h = cu.CUipcMemHandle()
        ctypes.memmove(h.getPtr(), bytes.fromhex(hexdata), 64)
        ptr = int(ok(cu.cuIpcOpenMemHandle(h, cu.CUipcMem_flags.CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)))
        self.bufs[name] = {"ptr": ptr, "size": int(size)}
        return {"ptr": ptr}

    def cmd_ipcclose(self, name):
        ok(cu.cuIpcCloseMemHandle(self.bufs.pop(name)["ptr"]))

    # -- host memory ---------------------------------------------------------------------------------
    def cmd_hostalloc(self, name, size, flags="0"):
        ptr = int(ok(cu.cuMemHostAlloc(int(size), int(flags))))
        self.bufs[name] = {"ptr": ptr, "size": int(size)}
        ctypes.memset(ptr, 0x5A, int(size))  # the CPU can use it
        return {"ptr": ptr}

    def cmd_allochost(self, name, size):
        ptr = int(ok(cu.cuMemAllocHost(int(size))))
        self.bufs[name] = {"ptr": ptr, "size": int(size)}
        ctypes.memset(ptr, 0x5A, int(size))
        return {"ptr": ptr}

    def cmd_freehost(self, name):
        ok(cu.cuMemFreeHost(self.bufs.pop(name)["ptr"]))

    def cmd_hostreg(self, name, size):
        m = mmap.mmap(-1, int(size))
        ptr = ctypes.addressof(ctypes.c_char.from_buffer(m))
        ok(cu.cuMemHostRegister(ptr, int(size), 0))
        self.bufs[name] = {"ptr": ptr, "size": int(size), "mmap": m}
        return {"ptr": ptr}

    def cmd_hostunreg(self, name):
        ok(cu.cuMemHostUnregister(self.bufs[name]["ptr"]))

    def cmd_peer(self, dev):
        ok(cu.cuCtxEnablePeerAccess(self.primary(int(dev)), 0))

    # -- work ----------------------------------------------------------------------------------------
    def cmd_fill(self, name, value):
        b = self.bufs[name]
        self.launch("fill32", (b["ptr"], int(value), b["size"] // 4),
                    (ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint64))

    def cmd_add(self, name, value):
        b = self.bufs[name]
        self.launch("add32", (b["ptr"], int(value), b["size"] // 4),
                    (ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint64))

    def cmd_memset(self, name, value):
        b = self.bufs[name]
        ok(cu.cuMemsetD32Async(b["ptr"], int(value), b["size"] // 4, self.stream))

    def cmd_sleep(self, us):
        self.launch("sleep_us", (int(us),), (ctypes.c_uint64,))

    def cmd_newctx(self):
        """Moves the work (kernels, stream) to a context of its own from cuCtxCreate."""
        self.ctx = ok(cu.cuCtxCreate(None, 0, ok(cu.cuDeviceGet(0))))
        ok(cu.cuCtxSetCurrent(self.ctx))
        self.module = kernels.load_module(cu)
        self.funcs = {k: ok(cu.cuModuleGetFunction(self.module, k.encode()))
                      for k in ("sleep_us", "fill32", "add32")}
        self.stream = ok(cu.cuStreamCreate(0))

    def cmd_stack(self, size=None):
        limit = cu.CUlimit.CU_LIMIT_STACK_SIZE
        if size is not None:
            ok(cu.cuCtxSetLimit(limit, int(size)))
        return {"stack": int(ok(cu.cuCtxGetLimit(limit)))}

    def cmd_sync(self):
        ok(cu.cuStreamSynchronize(self.stream))

    def cmd_read(self, name, count="4"):
        out = (ctypes.c_uint32 * int(count))()
        ok(cu.cuMemcpyDtoH(ctypes.addressof(out), self.bufs[name]["ptr"], 4 * int(count)))
        return {"values": list(out)}

    def cmd_hammer(self, seconds, nthreads):
        """Threads submitting kernels and copies as fast as they can; each thread adds 1 to its
        own buffer per iteration, so the final contents prove every launch ran exactly once.
        Returns per thread the iteration count and the stalls: (start, end) CLOCK_MONOTONIC
        intervals longer than 0.2 s without a completed iteration."""
        deadline = time.monotonic() + float(seconds)
        counts = [0] * int(nthreads)
        stalls = [[] for _ in counts]
        errors = []
        bufs = [int(ok(cu.cuMemAlloc(4096))) for _ in counts]

        def run(i):
            try:
                host = (ctypes.c_uint32 * 1)()
                ok(cu.cuCtxSetCurrent(self.ctx))
                stream = ok(cu.cuStreamCreate(0))
                ok(cu.cuMemsetD32Async(bufs[i], 0, 1024, stream))
                last = time.monotonic()
                while last < deadline:
                    self.launch("add32", (bufs[i], 1, 1024),
                                (ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint64), stream)
                    ok(cu.cuMemcpyDtoHAsync(ctypes.addressof(host), bufs[i], 4, stream))
                    counts[i] += 1
                    now = time.monotonic()
                    if now - last > 0.2:
                        stalls[i].append((last, now))
                    last = now
                ok(cu.cuStreamSynchronize(stream))
            except CudaError as e:
                errors.append(str(e))

        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(counts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise CudaError(errors[0])
        values = []
        for b in bufs:
            out = (ctypes.c_uint32 * 1024)()
            ok(cu.cuMemcpyDtoH(ctypes.addressof(out), b, 4096))
            values.append(sorted(set(out)))
            ok(cu.cuMemFree(b))
        return {"counts": counts, "values": values, "stalls": stalls}

    def cmd_mc(self, name):
        b = self.bufs[name]
        prop = cu.CUmulticastObjectProp()
        prop.numDevices = 1
        prop.size = b["size"]
        prop.handleTypes = FD_TYPE
        mc = ok(cu.cuMulticastCreate(prop))
        ok(cu.cuMulticastAddDevice(mc, ok(cu.cuDeviceGet(0))))
        ok(cu.cuMulticastBindMem(mc, 0, b["handle"], 0, b["size"], 0))
        b["mc"] = mc
        return {"handle": int(mc)}

    def cmd_mcexport(self, name):
        return {"fd": int(ok(cu.cuMemExportToShareableHandle(self.bufs[name]["mc"], FD_TYPE, 0)))}

    def cmd_mcimport(self, name, fd):
        mc = ok(cu.cuMemImportFromShareableHandle(int(fd), FD_TYPE))
        ok(cu.cuMulticastAddDevice(mc, ok(cu.cuDeviceGet(1))))
        self.bufs[name] = {"mc": mc}

    def cmd_unbind(self, name):
        b = self.bufs[name]
        ok(cu.cuMulticastUnbind(b["mc"], ok(cu.cuDeviceGet(0)), 0, b["size"]))


def _run_command(w, words):
    try:
        res = getattr(w, "cmd_" + words[0])(*words[1:]) or {}
        res["ok"] = True
    except CudaError as e:
        res = {"ok": False, "error": str(e)}
    except Exception as e:  # a test bug: report it, keep serving
        res = {"ok": False, "error": f"{type(e).__name__}: {e}"}
    return res


def _serve_socket(w, path):
    """One command per connection on a unix socket at path: a workload CRIU can dump (no pipe to
    the test; the test connects only between dumps)."""
    import socket
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)  # bound at its final name: CRIU finds a socket by the name it was bound to
    listener.listen(4)
    while True:
        conn, _ = listener.accept()
        with conn, conn.makefile("rw") as f:
            words = f.readline().split()
            if not words:
                continue
            if words[0] == "exit":
                f.write(json.dumps({"ok": True}) + "\n")
                return
            f.write(json.dumps(_run_command(w, words)) + "\n")


def main(workload_class=None):
    """Serve commands from stdin until `exit` (workload_class: a Workload subclass with more);
    with `--socket PATH`, from a unix socket at PATH instead."""
    w = (workload_class or Workload)()
    if len(sys.argv) == 3 and sys.argv[1] == "--socket":
        return _serve_socket(w, sys.argv[2])
    print(json.dumps({"ok": True, "pid": os.getpid()}), flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        if words[0] == "exit":
            break
        print(json.dumps(_run_command(w, words)), flush=True)


if __name__ == "__main__":
    main()
