"""A GPU workload to checkpoint: holds a pattern in GPU memory and checks it on request.

    python3 examples/hold_gpu_memory.py --mib 256 --ready-file /tmp/ready
    kill -USR1 <pid>     # re-reads the GPU memory and prints "verify ok" or "verify BAD"
    kill -TERM <pid>     # verifies once more and exits 0 if the contents are intact, 1 if not

It uses only cuda-python (cuda.bindings.driver), so it runs on the real driver and on the test suite's
fake one. Expected output: see examples/README.md.
"""
import argparse
import ctypes
import os
import signal
import sys
import time

from cuda.bindings import driver as cu


def ok(result, what):
    err, *values = result
    if err != cu.CUresult.CUDA_SUCCESS:
        sys.exit(f"hold_gpu_memory: {what}: {cu.cuGetErrorName(err)[1].decode()}")
    return values[0] if len(values) == 1 else values


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=256, help="GPU memory to hold (MiB)")
    ap.add_argument("--ready-file", help="written with the pid once the memory is filled")
    args = ap.parse_args()

    ok(cu.cuInit(0), "cuInit")
    ctx = ok(cu.cuDevicePrimaryCtxRetain(ok(cu.cuDeviceGet(0), "cuDeviceGet")), "cuDevicePrimaryCtxRetain")
    ok(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    words = args.mib * (1 << 20) // 4
    dptr = ok(cu.cuMemAlloc(words * 4), "cuMemAlloc")
    pattern = 0xC0FFEE00 | (os.getpid() & 0xFF)
    ok(cu.cuMemsetD32(dptr, pattern, words), "cuMemsetD32")
    ok(cu.cuCtxSynchronize(), "cuCtxSynchronize")

    def verify():
        host = (ctypes.c_uint32 * (1 << 20))()  # 4 MiB at a time
        for off in range(0, words, 1 << 20):
            n = min(1 << 20, words - off)
            ok(cu.cuMemcpyDtoH(host, int(dptr) + off * 4, n * 4), "cuMemcpyDtoH")
            if any(host[i] != pattern for i in range(0, n, 4097)) or host[n - 1] != pattern:
                return False
        return True

    state = {"stop": False, "check": False}
    signal.signal(signal.SIGUSR1, lambda *_: state.update(check=True))
    signal.signal(signal.SIGTERM, lambda *_: state.update(stop=True))
    print(f"holding {args.mib} MiB at {int(dptr):#x}, pattern {pattern:#010x}, pid {os.getpid()}", flush=True)
    if args.ready_file:
        with open(args.ready_file + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.rename(args.ready_file + ".tmp", args.ready_file)
    while not state["stop"]:
        time.sleep(0.05)
        if state["check"]:
            state["check"] = False
            print("verify ok" if verify() else "verify BAD", flush=True)
    good = verify()
    print("verify ok" if good else "verify BAD", flush=True)
    sys.exit(0 if good else 1)


if __name__ == "__main__":
    main()
