"""What the shim costs: launch-bound and copy-bound cuda-python loops, with and without the shim
preloaded, in one run.

    python bench/shim_bench.py [--launches N] [--copies N] [--copy-mib M] [--repeat R] [--shim PATH]

Each measurement runs in a fresh process (the shim only takes effect when preloaded); runs with and
without the shim alternate, R times each, and the table shows the medians and their ratio. Loops:
  launch  N launches of an empty kernel on one stream, then a synchronize (per-launch cost)
  copy    N round trips of an M MiB buffer, pinned host <-> device, async on one stream (bandwidth)
  small   N 4 KiB host-to-device async copies (per-copy-call cost)
  launch-c  the launch loop in C (bench/launch_loop.c, built here with gcc): no Python in the loop,
          so the figure is the CPU cost of a launch itself, which is all the shim can add to
The kernel is PTX on a real GPU, or the fake driver's when libcuda.so.1 is the test double
(LD_LIBRARY_PATH=<tests/fakecuda build dir>). NVLink multicast stays off in every child.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import time

NO_MULTICAST_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                    "NVSHMEM_DISABLE_NVLS": "1"}

# An empty kernel with the fake driver's name and signature, for real GPUs.
PTX = b"""
.version 7.0
.target sm_70
.address_size 64
.visible .entry sleep_us(.param .u64 us)
{
    ret;
}
\0"""


def child(args):
    from cuda.bindings import driver as cu

    def ok(res):
        if res[0] != cu.CUresult.CUDA_SUCCESS:
            raise SystemExit(f"CUDA error {cu.cuGetErrorName(res[0])[1].decode()}")
        rest = res[1:]
        return rest[0] if len(rest) == 1 else rest

    ok(cu.cuInit(0))
    ctx = ok(cu.cuDevicePrimaryCtxRetain(ok(cu.cuDeviceGet(0))))
    ok(cu.cuCtxSetCurrent(ctx))
    stream = ok(cu.cuStreamCreate(0))
    result = {}
    if args.child == "launch":
        mod = None
        for image in (PTX, b"fakecuda"):
            err, m = cu.cuModuleLoadData(image)
            if err == cu.CUresult.CUDA_SUCCESS:
                mod = m
                break
        if mod is None:
            raise SystemExit("cannot load a kernel module (PTX or the fake driver's)")
        fn = ok(cu.cuModuleGetFunction(mod, b"sleep_us"))
        params = ((0,), (ctypes.c_uint64,))
        for _ in range(min(1000, args.launches)):  # warm up
            ok(cu.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, stream, params, 0))
        ok(cu.cuStreamSynchronize(stream))
        t0 = time.perf_counter()
        for _ in range(args.launches):
            cu.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, stream, params, 0)
        ok(cu.cuStreamSynchronize(stream))
        result["seconds"] = time.perf_counter() - t0
        result["rate"] = args.launches / result["seconds"]  # launches/s
    else:
        size = args.copy_mib << 20 if args.child == "copy" else 4096
        n = args.copies if args.child == "copy" else args.small
        host = ok(cu.cuMemHostAlloc(size, 0))
        dev = ok(cu.cuMemAlloc(size))
        ok(cu.cuMemsetD8(dev, 1, size))
        for _ in range(3):  # warm up
            ok(cu.cuMemcpyHtoDAsync(dev, host, size, stream))
        ok(cu.cuStreamSynchronize(stream))
        t0 = time.perf_counter()
        if args.child == "copy":
            for _ in range(n):
                cu.cuMemcpyHtoDAsync(dev, host, size, stream)
                cu.cuMemcpyDtoHAsync(host, dev, size, stream)
            moved = 2 * n * size
        else:
            for _ in range(n):
                cu.cuMemcpyHtoDAsync(dev, host, size, stream)
            moved = n * size
        ok(cu.cuStreamSynchronize(stream))
        result["seconds"] = time.perf_counter() - t0
        result["rate"] = moved / result["seconds"] / 1e9 if args.child == "copy" else n / result["seconds"]
        ok(cu.cuMemFree(dev))
        ok(cu.cuMemFreeHost(host))
    print(json.dumps(result))


def build_launch_loop(workdir):
    """Compile bench/launch_loop.c and write the kernel image it loads; (binary, image)."""
    here = os.path.dirname(os.path.abspath(__file__))
    include = next((d for d in (os.path.join(os.environ.get("CUDA_HOME", "/nonexistent"), "include"),
                                "/usr/local/cuda/include") if os.path.isfile(os.path.join(d, "cuda.h"))), None)
    if include is None:
        raise SystemExit("launch-c needs cuda.h (set CUDA_HOME)")
    exe = os.path.join(workdir, "launch_loop")
    subprocess.run(["gcc", "-O2", "-I", include, "-o", exe, os.path.join(here, "launch_loop.c"), "-ldl"],
                   check=True)
    image = os.path.join(workdir, "kernel.img")
    fake = "fakecuda" in os.environ.get("LD_LIBRARY_PATH", "")
    with open(image, "wb") as f:
        f.write(b"fakecuda" if fake else PTX)
    return exe, image


def run_child(kind, args, preload):
    env = dict(os.environ, **NO_MULTICAST_ENV)
    rest = [p for p in env.get("LD_PRELOAD", "").split() if "criu_gpushare" not in p]
    env["LD_PRELOAD"] = " ".join(([preload] if preload else []) + rest)
    if kind == "launch-c":
        cmd = [*args.launch_loop, str(args.launches * 5)]
    else:
        cmd = [sys.executable, os.path.abspath(__file__), "--child", kind,
               "--launches", str(args.launches), "--copies", str(args.copies),
               "--copy-mib", str(args.copy_mib), "--small", str(args.small)]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if res.returncode:
        raise SystemExit(f"{kind} ({'shim' if preload else 'plain'}) failed: {res.stderr.strip()}")
    return json.loads(res.stdout.strip().splitlines()[-1])["rate"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--launches", type=int, default=200000)
    ap.add_argument("--copies", type=int, default=50, help="round trips of --copy-mib")
    ap.add_argument("--copy-mib", type=int, default=64)
    ap.add_argument("--small", type=int, default=100000, help="4 KiB copies")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--only", choices=("launch", "launch-c", "copy", "small"), action="append")
    ap.add_argument("--shim", help="shim library (default: the one in the criu_gpushare package)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    shim = args.shim
    if not shim:
        from criu_gpushare.shimctl.shimlib import shim_path
        shim = shim_path()
    kinds = args.only or ["launch", "launch-c", "copy", "small"]
    units = {"launch": "launches/s", "launch-c": "launches/s", "copy": "GB/s", "small": "copies/s"}
    if "launch-c" in kinds:
        import tempfile
        args.launch_loop = build_launch_loop(tempfile.mkdtemp())
    print(f"shim: {shim}\nrepeat: {args.repeat} (alternating), medians\n")
    print(f"{'loop':<8} {'unit':<11} {'without':>12} {'with shim':>12} {'ratio':>7}  spread")
    for kind in kinds:
        plain, shimmed = [], []
        for _ in range(args.repeat):
            plain.append(run_child(kind, args, None))
            shimmed.append(run_child(kind, args, shim))
        p, s = statistics.median(plain), statistics.median(shimmed)
        spread = (max(plain) - min(plain)) / p * 100
        print(f"{kind:<8} {units[kind]:<11} {p:>12.4g} {s:>12.4g} {s / p:>7.3f}  +-{spread:.1f}% run to run")
    print("\nratio = with shim / without (1.000 = no cost; below 1 = slower with the shim)")


if __name__ == "__main__":
    main()
