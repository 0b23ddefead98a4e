"""A CUDA process driven line by line, for tests of the fake driver.

Run as ``python cuda_worker.py`` with the fake driver on LD_LIBRARY_PATH (every command but
``kernel`` and ``sleep_kernel``, which launch the fake's kernels, also works on the real driver:
tests/shim/test_ipc_lazy.py checkpoints from it there). It reads one command a line
on stdin and answers one line on stdout: ``ok [values...]`` or ``err <CUresult name>``. Buffers are
named; sizes and values are integers (0x... accepted). Commands:

  alloc NAME BYTES                cuMemAlloc                              -> ok VA
  free NAME                       cuMemFree
  vmm NAME BYTES [DEV]            cuMemCreate (POSIX fd), reserve, map, set access -> ok VA HANDLE
  export NAME                     cuMemExportToShareableHandle            -> ok FD
  import NAME PID FD              open /proc/PID/fd/FD, import, reserve, map, access -> ok VA
  close_fd FD                     close an fd (e.g. an exported one)
  unmap_release NAME              cuMemUnmap + cuMemRelease, the VA stays reserved
  reimport NAME PID FD            import a fresh fd and map it at NAME's kept VA -> ok VA
  ipc_get NAME                    cuIpcGetMemHandle                       -> ok HEX
  ipc_open NAME HEX               cuIpcOpenMemHandle                      -> ok VA
  ipc_close NAME                  cuIpcCloseMemHandle
  set32 NAME VALUE [STREAM]       cuMemsetD32 (sync, or async on a new stream when STREAM=async)
  get32 NAME [INDEX]              cuMemcpyDtoH of one uint32              -> ok VALUE
  kernel KNAME NAME VALUE         launch fill32/add32 over NAME on a stream, then synchronize
  sleep_kernel US                 launch sleep_us on a stream, do not wait
  host NAME BYTES                 cuMemHostAlloc                          -> ok VA
  hostset NAME VALUE / hostget NAME   write / read the first byte from the CPU
  info                            cuMemGetInfo                            -> ok FREE TOTAL
  ck OP PID [PID...] [timeout=MS]  checkpoint API call on each pid, one thread per pid, all at once
                                  -> ok RESULT_NAME... (per pid, in order)
  state PID / tid PID             cuCheckpointProcessGetState / GetRestoreThreadId
  uuid DEV                        -> ok HEX
  restore_map PID OLD NEW         restore PID with gpuPairs {uuid(OLD) -> uuid(NEW)}
  exit
"""
from __future__ import annotations

import ctypes
import os
import sys
import threading

from cuda.bindings import driver as cu

FD_TYPE = cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR


class CudaError(Exception):
    pass


def ok(result):
    err = result[0]
    if err != cu.CUresult.CUDA_SUCCESS:
        raise CudaError(cu.cuGetErrorName(err)[1].decode())
    rest = result[1:]
    return rest[0] if len(rest) == 1 else (rest if rest else None)


def name_of(err) -> str:
    return cu.cuGetErrorName(err)[1].decode()


class Worker:
    def __init__(self) -> None:
        ok(cu.cuInit(0))
        self.dev = ok(cu.cuDeviceGet(int(os.environ.get("WORKER_DEVICE", "0"))))
        self.ctx = ok(cu.cuDevicePrimaryCtxRetain(self.dev))
        ok(cu.cuCtxSetCurrent(self.ctx))
        self.bufs: dict[str, dict] = {}
        self.module = None  # the fake's kernels, loaded by the first launch: the other commands
        # (checkpoint calls above all) also run against the real driver

    # -- helpers -----------------------------------------------------------------------------------
    def _access(self, dev: int):
        desc = cu.CUmemAccessDesc()
        desc.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        desc.location.id = dev
        desc.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        return [desc]

    def _map(self, name: str, handle, size: int, dev: int, va=None) -> int:
        if va is None:
            va = ok(cu.cuMemAddressReserve(size, 0, 0, 0))
        ok(cu.cuMemMap(va, size, 0, handle, 0))
        ok(cu.cuMemSetAccess(va, size, self._access(dev), 1))
        self.bufs[name] = {"va": int(va), "size": size, "handle": handle, "dev": dev}
        return int(va)

    def _import(self, pid: int, fd: int):
        mine = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDWR)
        try:
            handle = ok(cu.cuMemImportFromShareableHandle(mine, FD_TYPE))
        finally:
            os.close(mine)
        return handle

    # -- commands ----------------------------------------------------------------------------------
    def cmd_alloc(self, name, size):
        va = ok(cu.cuMemAlloc(int(size, 0)))
        self.bufs[name] = {"va": int(va), "size": int(size, 0)}
        return hex(int(va))

    def cmd_free(self, name):
        ok(cu.cuMemFree(self.bufs.pop(name)["va"]))

    def cmd_vmm(self, name, size, dev="0"):
        size, dev = int(size, 0), int(dev)
        prop = cu.CUmemAllocationProp()
        prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        prop.location.id = dev
        prop.requestedHandleTypes = FD_TYPE
        handle = ok(cu.cuMemCreate(size, prop, 0))
        va = self._map(name, handle, size, dev)
        return f"{hex(va)} {int(handle)}"

    def cmd_export(self, name):
        return str(ok(cu.cuMemExportToShareableHandle(self.bufs[name]["handle"], FD_TYPE, 0)))

    def cmd_import(self, name, pid, fd):
        size = os.stat(f"/proc/{pid}/fd/{fd}").st_size
        handle = self._import(int(pid), int(fd))
        return hex(self._map(name, handle, size, 0))

    def cmd_close_fd(self, fd):
        os.close(int(fd))

    def cmd_unmap_release(self, name):
        b = self.bufs[name]
        ok(cu.cuCtxSynchronize())
        ok(cu.cuMemUnmap(b["va"], b["size"]))
        ok(cu.cuMemRelease(b["handle"]))

    def cmd_reimport(self, name, pid, fd):
        b = self.bufs[name]
        handle = self._import(int(pid), int(fd))
        return hex(self._map(name, handle, b["size"], b["dev"], va=b["va"]))

    def cmd_ipc_get(self, name):
        handle = ok(cu.cuIpcGetMemHandle(self.bufs[name]["va"]))
        return ctypes.string_at(handle.getPtr(), 64).hex()

    def cmd_ipc_open(self, name, hexdata):
        handle = cu.CUipcMemHandle()
        ctypes.memmove(handle.getPtr(), bytes.fromhex(hexdata), 64)
        flags = cu.CUipcMem_flags.CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
        va = ok(cu.cuIpcOpenMemHandle(handle, flags))
        _, size = ok(cu.cuMemGetAddressRange(va))
        self.bufs[name] = {"va": int(va), "size": size}
        return hex(int(va))

    def cmd_ipc_close(self, name):
        ok(cu.cuIpcCloseMemHandle(self.bufs.pop(name)["va"]))

    def cmd_set32(self, name, value, mode="sync"):
        b = self.bufs[name]
        count = b["size"] // 4
        if mode == "async":
            stream = ok(cu.cuStreamCreate(0))
            ok(cu.cuMemsetD32Async(b["va"], int(value, 0), count, stream))
            ok(cu.cuStreamSynchronize(stream))
            ok(cu.cuStreamDestroy(stream))
        else:
            ok(cu.cuMemsetD32(b["va"], int(value, 0), count))

    def cmd_get32(self, name, index="0"):
        out = ctypes.c_uint32()
        ok(cu.cuMemcpyDtoH(ctypes.addressof(out), self.bufs[name]["va"] + 4 * int(index), 4))
        return hex(out.value)

    def _launch(self, kname, args, types, stream):
        if self.module is None:
            self.module = ok(cu.cuModuleLoadData(b"fakecuda"))
        func = ok(cu.cuModuleGetFunction(self.module, kname.encode()))
        ok(cu.cuLaunchKernel(func, 1, 1, 1, 1, 1, 1, 0, stream, (args, types), 0))

    def cmd_kernel(self, kname, name, value):
        b = self.bufs[name]
        stream = ok(cu.cuStreamCreate(0))
        self._launch(kname, (b["va"], int(value, 0), b["size"] // 4),
                     (ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint64), stream)
        ok(cu.cuStreamSynchronize(stream))

    def cmd_sleep_kernel(self, us):
        self.sleep_stream = ok(cu.cuStreamCreate(0))
        self._launch("sleep_us", (int(us),), (ctypes.c_uint64,), self.sleep_stream)

    def cmd_host(self, name, size):
        va = ok(cu.cuMemHostAlloc(int(size, 0), 0))
        self.bufs[name] = {"va": int(va), "size": int(size, 0)}
        return hex(int(va))

    def cmd_hostset(self, name, value):
        ctypes.c_uint8.from_address(self.bufs[name]["va"]).value = int(value, 0)

    def cmd_hostget(self, name):
        return hex(ctypes.c_uint8.from_address(self.bufs[name]["va"]).value)

    def cmd_info(self):
        free, total = ok(cu.cuMemGetInfo())
        return f"{free} {total}"

    def cmd_ck(self, op, *args):
        pids = [int(a) for a in args if not a.startswith("timeout=")]
        timeout = [int(a.split("=")[1]) for a in args if a.startswith("timeout=")]
        results = [None] * len(pids)

        def one(i, pid):
            if op == "lock":
                lock_args = cu.CUcheckpointLockArgs()
                lock_args.timeoutMs = timeout[0] if timeout else 0
                err = cu.cuCheckpointProcessLock(pid, lock_args)[0]
            elif op == "checkpoint":
                err = cu.cuCheckpointProcessCheckpoint(pid, None)[0]
            elif op == "restore":
                err = cu.cuCheckpointProcessRestore(pid, None)[0]
            elif op == "unlock":
                err = cu.cuCheckpointProcessUnlock(pid, None)[0]
            else:
                raise ValueError(op)
            results[i] = name_of(err)

        threads = [threading.Thread(target=one, args=(i, pid)) for i, pid in enumerate(pids)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return " ".join(results)

    def cmd_state(self, pid):
        return str(int(ok(cu.cuCheckpointProcessGetState(int(pid)))))

    def cmd_tid(self, pid):
        return str(ok(cu.cuCheckpointProcessGetRestoreThreadId(int(pid))))

    def cmd_uuid(self, dev):
        return bytes(ok(cu.cuDeviceGetUuid(int(dev))).bytes).hex()

    def cmd_restore_map(self, pid, old, new):
        pair = cu.CUcheckpointGpuPair()
        pair.oldUuid = ok(cu.cuDeviceGetUuid(int(old)))
        pair.newUuid = ok(cu.cuDeviceGetUuid(int(new)))
        args = cu.CUcheckpointRestoreArgs()
        args.gpuPairs = [pair]
        args.gpuPairsCount = 1
        return name_of(cu.cuCheckpointProcessRestore(int(pid), args)[0])


def main() -> None:
    worker = Worker()
    print("ok ready", os.getpid(), flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        if words[0] == "exit":
            print("ok", flush=True)
            break
        try:
            out = getattr(worker, "cmd_" + words[0])(*words[1:])
            print("ok" if out is None else f"ok {out}", flush=True)
        except CudaError as e:
            print(f"err {e}", flush=True)


if __name__ == "__main__":
    main()
