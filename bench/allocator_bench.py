#!/usr/bin/env python3
"""Suspend and resume of the same data under each GPU memory allocator, side by side in one run.

    python3 bench/allocator_bench.py                      # 8 GiB in 256 MiB tensors/arrays
    python3 bench/allocator_bench.py --gib 1 --json-out /tmp/alloc.json
    python3 bench/allocator_bench.py --self-test          # no GPU: table and JSON only

Allocators (each a fresh process under the shim, bench/workloads/):
  torch-default      torch's caching allocator (cudaMalloc)
  torch-expandable   PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (cuMemCreate + cuMemMap)
  torch-async        PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync (stream-ordered pools)
  cupy-default       CuPy's default MemoryPool
  cupy-async         cupy.cuda.MemoryAsyncPool (cudaMallocAsync)
For each: `criu-gpushare suspend PID --store S` + `resume PID` with an empty store, then again
(every chunk stored), each followed by a check of the contents (GPU digest): "ok" / "WRONG". The
"copied" column is the bytes the tool moved through its store: memory the shim does not back
(exportable pools, allocations below 2 MiB) goes through the driver's own checkpoint instead, which
shows as a slower suspend. "x dflt" =
torch-default's seconds / the row's (the goal: every allocator at the default one's speed). A
variant whose library is missing (no CuPy) is a row "not available".
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib as bl  # noqa: E402
from benchlib import Row  # noqa: E402

VARIANTS = {  # name: (script, extra args, environment, module it needs)
    "torch-default": ("blocks.py", [], {}, "torch"),
    "torch-expandable": ("blocks.py", [], {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}, "torch"),
    "torch-async": ("blocks.py", [], {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"}, "torch"),
    "cupy-default": ("cupy_blocks.py", ["--pool", "default"], {}, "cupy"),
    "cupy-async": ("cupy_blocks.py", ["--pool", "async"], {}, "cupy"),
}


def format_table(rows, title=""):
    base = {r.path: r for r in rows if r.workload == "torch-default"}
    head = (f"{'allocator':<17} {'run':<10} {'GiB':>6} {'copied':>7} {'susp s':>7} {'GB/s':>6} {'x dflt':>6} "
            f"{'resume s':>8} {'GB/s':>6} {'x dflt':>6} {'check':<6} status")
    lines = [title] if title else []
    lines += [head, "-" * len(head)]
    for r in rows:
        b = base.get(r.path)
        xo = b.out_s / r.out_s if b and b.out_s and r.out_s else None
        xb = b.back_s / r.back_s if b and b.back_s and r.back_s else None
        copied = (r.extra.get("out_bytes") or {}).get("copied")
        lines.append(
            f"{r.workload:<17} {r.path:<10} {r.bytes / bl.GIB:>6.2f} "
            f"{bl._num(copied / bl.GIB if copied is not None else None, '7.2f'):>7} "
            f"{bl._num(r.out_s, '7.2f'):>7} {bl._num(r.gbps(r.out_s), '6.2f'):>6} "
            f"{bl._num(xo, '5.2f') + ('x' if xo else ''):>6} {bl._num(r.back_s, '8.2f'):>8} "
            f"{bl._num(r.gbps(r.back_s), '6.2f'):>6} {bl._num(xb, '5.2f') + ('x' if xb else ''):>6} "
            f"{r.check:<6} {r.status}")
    lines.append("")
    lines.append("phases (s; suspend | resume, as the tool's --json reports them):")
    for r in rows:
        if r.out_phases or r.back_phases:
            lines.append(f"  {r.workload}/{r.path}: {bl._phases(r.out_phases)} | {bl._phases(r.back_phases)}"
                         f"  (wall {bl._num(r.out_wall_s, '.2f')} | {bl._num(r.back_wall_s, '.2f')})")
    lines.append("run tool = empty store, tool-warm = every chunk already stored; copied = GiB the tool "
                 "moved; x dflt = torch-default's seconds / this row's")
    return "\n".join(lines)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gib", type=float, default=8.0)
    ap.add_argument("--block-mib", type=int, default=256)
    ap.add_argument("--only", action="append", choices=list(VARIANTS))
    ap.add_argument("--store-dir", default="/dev/shm", help="where the stores go (default tmpfs)")
    ap.add_argument("--json-out")
    ap.add_argument("--call-timeout", type=float, default=600)
    ap.add_argument("--start-timeout", type=float, default=600)
    ap.add_argument("--self-test", action="store_true")
    return ap.parse_args(argv)


def self_test(args):
    n = int(args.gib * bl.GIB)
    rows = [Row("torch-default", "tool", "tmpfs", n, out_s=2.0, back_s=1.0, check="ok",
                extra={"out_bytes": {"copied": n}}),
            Row("torch-async", "tool", "tmpfs", n, out_s=8.0, back_s=3.0, check="ok",
                extra={"out_bytes": {"copied": 0}}),
            Row("cupy-async", "tool", "tmpfs", n, status="not available: no module cupy")]
    text = format_table(rows, "self-test (made-up figures)")
    print(text)
    assert "0.25x" in text, "torch-async at a quarter of the default's speed"
    doc = bl.write_json(args.json_out, {"self_test": True}, rows)
    assert len(doc["rows"]) == 3
    print("self-test: ok")
    return 0


def main(argv=None):
    args = parse_args(argv)
    if args.self_test:
        return self_test(args)
    bl.sigterm_as_interrupt()
    names = args.only or list(VARIANTS)
    work = tempfile.mkdtemp(prefix="criu-gpushare-alloc-bench.", dir=args.store_dir)
    run_dir = os.path.join(work, "run")
    os.mkdir(run_dir, 0o700)
    env = bl.tool_env(run_dir)
    rows, t0 = [], time.monotonic()

    def log(msg):
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)

    try:
        for name in names:
            script, extra, wenv, module = VARIANTS[name]
            if importlib.util.find_spec(module) is None:
                rows.append(Row(name, "tool", "tmpfs", 0, status=f"not available: no module {module}"))
                continue
            wl = bl.Workload(name, script, ["--gib", args.gib, "--block-mib", args.block_mib, *extra],
                             work, run_dir, env_extra=wenv)
            try:
                wl.start(args.start_timeout)
                log(f"{name}: ready, pid {wl.pids}, {wl.bytes / bl.GIB:.2f} GiB")
                store = os.path.join(work, f"store-{name}")
                for path in ("tool", "tool-warm"):
                    row = Row(name, path, "tmpfs", wl.bytes)
                    ok = bl.tool_cycle(row, wl, ["suspend", *wl.pids, "--store", store],
                                       ["resume", wl.pids[0]], env, args.call_timeout)
                    rows.append(row)
                    log(f"{name}/{path}: suspend {row.out_s} s, resume {row.back_s} s, check {row.check}, "
                        f"{row.status}")
                    if not ok:
                        break
                shutil.rmtree(store, ignore_errors=True)
            except bl.WorkloadError as e:
                rows.append(Row(name, "-", "tmpfs", wl.bytes if wl.info else 0, status=f"error: {e}"[:300]))
            finally:
                wl.kill()
    except KeyboardInterrupt:
        log("interrupted")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    title = (f"allocators: {args.gib:g} GiB in {args.block_mib} MiB blocks, store on {args.store_dir}, "
             f"{time.monotonic() - t0:.0f} s in all")
    print()
    print(format_table(rows, title))
    bl.write_json(args.json_out, {"gib": args.gib, "block_mib": args.block_mib, "versions": bl.versions(),
                                  "variants": {n: VARIANTS[n][2] for n in names}}, rows)
    return 1 if any(r.check.startswith("WRONG") or r.status.startswith("error") for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
