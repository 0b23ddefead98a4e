"""GPU memory out and back: criu-gpushare's copy engine against the driver's own checkpoint path.

    python bench/copy_bench.py --gib 8 --store /dev/shm/copy-bench

One workload process holds --gib GiB of exportable GPU memory with distinct content per 64 MiB (no
dedup, no zero chunks). In the same run, on the same memory:
  - driver: cuCheckpointProcessLock + Checkpoint of the workload (GPU -> host memory the driver owns),
    then Restore + Unlock;
  - copy engine: the workload's exported fd imported into this process, saved to the chunk store
    (D2H through the pinned ring, xxh3-128 hashing threads, chunk files), then loaded back;
  - copy engine again (warm): the same memory saved a second time (every chunk already stored).
Prints a table (GB/s, 10^9 bytes/s) and the ratios against the driver path. Works on the fake
driver too (tiny sizes) for a smoke run: LD_LIBRARY_PATH=<fake dir> ... --gib 0.0625.
"""
import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

from criu_gpushare.gpu import checkpoint_api as ck
from criu_gpushare.gpu import driver as drv
from criu_gpushare.gpu.copy_engine import CopyEngine
from criu_gpushare.gpu.memory import ImportedAllocation, use_device
from criu_gpushare.store.store import Store

WORKLOAD = r"""
import os, socket, sys, time, ctypes
from cuda.bindings import driver as cu
def ok(r):
    assert r[0] == cu.CUresult.CUDA_SUCCESS, r
    return r[1] if len(r) == 2 else None
size, sock_path = int(sys.argv[1]), sys.argv[2]
ok(cu.cuInit(0)); ctx = ok(cu.cuDevicePrimaryCtxRetain(ok(cu.cuDeviceGet(0)))); ok(cu.cuCtxSetCurrent(ctx))
FD = cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
prop = cu.CUmemAllocationProp(); prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE; prop.location.id = 0
prop.requestedHandleTypes = FD
h = ok(cu.cuMemCreate(size, prop, 0)); p = ok(cu.cuMemAddressReserve(size, 0, 0, 0))
ok(cu.cuMemMap(p, size, 0, h, 0))
a = cu.CUmemAccessDesc(); a.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
a.location.id = 0; a.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
ok(cu.cuMemSetAccess(p, size, [a], 1))
chunk = min(64 << 20, size); rnd = os.urandom(chunk)
for off in range(0, size, chunk):
    ok(cu.cuMemcpyHtoD(int(p) + off, rnd, min(chunk, size - off)))
    ok(cu.cuMemsetD32(int(p) + off, off // chunk + 1, 1))   # distinct chunks
ok(cu.cuCtxSynchronize())
fd = ok(cu.cuMemExportToShareableHandle(h, FD, 0))
s = socket.socket(socket.AF_UNIX); s.bind(sock_path); s.listen(4)
print("ready", flush=True)
while True:
    c, _ = s.accept(); socket.send_fds(c, [b"x"], [fd]); c.close()
"""


def fetch_fd(path):
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(path)
        _, fds, _, _ = socket.recv_fds(s, 1, 1)
    return fds[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=8)
    ap.add_argument("--store", default="/dev/shm/criu-gpushare-copy-bench")
    ap.add_argument("--ring", type=int, default=16)
    ap.add_argument("--workers", type=int, default=16)
    args = ap.parse_args()
    size = int(args.gib * (1 << 30)) // (2 << 20) * (2 << 20)
    drv.driver()
    use_device(0)
    work = tempfile.mkdtemp()
    shutil.rmtree(args.store, ignore_errors=True)
    env = dict(os.environ, NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")
    wl = subprocess.Popen([sys.executable, "-c", WORKLOAD, str(size), f"{work}/sock"], stdout=subprocess.PIPE,
                          text=True, env=env)
    rows = []
    try:
        assert wl.stdout.readline().strip() == "ready", "workload did not start"
        # Driver path first, while the tool holds no import of the workload's memory.
        t = time.monotonic()
        ck.raise_first(ck.lock_all([wl.pid], 60000))
        ck.raise_first(ck.checkpoint_all([wl.pid]))
        out_s = time.monotonic() - t
        t = time.monotonic()
        ck.raise_first(ck.restore_all([wl.pid]))
        ck.raise_first(ck.unlock_all([wl.pid]))
        back_s = time.monotonic() - t
        rows.append(("driver checkpoint / restore", out_s, back_s))

        fd = fetch_fd(f"{work}/sock")
        with Store.open(args.store, create=True) as store, ImportedAllocation(fd, size, 0) as mem, \
                CopyEngine(store, ring_slots=args.ring, workers=args.workers) as engine:
            os.close(fd)
            engine.prepare(0)  # the pinned ring is allocated once per run, outside the timing
            alloc, cold = engine.save("bench", mem.ptr, size, 0)
            store.sync()
            loaded = engine.load(alloc, mem.ptr, 0)
            _, warm = engine.save("bench", mem.ptr, size, 0)
        rows.append(("copy engine, cold store", cold.seconds, loaded.seconds))
        rows.append(("copy engine, warm store (dedup)", warm.seconds, None))
    finally:
        wl.kill()
        wl.wait()
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(args.store, ignore_errors=True)

    gb = size / 1e9
    drv_out, drv_back = rows[0][1], rows[0][2]
    print(f"\n{size / (1 << 30):.2f} GiB of GPU memory, store {args.store}, ring {args.ring} x 64 MiB, "
          f"{args.workers} workers")
    print(f"{'path':34} {'out s':>8} {'out GB/s':>9} {'x driver':>9} {'back s':>8} {'back GB/s':>10} {'x driver':>9}")
    for name, o, b in rows:
        back = (f"{b:8.2f} {gb / b:10.2f} {drv_back / b:8.1f}x" if b else f"{'-':>8} {'-':>10} {'-':>9}")
        print(f"{name:34} {o:8.2f} {gb / o:9.2f} {drv_out / o:8.1f}x {back}")


if __name__ == "__main__":
    main()
