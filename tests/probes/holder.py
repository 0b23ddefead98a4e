"""A single CUDA process holding filled GPU memory: the target of driver checkpoint probes.

    holder.py --dir D --name NAME --size-mib N [--seed S]

Allocates N MiB with cuMemAlloc on device 0, fills it with the probe pattern, announces
`NAME.ready` {pid, va}, then answers `verify` requests ({data_ok, bad_offset, secs}) until `D/stop`.
It keeps no file open in D, so CRIU can dump and restore it.
"""
import argparse
import os
import time

from cuda.bindings import driver as cu

import probelib as pl


def hold(args, rv):
    pl.init_context()
    size = args.size_mib * pl.MiB
    va = int(pl.check(cu.cuMemAlloc(size), "cuMemAlloc"))
    pl.fill(va, size, args.seed)

    def verify(_request):
        start = time.monotonic()
        ok, bad = pl.verify(va, size, args.seed)
        return {"data_ok": ok, "bad_offset": bad, "secs": round(time.monotonic() - start, 3)}

    rv.announce(f"{args.name}.ready", {"pid": os.getpid(), "va": va})
    rv.serve({"verify": verify})


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", required=True)
    parser.add_argument("--name", default="holder")
    parser.add_argument("--size-mib", type=int, required=True)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rv = pl.Rendezvous(args.dir, args.name)
    pl.run_role(rv, lambda: hold(args, rv))


if __name__ == "__main__":
    main()
