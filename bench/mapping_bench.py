"""What opening and closing many small allocations costs the tool, and the ways it could cost less.

    python3 bench/mapping_bench.py                        # 2000 x 4 MiB on GPU 0 (~1 min)
    python3 bench/mapping_bench.py --count 500 --mib 64 --threads 1,4,16

Needs a GPU (or the tests' fake driver). A save or a load reaches each of a workload's allocations
by importing the fd its shim exported, then reserving address space, mapping and setting access
(memory.ImportedAllocation), and leaves it by unmapping, freeing the address space and releasing.
With thousands of small allocations that, not the bytes, bounds the tool: checkpoint_bench's
`many` row (bench/RESULTS.md, "thirteenth"). This bench makes --count exportable allocations of
--mib in one process, exports each as an fd once, and then opens and closes all of them each way:

  one at a time                 as the tool does now (ImportedAllocation, in order)
  N threads                     the same calls on N threads (does the driver run them in parallel?)
  one reservation per group     address space reserved once for --group allocations side by side,
                                each imported and mapped into it, access set once over the group
                                (2 driver calls per allocation in instead of 4, 2 out instead of 3)

Each way's mappings are checked: every allocation's first bytes, written through the owner's own
mapping, read back through the tool's ("ok" / "WRONG"). Prints a table: seconds to open and to
close all, microseconds per allocation, and each way against one at a time.
"""
import argparse
import concurrent.futures
import contextlib
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from criu_gpushare.gpu import driver as drv, memory  # noqa: E402

import exportable  # noqa: E402

DEVICE = 0


class Owner:
    """The workload's side: `count` allocations of `size`, each mapped here with its first 4 bytes
    set to a value of its own, and exported as an fd once."""

    def __init__(self, count, size):
        cu = drv.driver()
        self.size, self.handles, self.ptrs, self.fds = size, [], [], []
        for i in range(count):
            handle, ptr = exportable.allocation(size, DEVICE)
            self.handles.append(handle)
            self.ptrs.append(ptr)
            drv.check(cu.cuMemsetD32(ptr, self.mark(i), 1), "mark")
            self.fds.append(exportable.export(handle))
        drv.check(cu.cuCtxSynchronize(), "mark")

    @staticmethod
    def mark(i):
        return (i * 2654435761 + 1) & 0xFFFFFFFF

    def close(self):
        cu = drv.driver()
        for fd in self.fds:
            os.close(fd)
        for ptr, handle in zip(self.ptrs, self.handles):
            cu.cuMemUnmap(ptr, self.size)
            cu.cuMemAddressFree(ptr, self.size)
            cu.cuMemRelease(handle)


def check(ptrs):
    """'ok' when every pointer reads its allocation's mark, else 'WRONG (first bad index)'."""
    cu = drv.driver()
    memory.use_device(DEVICE)
    buf = bytearray(4)
    for i, ptr in enumerate(ptrs):
        drv.check(cu.cuMemcpyDtoH(buf, int(ptr), 4), "read back")
        if int.from_bytes(buf, "little") != Owner.mark(i):
            return f"WRONG ({i})"
    return "ok"


def one_at_a_time(owner, _):
    t = time.monotonic()
    mems = [memory.ImportedAllocation(fd, owner.size, DEVICE) for fd in owner.fds]
    opened = time.monotonic() - t
    verdict = check([m.ptr for m in mems])
    t = time.monotonic()
    for m in mems:
        m.close()
    return opened, time.monotonic() - t, verdict


def on_threads(owner, threads):
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        t = time.monotonic()
        mems = list(pool.map(lambda fd: memory.ImportedAllocation(fd, owner.size, DEVICE), owner.fds))
        opened = time.monotonic() - t
        verdict = check([m.ptr for m in mems])
        t = time.monotonic()
        list(pool.map(lambda m: m.close(), mems))
        return opened, time.monotonic() - t, verdict


def grouped(owner, group):
    """Address space reserved once per group, access set once over it."""
    cu = drv.driver()
    memory.use_device(DEVICE)
    size, groups, ptrs = owner.size, [], []
    t = time.monotonic()
    for g in range(0, len(owner.fds), group):
        fds = owner.fds[g:g + group]
        base = int(drv.check(cu.cuMemAddressReserve(size * len(fds), 0, 0, 0), "reserve a group"))
        handles = []
        for k, fd in enumerate(fds):
            handles.append(drv.check(cu.cuMemImportFromShareableHandle(fd, memory.fd_handle_type()), "import"))
            drv.check(cu.cuMemMap(base + k * size, size, 0, handles[-1], 0), "map into the group")
            ptrs.append(base + k * size)
        memory.set_read_write(base, size * len(fds), DEVICE)
        groups.append((base, handles))
    opened = time.monotonic() - t
    verdict = check(ptrs)
    t = time.monotonic()
    for base, handles in groups:
        for k, handle in enumerate(handles):
            drv.check(cu.cuMemUnmap(base + k * size, size), "unmap")
            drv.check(cu.cuMemRelease(handle), "release")
        drv.check(cu.cuMemAddressFree(base, size * len(handles)), "free a group")
    return opened, time.monotonic() - t, verdict


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=2000, help="allocations (default 2000)")
    ap.add_argument("--mib", type=int, default=4, help="MiB each, a multiple of 2 (default 4)")
    ap.add_argument("--threads", default="4,16", help="thread counts for the threaded rows (default 4,16)")
    ap.add_argument("--group", type=int, default=64, help="allocations per reservation (default 64)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per way, the fastest shown (default 3)")
    args = ap.parse_args()
    memory.use_device(DEVICE)
    t = time.monotonic()
    owner = Owner(args.count, args.mib << 20)
    print(f"{args.count} allocations of {args.mib} MiB made and exported in {time.monotonic() - t:.2f} s",
          flush=True)
    ways = [("one at a time (the tool now)", one_at_a_time, None)]
    ways += [(f"{n} threads", on_threads, n) for n in (int(x) for x in args.threads.split(","))]
    ways += [(f"one reservation per {args.group}", grouped, args.group)]
    rows = []
    with contextlib.ExitStack() as stack:
        stack.callback(owner.close)
        for name, way, arg in ways:
            runs = []
            for _ in range(max(1, args.repeat)):
                try:
                    runs.append(way(owner, arg))
                except drv.DriverError as e:  # a way this driver refuses: its error, the others go on
                    runs = [(None, None, f"failed: {e}")]
                    break
            best = min(runs, key=lambda r: (r[0] or 0) + (r[1] or 0))
            verdict = next((r[2] for r in runs if r[2] != "ok"), "ok")
            rows.append((name, *best[:2], verdict))
            print(f"  {name}: " + (f"open {best[0]:.3f} s, close {best[1]:.3f} s, " if best[0] is not None
                                   else "") + verdict, flush=True)
    base = rows[0][1] + rows[0][2] if rows[0][1] is not None else None
    head = f"{'way':<32} {'open s':>7} {'close s':>8} {'us/alloc':>9} {'x now':>6}  check"
    print(f"\n{args.count} x {args.mib} MiB, best of {args.repeat}\n{head}\n{'-' * len(head)}")
    for name, opened, closed, verdict in rows:
        if opened is None:
            print(f"{name:<32} {'-':>7} {'-':>8} {'-':>9} {'-':>6}  {verdict}")
            continue
        both = opened + closed
        ratio = f"{base / both:5.1f}x" if base and both else f"{'-':>6}"  # against a failed way: none
        print(f"{name:<32} {opened:7.3f} {closed:8.3f} {1e6 * both / args.count:9.0f} {ratio}  {verdict}")
    return 0 if all(r[3] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
