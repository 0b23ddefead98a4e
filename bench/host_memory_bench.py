#!/usr/bin/env python3
"""Whose host memory CRIU dumps: a workload's anonymous memory, mapping by mapping, before and
during a checkpoint, through the tool and through the driver alone.

    python3 bench/host_memory_bench.py                    # the torch pair, 2 GiB per process
    python3 bench/host_memory_bench.py --workload single --gib 4 --json OUT.json

Through CRIU the tool keeps GPU memory out of the image, and what CRIU still moves is the processes'
host memory: about 0.7 GiB per torch process on an H100, 1.5 GiB for the pair, whose dump bounds the
pair's hooked dump on a small-page tmpfs (bench/RESULTS.md). This bench says where that memory is: the anonymous
memory of each process (`Anonymous:` of /proc/PID/smaps: the pages CRIU dumps for private mappings),
per mapping, at these moments:

  tool running      the workload under the shim, ready
  tool suspended    after `criu-gpushare suspend`: its GPU memory in the store, the driver's
                    checkpoint done; what a CRIU dump through the tool would find
  tool resumed      after `criu-gpushare resume`
  driver running    a second copy of the workload, without the shim
  driver checkpointed  after the driver's lock + checkpoint alone (its GPU memory copied into the
                    process: what plain CRIU would find)

Per moment and process: the anonymous total, then the mappings that grew or shrank the most from
the moment before (start-end, permissions, what it maps). The driver copy is then killed (a pair's
importer cannot be restored by the driver alone). Timing is none of its business: one pass.
"""
import argparse
import json
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
import benchlib as bl  # noqa: E402

MIB = 1 << 20


def parse_smaps(text):
    """/proc/PID/smaps text -> [{"start", "end", "perms", "name", "anon"}] (anon: bytes of
    `Anonymous:`); name: the mapped path, a bracketed kernel name ("[heap]"), or "" (anonymous)."""
    maps, cur = [], None
    for line in text.splitlines():
        head = line.split(None, 5)
        if head and "-" in head[0] and ":" not in head[0]:
            start, end = (int(x, 16) for x in head[0].split("-"))
            cur = {"start": start, "end": end, "perms": head[1] if len(head) > 1 else "",
                   "name": head[5].strip() if len(head) > 5 else "", "anon": 0}
            maps.append(cur)
        elif cur is not None and line.startswith("Anonymous:"):
            cur["anon"] = int(line.split()[1]) * 1024
    return maps


def snapshot(pids):
    """{pid: parse_smaps(...)} of each live pid (a pid that has gone maps to [])."""
    out = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps") as f:
                out[pid] = parse_smaps(f.read())
        except OSError:
            out[pid] = []
    return out


def _label(m):
    return m["name"] or "anonymous"


def _anonymous(maps):
    return sum(m["anon"] for m in maps)


def changes(before, after, shown=5):
    """The mappings of one process whose anonymous bytes changed most from before to after:
    [(label, range, perms, before bytes, after bytes)], biggest change first. Mappings are matched
    by their start address; one that appeared or went counts from or to 0."""
    old = {m["start"]: m for m in before}
    new = {m["start"]: m for m in after}
    rows = []
    for start in set(old) | set(new):
        m = new.get(start) or old[start]
        a, b = old.get(start, {}).get("anon", 0), new.get(start, {}).get("anon", 0)
        if a != b:
            rows.append((_label(m), f"{m['start']:#x}-{m['end']:#x}", m["perms"], a, b))
    rows.sort(key=lambda r: -abs(r[4] - r[3]))
    return rows[:shown]


def report(moments, shown=5):
    """The table: per moment and process the anonymous total, and the changes since the moment
    before (moments: [(name, {pid: maps})], in order)."""
    lines, prev = [], None
    for name, snap in moments:
        for pid, maps in snap.items():
            total = _anonymous(maps)
            biggest = max(maps, key=lambda m: m["anon"], default=None)
            big = (f"; largest {_label(biggest)} {biggest['start']:#x} {biggest['anon'] / MIB:.1f} MiB"
                   if biggest else "")
            lines.append(f"{name:<22} pid {pid:<8} anonymous {total / MIB:9.1f} MiB{big}")
            if prev is not None and pid in prev:
                for label, span, perms, a, b in changes(prev[pid], maps, shown):
                    lines.append(f"    {(b - a) / MIB:+10.1f} MiB  {a / MIB:8.1f} -> {b / MIB:8.1f}  "
                                 f"{perms} {span} {label}")
        prev = snap
    return "\n".join(lines)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", choices=("pair", "single"), default="pair")
    ap.add_argument("--gib", type=float, default=2.0, help="GiB of GPU data per process (default 2)")
    ap.add_argument("--shared-gib", type=float, default=0.25, help="pair: GiB shared through CUDA IPC")
    ap.add_argument("--shown", type=int, default=5, help="changed mappings listed per process")
    ap.add_argument("--timeout", type=float, default=300, help="seconds for each command or call")
    ap.add_argument("--no-driver", action="store_true", help="skip the driver-alone copy")
    ap.add_argument("--json", help="also write every snapshot's totals and changes here")
    return ap.parse_args(argv)


def _spec(args):
    """(script, its arguments) of the workload asked for."""
    if args.workload == "pair":
        return "pair.py", ["--gib", args.gib, "--shared-gib", args.shared_gib]
    return "blocks.py", ["--gib", args.gib, "--block-mib", 1024]


def through_tool(args, spec, work, run_dir, env):
    """Snapshots of the workload under the shim: ready, suspended, resumed (contents checked)."""
    wl = bl.Workload("tool", *spec, work, run_dir).start(args.timeout)
    moments = [("tool running", snapshot(wl.pids))]
    try:
        row = bl.Row(wl.name, "tool", "tmpfs", wl.bytes)
        bl.tool_cycle(row, wl, ["suspend", *wl.pids, "--store", os.path.join(work, "store")],
                      ["resume", wl.pids[0]], env, args.timeout,
                      between=lambda: moments.append(("tool suspended", snapshot(wl.pids))))
        if row.status != "ok" or row.check != "ok":
            raise bl.WorkloadError(f"{row.status}, contents {row.check}")
        moments.append(("tool resumed", snapshot(wl.pids)))
    finally:
        wl.kill()
    return moments


def through_driver(args, spec, work, run_dir):
    """Snapshots of a copy without the shim: ready, then after the driver's lock + checkpoint."""
    wl = bl.Workload("driver", *spec, work, run_dir, shim=False).start(args.timeout)
    moments = [("driver running", snapshot(wl.pids))]
    try:
        row = bl.Row(wl.name, "driver", "-", wl.bytes)
        if not bl.driver_ops(bl.Driver(), row, wl, ("lock", "checkpoint"), row.out_phases, args.timeout):
            raise bl.WorkloadError(row.status)
        moments.append(("driver checkpointed", snapshot(wl.pids)))
    finally:
        wl.kill()  # SIGKILL: a checkpointed process dies of nothing else
    return moments


def _moment_json(name, snap):
    return {"moment": name, "pids": {str(pid): {"anonymous": _anonymous(maps),
                                                "mappings": [m for m in maps if m["anon"]]}
                                     for pid, maps in snap.items()}}


def main(argv=None):
    args = parse_args(argv)
    spec = _spec(args)
    work = tempfile.mkdtemp(prefix="criu-gpushare-hostmem.", dir="/dev/shm")
    run_dir = os.path.join(work, "run")
    os.mkdir(run_dir, 0o700)
    paths = [("tool", lambda: through_tool(args, spec, work, run_dir, bl.tool_env(run_dir)))]
    if args.no_driver:
        print("driver: skipped (--no-driver)")
    else:
        paths.append(("driver", lambda: through_driver(args, spec, work, run_dir)))
    moments, failed = [], []
    try:
        for name, run in paths:
            try:
                moments.append(run())
            except (bl.WorkloadError, RuntimeError) as e:  # RuntimeError: the driver would not start
                failed.append(f"{name}: {e}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"host memory of {spec[0]} {' '.join(map(str, spec[1]))}: anonymous memory per process "
          "(smaps `Anonymous:`), and the mappings that changed most since the moment before")
    for group in moments:
        print(report(group, args.shown))
    for f in failed:
        print(f"FAILED {f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"workload": [spec[0], *map(str, spec[1])], "failed": failed,
                       "moments": [_moment_json(n, snap) for group in moments for n, snap in group]},
                      f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
