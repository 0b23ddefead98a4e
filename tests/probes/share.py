"""Two processes sharing GPU memory, the way the product's users share it.

    share.py exporter --kind ipc|fd --dir D --size-mib N [--seed S]
    share.py importer --kind ipc|fd --dir D --size-mib N [--seed S]

exporter: allocates N MiB on device 0 and fills it with the probe pattern (probelib.fill).
  ipc: cuMemAlloc + cuIpcGetMemHandle; the handle goes to `exporter.ready`.
  fd:  cuMemCreate (POSIX-fd exportable), mapped, exported with cuMemExportToShareableHandle; the
       exported fd stays open and is sent over `D/exporter.sock` (SCM_RIGHTS) to every client.
  Announces `exporter.ready` {pid, va, fd, fd_target}; answers `verify`.
importer: maps the exporter's memory (cuIpcOpenMemHandle, or the received fd imported and mapped at
  a fresh reservation) and checks the pattern. Announces `importer.ready` {pid, va, data_ok}.
  Requests (fd kind): `release` unmaps and releases the import, keeping the VA reserved;
  `reimport` fetches a fresh fd, maps it at the SAME VA and checks the pattern.
Both idle until the test creates `D/stop`.
"""
import argparse
import os

from cuda.bindings import driver as cu

import probelib as pl


def exporter(args, rv):
    pl.init_context()
    size = args.size_mib * pl.MiB
    reply = {"pid": os.getpid()}
    if args.kind == "ipc":
        va = int(pl.check(cu.cuMemAlloc(size), "cuMemAlloc"))
        pl.fill(va, size, args.seed)
        handle = pl.check(cu.cuIpcGetMemHandle(va), "cuIpcGetMemHandle")
        reply["ipc_handle"] = pl.ipc_handle_bytes(handle).hex()
    else:
        handle = pl.create_exportable(size)
        va = pl.map_handle(handle, size)
        pl.fill(va, size, args.seed)
        fd = pl.check(cu.cuMemExportToShareableHandle(handle, pl.FD_HANDLE, 0),
                      "cuMemExportToShareableHandle")
        pl.serve_fd_forever(rv.path("exporter.sock"), fd)
        reply.update(fd=fd, fd_target=pl.fd_target("self", fd))
    reply["va"] = va

    def verify(_request):
        ok, bad = pl.verify(va, size, args.seed)
        return {"data_ok": ok, "bad_offset": bad}

    rv.announce("exporter.ready", reply)
    rv.serve({"verify": verify})


def importer(args, rv):
    pl.init_context()
    size = args.size_mib * pl.MiB
    ready = rv.wait("exporter.ready")
    if args.kind == "ipc":
        handle = pl.ipc_handle_from_bytes(bytes.fromhex(ready["ipc_handle"]))
        flags = cu.CUipcMem_flags.CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
        va = int(pl.check(cu.cuIpcOpenMemHandle(handle, flags), "cuIpcOpenMemHandle"))
        mapped = {"handle": None}
    else:
        mapped = {"handle": import_fd(rv)}
        va = pl.map_handle(mapped["handle"], size)
    ok, bad = pl.verify(va, size, args.seed)

    def release(_request):
        if args.kind != "fd":
            raise pl.ProbeFailure("importer: release/reimport is probed for --kind fd only")
        pl.check(cu.cuCtxSynchronize(), "cuCtxSynchronize")
        pl.check(cu.cuMemUnmap(va, size), "cuMemUnmap")
        pl.check(cu.cuMemRelease(mapped["handle"]), "cuMemRelease")
        mapped["handle"] = None
        return {"va": va}

    def reimport(_request):
        mapped["handle"] = import_fd(rv)
        pl.map_handle(mapped["handle"], size, va=va)  # the reservation kept by `release`
        data_ok, bad_offset = pl.verify(va, size, args.seed)
        return {"va": va, "data_ok": data_ok, "bad_offset": bad_offset}

    rv.announce("importer.ready", {"pid": os.getpid(), "va": va, "data_ok": ok, "bad_offset": bad})
    rv.serve({"release": release, "reimport": reimport})


def import_fd(rv):
    fd = pl.fetch_fd(rv.path("exporter.sock"))
    try:
        return pl.check(cu.cuMemImportFromShareableHandle(fd, pl.FD_HANDLE),
                        "cuMemImportFromShareableHandle")
    finally:
        os.close(fd)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("role", choices=["exporter", "importer"])
    parser.add_argument("--kind", choices=["ipc", "fd"], required=True)
    parser.add_argument("--dir", required=True)
    parser.add_argument("--size-mib", type=int, required=True)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rv = pl.Rendezvous(args.dir, args.role)
    role = exporter if args.role == "exporter" else importer
    pl.run_role(rv, lambda: role(args, rv))


if __name__ == "__main__":
    main()
