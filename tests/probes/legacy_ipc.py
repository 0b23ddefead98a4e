"""Legacy CUDA IPC of memory the driver checkpoints itself (a small cuMemAlloc), and the context
its queries need: the driver facts behind the shim's lazy IPC handles (shim/protocol.md, ipcget).

    legacy_ipc.py exporter --dir D --bytes N [--seed S] [--lazy]
    legacy_ipc.py importer --handle HEX --bytes N --seed S --write W    (one-shot)

exporter: cuMemAlloc of N bytes on device 0, filled with the probe pattern (probelib.fill), and a
  legacy IPC handle of it taken at once ("before"; with --lazy none is taken before the restore, as
  the shim's lazy handles do, and "before" is null). Announces `exporter.ready`
  {pid, va, before, queries}. Request `again` (after the test checkpointed and restored it):
  {data_ok, after: a handle taken now, same_bytes: after == before, queries}. Request `verify`
  {seed}: {data_ok} against that seed's pattern.
  queries: what a thread with no current context gets (cuMemGetAddressRange; the pointer's
  CU_POINTER_ATTRIBUTE_CONTEXT and IS_LEGACY_CUDA_IPC_CAPABLE), the range it gets with that
  context pushed, and the range the main thread (context current) gets.
importer: opens HEX (cuIpcOpenMemHandle) and prints `PROBE ipc_open result=... data_ok=...`;
  when it opened, checks the pattern of --seed, fills the memory with the pattern of --write and
  closes the handle. Exits 0 whatever the driver answered (the answer is the fact).
"""
import argparse
import os
import threading

from cuda.bindings import driver as cu

import probelib as pl

ATTR = cu.CUpointer_attribute


def address_range(va):
    """[base, size] of the allocation holding va, or the error name."""
    r = cu.cuMemGetAddressRange(va)
    return [int(r[1]), int(r[2])] if r[0] == cu.CUresult.CUDA_SUCCESS else pl.result_name(r)


def queries(va):
    seen = {"main_range": address_range(va)}

    def bare():  # a new thread: no context is current on it
        seen["bare_range"] = address_range(va)
        capable = cu.cuPointerGetAttribute(ATTR.CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, va)
        seen["bare_ipc_capable"] = (bool(capable[1]) if capable[0] == cu.CUresult.CUDA_SUCCESS
                                    else pl.result_name(capable))
        owner = cu.cuPointerGetAttribute(ATTR.CU_POINTER_ATTRIBUTE_CONTEXT, va)
        seen["bare_context"] = pl.result_name(owner)
        if owner[0] == cu.CUresult.CUDA_SUCCESS:
            pushed = cu.cuCtxPushCurrent(owner[1])[0]
            seen["pushed_range"] = address_range(va) if pushed == cu.CUresult.CUDA_SUCCESS \
                else pl.result_name(pushed)
            cu.cuCtxPopCurrent()

    thread = threading.Thread(target=bare)
    thread.start()
    thread.join()
    return seen


def exporter(args, rv):
    pl.init_context()
    va = int(pl.check(cu.cuMemAlloc(args.bytes), "cuMemAlloc"))
    pl.fill(va, args.bytes, args.seed)
    before = None if args.lazy else pl.ipc_handle_bytes(
        pl.check(cu.cuIpcGetMemHandle(va), "cuIpcGetMemHandle"))

    def again(_request):
        data_ok, _ = pl.verify(va, args.bytes, args.seed)
        after = pl.ipc_handle_bytes(pl.check(cu.cuIpcGetMemHandle(va), "cuIpcGetMemHandle"))
        return {"data_ok": data_ok, "after": after.hex(), "same_bytes": after == before,
                "queries": queries(va)}

    def verify(request):
        return {"data_ok": pl.verify(va, args.bytes, int(request["seed"]))[0]}

    rv.announce("exporter.ready", {"pid": os.getpid(), "va": va,
                                   "before": before.hex() if before else None,
                                   "queries": queries(va)})
    rv.serve({"again": again, "verify": verify})


def importer(args):
    pl.init_context()
    handle = pl.ipc_handle_from_bytes(bytes.fromhex(args.handle))
    r = cu.cuIpcOpenMemHandle(handle, cu.CUipcMem_flags.CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)
    data_ok = None
    if r[0] == cu.CUresult.CUDA_SUCCESS:
        va = int(r[1])
        data_ok, _ = pl.verify(va, args.bytes, args.seed)
        pl.fill(va, args.bytes, args.write)
        pl.check(cu.cuIpcCloseMemHandle(va), "cuIpcCloseMemHandle")
    pl.probe_line("ipc_open", result=pl.result_name(r), data_ok=data_ok)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("role", choices=["exporter", "importer"])
    parser.add_argument("--dir")
    parser.add_argument("--bytes", type=int, required=True)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--handle")
    parser.add_argument("--write", type=int, default=2)
    parser.add_argument("--lazy", action="store_true",
                        help="exporter: take no handle before the restore (the shim's lazy handles)")
    args = parser.parse_args()
    if args.role == "importer":
        pl.run_role(pl.Rendezvous(os.getcwd(), "importer"), lambda: importer(args))
        return
    rv = pl.Rendezvous(args.dir, args.role)
    pl.run_role(rv, lambda: exporter(args, rv))


if __name__ == "__main__":
    main()
