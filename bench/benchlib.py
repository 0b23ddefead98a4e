"""What checkpoint_bench.py and allocator_bench.py share: workloads, the tool, the driver-only path,
the disk's own rate, the table and the JSON.

Nothing here imports torch or loads the driver at import time; the GPU parts (Driver, the
workloads) only run on a GPU machine, the rest (rows, table, JSON, finding the tool's commands) is
tested on CPU machines by tests/cli/test_bench.py.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import json
import mmap
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
WORKLOADS = os.path.join(HERE, "workloads")
NO_MULTICAST_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                    "NVSHMEM_DISABLE_NVLS": "1"}
GIB = 1 << 30

if os.path.join(REPO, "tests") not in sys.path:  # the process helpers the tests use too
    sys.path.insert(0, os.path.join(REPO, "tests"))
from procs import become_subreaper, reap_children  # noqa: E402,F401  (become_subreaper: bl.*)
from procs import semaphores_unlinked  # noqa: E402


# ----------------------------------------------------------------------------------------- rows

@dataclass
class Row:
    """One measured path on one workload: out (suspend, checkpoint, dump) and back."""
    workload: str
    path: str                 # tool | tool-warm | driver | drv+criu | criu | criu-warm | criu-cold | criu-hook
    store: str                # tmpfs | disk | - (driver: host memory)
    bytes: int                # the workload's GPU data bytes (the GB/s denominator)
    out_s: float | None = None
    back_s: float | None = None
    status: str = "ok"        # ok | fails: ... | not available: ... | error: ...
    check: str = "-"          # ok | WRONG | - (not checked)
    out_phases: dict = field(default_factory=dict)
    back_phases: dict = field(default_factory=dict)
    out_wall_s: float | None = None   # the command's own wall time (tool start-up included)
    back_wall_s: float | None = None
    extra: dict = field(default_factory=dict)

    def gbps(self, secs):
        return self.bytes / 1e9 / secs if secs and self.bytes else None


def ratios(rows):
    """{(workload, path, store): (out, back)}: driver seconds / this path's seconds (>1: faster)."""
    drivers = {r.workload: r for r in rows if r.path == "driver"}
    out = {}
    for r in rows:
        d = drivers.get(r.workload)
        out[(r.workload, r.path, r.store)] = tuple(
            theirs / mine if mine and theirs else None
            for mine, theirs in ((r.out_s, d and d.out_s), (r.back_s, d and d.back_s)))
    return out


def _num(v, fmt):
    return format(v, fmt) if v is not None else "-"


def _phases(phases):
    return " ".join(f"{k} {v:.2f}" for k, v in phases.items()) or "-"


def format_table(rows, title=""):
    """The table: one line per row, then the phases of each row (seconds)."""
    rat = ratios(rows)
    head = (f"{'workload':<10} {'path':<10} {'store':<6} {'GiB':>6} {'out s':>8} {'out GB/s':>8} "
            f"{'x drv':>6} {'back s':>8} {'back GB/s':>9} {'x drv':>6} {'check':<6} status")
    lines = [title] if title else []
    lines += [head, "-" * len(head)]
    for r in rows:
        ro, rb = rat[(r.workload, r.path, r.store)]
        lines.append(
            f"{r.workload:<10} {r.path:<10} {r.store:<6} {r.bytes / GIB:>6.2f} {_num(r.out_s, '8.2f'):>8} "
            f"{_num(r.gbps(r.out_s), '8.2f'):>8} {_num(ro, '5.1f') + ('x' if ro else ''):>6} "
            f"{_num(r.back_s, '8.2f'):>8} {_num(r.gbps(r.back_s), '9.2f'):>9} "
            f"{_num(rb, '5.1f') + ('x' if rb else ''):>6} {r.check:<6} {r.status}")
    lines.append("")
    lines.append("phases (s; out | back; tool rows: its own --json figures, wall = command incl. start-up):")
    for r in rows:
        if r.out_phases or r.back_phases or r.out_wall_s:
            beside = r.extra.get("overlapped") or {}
            in_place = r.extra.get("loaded_in_place")
            lines.append(f"  {r.workload}/{r.path}/{r.store}: {_phases(r.out_phases)} | {_phases(r.back_phases)}"
                         f"  (wall {_num(r.out_wall_s, '.2f')} | {_num(r.back_wall_s, '.2f')})"
                         + (f"  [beside the phases: {_phases(beside)}]" if beside else "")
                         + (f"  [loaded in place: {in_place / GIB:.2f} GiB]" if in_place else ""))
    lines.append("x drv = driver-only seconds / this row's seconds (above 1: faster than the driver alone)")
    return "\n".join(lines)


def device_shares(rows, rates, after=None):
    """Each row's GB/s as a share of its store device's own rate measured in the same run (out
    against the device's write rate, back against its read rate): lines for the table, and the
    shares in row.extra (out_pct_of_device, back_pct_of_device) for the JSON. `after`: the same
    device's rate measured again once the rows were done (a cloud disk's rate drifts within one
    run), each row then set against both (out_pct_of_device_after, back_pct_of_device_after); and
    against the rate measured just before the row where it was (row.extra["rate_beside"]:
    out_pct_of_device_beside, back_pct_of_device_beside)."""
    lines = []
    for r in rows:
        rate = rates.get(r.store) or {}
        if "write_gbps" not in rate or not (r.out_s or r.back_s):
            continue
        again = (after or {}).get(r.store) or {}
        beside = r.extra.get("rate_beside") or {}
        parts = []
        for way, secs, key in (("out", r.out_s, "write_gbps"), ("back", r.back_s, "read_gbps")):
            gbps = r.gbps(secs)
            if gbps is None or not rate[key]:
                continue
            pct = 100 * gbps / rate[key]
            r.extra[f"{way}_pct_of_device"] = round(pct, 1)
            part = f"{way} {gbps:.2f} GB/s = {pct:.0f}% of its {key[:-5]} {rate[key]:.2f}"
            if again.get(key):
                pct_after = 100 * gbps / again[key]
                r.extra[f"{way}_pct_of_device_after"] = round(pct_after, 1)
                part += f" before the rows, {pct_after:.0f}% of {again[key]:.2f} after them"
            if beside.get(key):
                pct_beside = 100 * gbps / beside[key]
                r.extra[f"{way}_pct_of_device_beside"] = round(pct_beside, 1)
                part += f", {pct_beside:.0f}% of {beside[key]:.2f} just before the row"
            parts.append(part)
        if parts:
            lines.append(f"  {r.workload}/{r.path}/{r.store}: " + "; ".join(parts))
    if lines:
        lines.insert(0, "against the store device's own rate (same run, "
                        + ("O_DIRECT" if all(v.get("direct") for v in rates.values() if "direct" in v)
                           else "O_DIRECT where allowed") + "):")
    return "\n".join(lines)


def median_cycle(rows):
    """Of one path's rows, one per cycle (checkpoint_bench --cycles): the first that failed or
    whose check is not ok, else the one of median back time; every cycle's (out, back) seconds go
    into its extra["cycles"] where there is more than one."""
    bad = [r for r in rows if r.status != "ok" or r.check != "ok"]
    if bad or len(rows) == 1:
        return (bad or rows)[0]
    chosen = sorted(rows, key=lambda r: r.back_s)[(len(rows) - 1) // 2]
    chosen.extra["cycles"] = [(r.out_s, r.back_s) for r in rows]
    chosen.extra["cycle_back_phases"] = [r.back_phases for r in rows]
    return chosen


def _grown(warm, cold, shown=3):
    """The phases of a warm resume that took longer than in its cold cycle, most first ("total"
    and whatever is not a number left out): "restore +0.03, tool start +0.02"."""
    grown = sorted(((warm[k] - cold.get(k, 0.0), k) for k in warm
                    if k != "total" and isinstance(warm[k], (int, float))), reverse=True)
    return ", ".join(f"{k} +{d:.2f}" for d, k in grown[:shown] if d >= 0.005) or "no phase by 0.005 s or more"


def cycle_lines(rows):
    """Every cycle of the rows measured more than once, with their medians, and each cold path's
    back time against its warm path's in the same cycle (whether a warm resume is slower)."""
    lines = []
    for r in rows:
        cycles = r.extra.get("cycles")
        if not cycles:
            continue
        outs, backs = [c[0] for c in cycles], [c[1] for c in cycles]
        lines.append(f"  {r.workload}/{r.path}/{r.store}: out " + " ".join(f"{v:.2f}" for v in outs)
                     + f" (median {statistics.median(outs):.2f}), back " + " ".join(f"{v:.2f}" for v in backs)
                     + f" (median {statistics.median(backs):.2f})")
        cold = next((c for c in rows if c.workload == r.workload and c.store == r.store
                     and c.path + "-warm" == r.path and c.extra.get("cycles")), None)
        if cold is not None:
            colds = [c for _, c in cold.extra["cycles"]]
            diffs = [w - c for w, c in zip(backs, colds)]  # warm - cold, cycle by cycle
            phases = zip(r.extra.get("cycle_back_phases") or [{}] * len(cycles),
                         cold.extra.get("cycle_back_phases") or [{}] * len(cycles))
            slower = [(i, d, wp, cp) for i, (d, (wp, cp)) in enumerate(zip(diffs, phases), 1) if d > 0]
            # the differences beside how far the cold resumes fall from each other: same work, or not
            lines.append(f"    warm back slower than cold in {len(slower)} of {len(cycles)} cycles "
                         f"(warm - cold: median {statistics.median(diffs):+.2f} s, {min(diffs):+.2f} to "
                         f"{max(diffs):+.2f}; the cold ones {max(colds) - min(colds):.2f} s apart)")
            # where the difference went, so that a run answers whether it is structural or spread
            lines.extend(f"      cycle {i}: +{d:.2f} s; grown: {_grown(wp, cp)}" for i, d, wp, cp in slower if wp)
    if lines:
        lines.insert(0, "cycles (s, in order):")
    return "\n".join(lines)


def precheck_lines(rows):
    """Rows that timed a full chunk check before their restore (checkpoint_bench --precheck): its
    seconds beside the restore's, i.e. what checking first would add to "back"."""
    lines = []
    for r in rows:
        pc = r.extra.get("precheck")
        if not pc:
            continue
        gb = (pc.get("bytes") or 0) / 1e9
        rate = f", {gb / pc['s']:.2f} GB/s" if gb and pc["s"] else ""
        share = f" = +{100 * pc['s'] / r.back_s:.0f}% on back {r.back_s:.2f} s" if r.back_s else ""
        lines.append(f"  {r.workload}/{r.path}/{r.store}: {pc['s']:.2f} s for {gb:.2f} GB "
                     f"({pc['threads']} threads{rate}){share}" + ("" if pc.get("ok") else " (verify FAILED)"))
    if lines:
        lines.insert(0, "full chunk check before the restore (store verify of the dump's chunks; "
                        "not done by restore, which hashes on the GPU as it loads):")
    return "\n".join(lines)


def image_lines(rows):
    """CRIU's image size of each row that has one, against the driver + plain CRIU row's of the same
    workload (whose image holds the GPU memory itself)."""
    drivers = {r.workload: r.extra.get("image_bytes") for r in rows if r.path == "drv+criu"}
    lines = []
    for r in rows:
        size = r.extra.get("image_bytes")
        if size is None:
            continue
        theirs = drivers.get(r.workload)
        ratio = f" = 1/{theirs / size:.0f} of drv+criu's" if theirs and size and r.path != "drv+criu" else ""
        lines.append(f"  {r.workload}/{r.path}/{r.store}: {size / 2**20:.1f} MiB{ratio}")
    if lines:
        lines.insert(0, "CRIU image sizes:")
    return "\n".join(lines)


def criu_lines(rows):
    """CRIU's own account of each row's dump and restore (its stats-dump and stats-restore, as the
    tool's --json carries them as criu_stats, or read from the image), in seconds and pages: what
    a phase such as `criu restore (processes, host memory)` spent on what."""
    lines = []
    for r in rows:
        stats = r.extra.get("criu_stats") or {}
        parts = []
        for action in ("dump", "restore"):
            got = stats.get(action)
            if got:
                parts.append(" ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}"
                                      for k, v in got.items()))
        if parts:
            lines.append(f"  {r.workload}/{r.path}/{r.store}: " + " | ".join(parts))
    if lines:
        lines.insert(0, "CRIU's own account (stats-dump | stats-restore; times in s, pages of 4 KiB):")
    return "\n".join(lines)


def _criu_stats(row, action, stats):
    if stats:
        row.extra.setdefault("criu_stats", {})[action] = stats


def _image_stats(row, images, action):
    from criu_gpushare.criu.images import stats
    _criu_stats(row, action, stats(images, action))
    if action == "dump":
        _image_contents(row, images)


def _image_contents(row, images):
    """row.extra["image_pages"]: what the memory in CRIU's image belongs to (images.pages_by_mapping),
    so that a row bound by CRIU's dump or restore says which memory it moved."""
    from criu_gpushare.criu.images import pages_by_mapping
    from criu_gpushare.errors import CriuError, ImageError
    try:
        row.extra["image_pages"] = pages_by_mapping(images)
    except (CriuError, ImageError) as e:
        row.extra["image_pages"] = {"error": str(e)}


def image_content_lines(rows, shown=5):
    """Per row with an image: the kinds of memory its pages belong to, the biggest `shown`
    (the rest summed), and its largest mapping."""
    lines = []
    for r in rows:
        found = r.extra.get("image_pages")
        if not found:
            continue
        if "error" in found:
            lines.append(f"  {r.workload}/{r.path}/{r.store}: not read ({found['error']})")
            continue
        kinds = list(found["kinds"].items())
        parts = [f"{kind} {n / 2**20:.1f}" for kind, n in kinds[:shown]]
        rest = sum(n for _, n in kinds[shown:])
        if rest:
            parts.append(f"the rest {rest / 2**20:.1f}")
        top = found["largest"][0] if found["largest"] else None
        where = (f"; largest: pid {top['pid']} {top['start']:#x}-{top['end']:#x} {top['kind']} "
                 f"{top['bytes'] / 2**20:.1f}") if top else ""
        lines.append(f"  {r.workload}/{r.path}/{r.store}: " + ", ".join(parts) + where)
    if lines:
        lines.insert(0, "CRIU image pages by mapping (MiB):")
    return "\n".join(lines)


def drop_page_cache():
    """Write back and drop the page cache (a restore from a cold cache): None, or why not."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    except OSError as e:
        return f"cannot drop the page cache ({e.strerror}; needs root)"
    return None


def write_json(path, meta, rows):
    rat = ratios(rows)
    doc = {"meta": meta, "rows": []}
    for r in rows:
        d = asdict(r)
        d["out_gbps"], d["back_gbps"] = r.gbps(r.out_s), r.gbps(r.back_s)
        d["out_x_driver"], d["back_x_driver"] = rat[(r.workload, r.path, r.store)]
        doc["rows"].append(d)
    text = json.dumps(doc, indent=2)
    if path:
        with open(path, "w") as f:
            f.write(text + "\n")
    return doc


# ----------------------------------------------------------------------------------------- the tool

def tool_argv():
    """How to run criu-gpushare: the console script when on PATH, else its module."""
    exe = shutil.which("criu-gpushare")
    return [exe] if exe else [sys.executable, "-m", "criu_gpushare.cli"]


def tool_env(run_dir):
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}  # the tool runs without the shim
    env.update(NO_MULTICAST_ENV, CRIU_GPUSHARE_RUN_DIR=run_dir)
    return env


def tool_has(command, argv=None, env=None, timeout=120):
    """Whether the tool has COMMAND (`criu-gpushare COMMAND --help` exits 0)."""
    try:
        r = subprocess.run([*(argv or tool_argv()), command, "--help"], env=env, capture_output=True,
                           text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


@dataclass
class ToolResult:
    rc: int
    wall_s: float
    summary: dict | None
    stderr: str

    @property
    def ok(self):
        return self.rc == 0 and isinstance(self.summary, dict) and self.summary.get("ok", True) is not False

    def seconds(self):
        """The command's time as it measured it (its phases' total, from its own start), else the
        sum of its GPU steps, else the wall time."""
        summary = self.summary or {}
        if summary.get("phases"):
            return summary["phases"]["total"]
        steps = summary.get("seconds") or {}
        return round(sum(steps.values()), 3) if steps else self.wall_s

    def phases(self):
        """Where the time went: the whole command's phases (CRIU's included) where it gives them,
        else its GPU steps."""
        summary = self.summary or {}
        phases = {k: v for k, v in (summary.get("phases") or {}).items() if k != "total"}
        return phases or summary.get("seconds", {})

    def why(self):
        if self.rc == 124:
            return f"timed out ({self.stderr.strip()[-200:]})"
        if isinstance(self.summary, dict) and self.summary.get("message"):
            return f"exit {self.rc}: {self.summary['message']}"
        tail = self.stderr.strip().splitlines()[-1:] or ["no output"]
        return f"exit {self.rc}: {tail[0][:300]}"


def run_tool(args, env, timeout, argv=None):
    """criu-gpushare ARGS... --json, bounded; the parsed JSON summary on stdout (or None)."""
    cmd = [*(argv or tool_argv()), *map(str, args), "--json"]
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        rc, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        rc, out = 124, ""
        err = f"{' '.join(cmd)} killed after {timeout} s\n" + (
            e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or ""))
    wall = round(time.monotonic() - t0, 3)
    try:
        summary = json.loads(out) if out.strip() else None
    except json.JSONDecodeError:
        summary = None
    return ToolResult(rc, wall, summary, err)


def tool_cycle(row, wl, out_args, back_args, env, timeout, between=None):
    """Out then back through the tool, then check the contents; fills row. False when it failed.
    between(): run after out, before back (e.g. drop_page_cache); a string it returns fails the row."""
    out = run_tool(out_args, env, timeout)
    row.out_wall_s, row.out_s = out.wall_s, out.seconds()
    row.out_phases = out.phases() if out.ok else {}
    row.extra["out_bytes"] = (out.summary or {}).get("bytes") if out.ok else None
    row.extra["units"] = (out.summary or {}).get("units") if out.ok else None
    row.extra["overlapped"] = (out.summary or {}).get("overlapped") if out.ok else None
    if not out.ok:
        row.status, row.out_s = f"fails: {out_args[0]} {out.why()}", None
        return False
    if out_args[0] == "dump":
        row.extra["image_bytes"] = (out.summary or {}).get("image_bytes")
        _criu_stats(row, "dump", (out.summary or {}).get("criu_stats"))
        _image_contents(row, str(out_args[2]))  # dump PID DIR ...
        wl.reap()  # CRIU ended the tree: its pids must be free for the restore
    why = between() if between else None
    if why:
        row.status = f"not run: {why}"
        return False
    back = run_tool(back_args, env, timeout)
    row.back_wall_s, row.back_s = back.wall_s, back.seconds()
    row.back_phases = back.phases() if back.ok else {}
    row.extra["loaded_in_place"] = ((back.summary or {}).get("bytes") or {}).get("loaded_in_place") if back.ok else None
    if not back.ok:
        row.status, row.back_s = f"fails: {back_args[0]} {back.why()}", None
        return False
    if back_args[0] == "restore":
        _criu_stats(row, "restore", (back.summary or {}).get("criu_stats"))
    row.check = wl.verify()
    return True


# ----------------------------------------------------------------------------------------- workloads

class WorkloadError(RuntimeError):
    pass


class Workload:
    """A bench workload under the shim, talking through files in its control directory (so CRIU can
    dump it: stdio on /dev/null and a log file, no pipe to this process, its own session)."""

    def __init__(self, name, script, args, workdir, run_dir, env_extra=None, shim=True):
        self.name, self.script, self.args = name, script, [str(a) for a in args]
        self.dir = os.path.join(workdir, f"wl-{name}-{time.monotonic_ns()}")
        self.ctl = os.path.join(self.dir, "ctl")
        os.makedirs(self.ctl)
        self.log_path = os.path.join(self.dir, "workload.log")
        self.env = dict(os.environ, **NO_MULTICAST_ENV, CRIU_GPUSHARE_RUN_DIR=run_dir, **(env_extra or {}))
        self.env.pop("LD_PRELOAD", None)
        if os.environ.get("GPUSHARE_PROBE_RUN"):  # scripts/gpu-tests.sh kills leftovers by this tag
            self.env["GPUSHARE_PROBE_TAG"] = os.environ["GPUSHARE_PROBE_RUN"]
        self.shim, self.proc, self.info, self.seq, self.sha = shim, None, None, 0, None

    def start(self, timeout):
        script = os.path.join(WORKLOADS, self.script)
        argv = [sys.executable, script, *self.args, "--ctl", self.ctl]
        if self.shim:
            argv = [*tool_argv(), "run", *argv]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                         env=self.env, cwd=self.dir, start_new_session=True)
        ready = os.path.join(self.ctl, "ready")
        deadline = time.monotonic() + timeout
        while not os.path.exists(ready):
            if self.proc.poll() is not None:
                raise WorkloadError(f"{self.name} exited {self.proc.returncode}: {self.log_tail()}")
            if time.monotonic() > deadline:
                self.kill()
                raise WorkloadError(f"{self.name} not ready within {timeout} s: {self.log_tail()}")
            time.sleep(0.05)
        with open(ready) as f:
            self.info = json.load(f)
        self.sha = self.ask("check", timeout)["sha"]
        return self

    @property
    def pids(self):
        return list(self.info["pids"]) if self.info else []

    @property
    def bytes(self):
        return int(self.info["bytes"])

    def log_tail(self, n=6):
        try:
            with open(self.log_path, errors="replace") as f:
                return " | ".join(f.read().strip().splitlines()[-n:])
        except OSError:
            return "(no log)"

    def alive(self):
        pid = self.pids[0] if self.pids else None
        if pid is None:
            return False
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
        except OSError:
            return False

    def ask(self, cmd, timeout=600):
        n, self.seq = self.seq, self.seq + 1
        path = os.path.join(self.ctl, f"cmd-{n}")
        with open(path + ".tmp", "w") as f:
            f.write(cmd)
        os.rename(path + ".tmp", path)
        reply = os.path.join(self.ctl, f"reply-{n}")
        deadline = time.monotonic() + timeout
        while not os.path.exists(reply):
            if not self.alive():
                raise WorkloadError(f"{self.name} died before answering {cmd!r}: {self.log_tail()}")
            if time.monotonic() > deadline:
                raise WorkloadError(f"{self.name} did not answer {cmd!r} within {timeout} s")
            time.sleep(0.02)
        with open(reply) as f:
            answer = json.load(f)
        os.unlink(reply)
        if "error" in answer:
            raise WorkloadError(f"{self.name} {cmd}: {answer['error']}")
        return answer

    def verify(self, timeout=600):
        """'ok' when the GPU contents hash as they did at start, else 'WRONG' (or why not)."""
        try:
            return "ok" if self.ask("check", timeout)["sha"] == self.sha else "WRONG"
        except WorkloadError as e:
            return f"WRONG ({e})"[:200]

    def reap(self, timeout=60):
        """Once CRIU has ended the tree: wait until its pids are free for a restore. A tree that was
        itself restored is no child of ours but of our subreaper role (become_subreaper), so every
        zombie child is reaped, not only the process we started."""
        if self.proc is not None:
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        deadline = time.monotonic() + timeout
        while True:
            reap_children()  # a helper of the tree (the resource tracker) holds its session id
            if not any(_state(p) not in ("X", None) for p in self.pids) or time.monotonic() > deadline:
                return
            time.sleep(0.02)

    def kill(self):
        """SIGKILL every process of the workload (a process stuck CHECKPOINTED only dies so), and
        unlink the named semaphores its multiprocessing tree leaves behind."""
        with semaphores_unlinked(self.pids):
            for pid in self.pids + ([self.proc.pid] if self.proc else []):
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            if self.proc is not None:
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                self.reap(30)
            deadline = time.monotonic() + 30
            while any(os.path.exists(f"/proc/{p}") and _state(p) not in ("Z", "X", None) for p in self.pids):
                if time.monotonic() > deadline:
                    break
                time.sleep(0.1)


def _state(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


# ----------------------------------------------------------------------------------------- driver only

class Driver:
    """The driver's own checkpoint path, called from this process (cuda.bindings.driver), one call
    kind at a time for every pid at once from threads (never from two processes: the driver hangs),
    each call bounded; under the tool's node-wide driver lock, so it never overlaps a tool run."""

    def __init__(self):
        from cuda.bindings import driver as cu
        self.cu = cu
        err, = cu.cuInit(0)
        if err != cu.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"cuInit: {err.name}")
        from criu_gpushare.gpu.checkpoint_api import DriverLock  # the tool's own node-wide lock
        self.lock = DriverLock
        self.hung = False

    def _one(self, op, pid, lock_timeout_ms):
        cu = self.cu
        if op == "lock":
            args = cu.CUcheckpointLockArgs()
            args.timeoutMs = lock_timeout_ms
            return cu.cuCheckpointProcessLock(pid, args)[0]
        fn = {"checkpoint": cu.cuCheckpointProcessCheckpoint, "restore": cu.cuCheckpointProcessRestore,
              "unlock": cu.cuCheckpointProcessUnlock}[op]
        return fn(pid, None)[0]

    def call(self, op, pids, timeout_s, lock_timeout_ms=60000):
        """(seconds, {pid: "CUDA_SUCCESS" | error name | "timeout"}) of one call for every pid."""
        results = {}

        def work(pid):
            try:
                results[pid] = self._one(op, pid, lock_timeout_ms).name
            except Exception as e:
                results[pid] = f"{type(e).__name__}: {e}"

        with self.lock():
            t0 = time.monotonic()
            threads = [threading.Thread(target=work, args=(p,), daemon=True) for p in pids]
            for t in threads:
                t.start()
            deadline = t0 + timeout_s
            for t in threads:
                t.join(max(0.0, deadline - time.monotonic()))
            secs = time.monotonic() - t0
        for p in pids:
            if p not in results:
                results[p], self.hung = "timeout", True
        return round(secs, 3), results

    def state(self, pid):
        err, st = self.cu.cuCheckpointProcessGetState(pid)
        return st.name if err == self.cu.CUresult.CUDA_SUCCESS else err.name


def driver_ops(driver, row, wl, ops, phases, timeout_s):
    """Each driver call of ops for every pid at once, timed into phases and row.extra["calls"];
    False at the first that fails for some pid (row.status names them)."""
    calls = row.extra.setdefault("calls", {})
    for op in ops:
        secs, res = driver.call(op, wl.pids, timeout_s)
        calls[op] = {"seconds": secs, "results": {str(k): v for k, v in res.items()}}
        phases[op] = secs
        bad = {p: r for p, r in res.items() if r != "CUDA_SUCCESS"}
        if bad:
            row.status = "fails: " + ", ".join(f"{op} pid {p} {r}" for p, r in bad.items())
            return False
    return True


def driver_cycle(driver, row, wl, timeout_s):
    """lock + checkpoint (out), restore + unlock (back), each call timed; fills row."""
    ok = driver_ops(driver, row, wl, ("lock", "checkpoint"), row.out_phases, timeout_s)
    if ok:
        row.out_s = round(row.out_phases["lock"] + row.out_phases["checkpoint"], 3)
        ok = driver_ops(driver, row, wl, ("restore", "unlock"), row.back_phases, timeout_s)
    if not ok:
        row.extra["states"] = {str(p): driver.state(p) for p in wl.pids} if not driver.hung else {}
        return False
    row.back_s = round(row.back_phases["restore"] + row.back_phases["unlock"], 3)
    row.check = wl.verify()
    return True


def driver_criu_cycle(driver, row, wl, images, timeout_s, criu=None):
    """The driver's path through plain CRIU, as it runs without this tool: lock + checkpoint (the
    GPU memory into the process's host memory), then `criu dump` (CRIU kills the process; its image
    holds that memory too); back: `criu restore`, then restore + unlock. Each stage timed into the
    row's phases; row.extra["image_bytes"]. False when a stage failed (the caller kills the
    workload). criu: the criu_gpushare.criu.rpc module (a test gives a stand-in)."""
    if criu is None:
        from criu_gpushare.criu import rpc as criu
    from criu_gpushare.criu.images import image_bytes
    from criu_gpushare.criu.libdir import plugin_dir_without_cuda

    def criu_call(what, phases, call):
        t0 = time.monotonic()
        try:
            call()
        except criu.CriuError as e:
            row.status = f"fails: criu {what}: {e}"[:300]
            return False
        phases[f"criu {what}"] = round(time.monotonic() - t0, 3)
        return True

    if not driver_ops(driver, row, wl, ("lock", "checkpoint"), row.out_phases, timeout_s):
        return False
    plugins = plugin_dir_without_cuda()  # CRIU's own CUDA plugin would redo the driver's work
    try:
        options = criu.CriuOptions(libdir=plugins, link_remap=True, timeout_s=timeout_s)
        if not criu_call("dump", row.out_phases, lambda: criu.dump(images, wl.pids[0], options)):
            return False
        row.out_s = round(sum(row.out_phases.values()), 3)
        row.extra["image_bytes"] = image_bytes(images)
        _image_stats(row, images, "dump")
        wl.reap()  # CRIU ended the process: its pid must be free for the restore
        if not criu_call("restore", row.back_phases, lambda: criu.restore(images, options)):
            return False
        _image_stats(row, images, "restore")
    finally:
        if plugins:
            shutil.rmtree(plugins, ignore_errors=True)
    if not driver_ops(driver, row, wl, ("restore", "unlock"), row.back_phases, timeout_s):
        return False
    row.back_s = round(sum(row.back_phases.values()), 3)
    row.check = wl.verify()
    return True


_HOOK_TOOK = re.compile(r"criu-gpushare-hook: ([a-z-]+): took (\d+(?:\.\d+)?) s"
                        r"(?: \(program start (\d+(?:\.\d+)?) s, began (\d+(?:\.\d+)?) s after boot\))?")
_HOOK_STEPS = re.compile(r"criu-gpushare-hook: ([a-z-]+): GPU state of \d+ process\(es\) (?:out|is back): (.*)$",
                         re.MULTILINE)
_STEP = re.compile(r"(\S.*?) (\d+\.\d+)(?= |$)")
_HOOK_BESIDE = re.compile(r"criu-gpushare-hook: [a-z-]+: beside those steps: (.*)$", re.MULTILINE)


def hook_overlapped(log_text):
    """What ran beside a hooked run's steps, from the hook's lines in CRIU's log (the driver's
    start beside the holder's imports, the checkpoint beside the save): {name: seconds}."""
    out = {}
    for line in _HOOK_BESIDE.findall(log_text):
        out.update((name, float(v)) for name, v in _STEP.findall(line))
    return out


def boot_clock():
    """The clock the hook says its actions began on (CLOCK_BOOTTIME, seconds)."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def hook_phases(log_text, wall_s, began=None):
    """Where a hooked `criu dump` or `criu restore` spent wall_s, from the lines the hook writes
    into CRIU's log. With began (boot_clock() when CRIU was started) and a hook that says when each
    action began: in order, CRIU's own time before each action ("criu before pre-restore": for a
    restore, the window between post-restore and post-resume is "criu before post-resume"), each
    action split into its program start, its steps (pre-dump's and post-resume's `GPU state ...`
    line) and the rest ("post-resume: other": asking the holder, its reply), and "criu after" the
    last action. Otherwise each action's own time ("hook ACTION") and CRIU's, all of the rest."""
    took = _HOOK_TOOK.findall(log_text)
    if began is None or not took or any(not b for *_, b in took):
        phases = {}
        for action, secs, *_ in took:
            phases[f"hook {action}"] = round(phases.get(f"hook {action}", 0.0) + float(secs), 3)
        phases["criu"] = round(max(0.0, wall_s - sum(phases.values())), 3)
        return phases
    steps = {}
    for action, line in _HOOK_STEPS.findall(log_text):
        steps.setdefault(action, []).extend((name, float(v)) for name, v in _STEP.findall(line))
    phases, at, last = {}, 0.0, None

    def add(name, secs):
        phases[name] = round(phases.get(name, 0.0) + max(0.0, secs), 3)

    # An action's "began" is its process's start, down to a clock tick (10 ms), and its "program
    # start" is measured from that same start: the tick's error moves time between the two only,
    # and an action's end (began + took) is exact. Only a gap shorter than a tick, clamped at 0,
    # can make the parts exceed wall_s, by a tick at most.
    for action, secs, start, action_began in sorted(took, key=lambda t: float(t[3])):
        offset = float(action_began) - began
        add(f"criu before {action}", offset - at)
        add(f"{action}: start", float(start))
        inner = [(n, v) for n, v in steps.pop(action, []) if v >= 0.005]
        for name, v in inner:
            add(f"{action}: {name}", v)
        add(f"{action}: other", float(secs) - float(start) - sum(v for _, v in inner))
        at, last = max(at, offset + float(secs)), action
    add(f"criu after {last}", wall_s - at)
    return phases


def hook_cycle(row, wl, images, env, timeout, criu="criu", hook=None):
    """`criu dump` then `criu restore -d` with the hook as action script (the node-wide way, and
    runc's), timed from outside; fills row. False when it failed (the caller kills the workload),
    None when CRIU or the hook is not installed (the workload untouched)."""
    hook = hook or shutil.which("criu-gpushare-hook")
    if hook is None or shutil.which(criu) is None:
        row.status = f"not available: {'criu-gpushare-hook' if hook is None else criu} not on PATH"
        return None
    for way, argv, log in (
            ("out", ["dump", "-t", str(wl.pids[0]), "--link-remap"], "dump.log"),
            ("back", ["restore", "-d"], "restore.log")):
        cmd = [criu, *argv, "-D", images, "--action-script", hook, "-o", log]
        t0, began = time.monotonic(), boot_clock()
        try:
            r = subprocess.run(cmd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                               timeout=timeout)
            rc = r.returncode
        except subprocess.TimeoutExpired:
            rc = 124
        wall = round(time.monotonic() - t0, 3)
        try:
            with open(os.path.join(images, log), errors="replace") as f:
                text = f.read()
        except OSError:
            text = ""
        if rc != 0:
            said = [ln for ln in text.splitlines() if "criu-gpushare-hook" in ln or "Error" in ln][-2:]
            row.status = f"fails: criu {argv[0]} exit {rc}: {' | '.join(said)}"[:300]
            return False
        setattr(row, f"{way}_s", wall)
        setattr(row, f"{way}_phases", hook_phases(text, wall, began))
        _image_stats(row, images, argv[0])
        if way == "out":
            row.extra["overlapped"] = hook_overlapped(text) or None
            from criu_gpushare.criu.images import image_bytes
            row.extra["image_bytes"] = image_bytes(images)
            wl.reap()  # CRIU ended the tree: its pids must be free for the restore
    row.check = wl.verify()
    return True


# ----------------------------------------------------------------------------------------- disk rate

def touch_memory(directory, size, chunk=64 << 20, threads=16):
    """Write SIZE bytes into files under a memory-backed DIRECTORY (tmpfs) on THREADS threads,
    then remove them: the seconds it took. A freshly started VM pays once for the first touch of
    each page of its memory (1.3 s per 40 GiB measured on the H200's VM); done before the rows,
    the first row's figure is that of a node in service, not of the machine's first minutes."""
    block = os.urandom(1 << 20) * (chunk >> 20)
    count = max(1, -(-size // chunk))
    paths = [os.path.join(directory, f".bench-touch-{os.getpid()}-{i}") for i in range(threads)]

    def write(k):
        with open(paths[k], "wb") as f:
            for _ in range(k, count, threads):
                f.write(block)

    t0 = time.monotonic()
    try:
        with concurrent.futures.ThreadPoolExecutor(threads) as pool:
            list(pool.map(write, range(min(threads, count))))
        return time.monotonic() - t0
    finally:
        for path in paths:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass


def disk_rate(directory, size, chunk=64 << 20):
    """Sustained write then read of SIZE bytes in CHUNK blocks with O_DIRECT (dd oflag=direct):
    {"write_gbps", "read_gbps", "direct": bool, "bytes"}; the buffered path (fdatasync, page cache
    dropped before reading) where the file system refuses O_DIRECT."""
    size = max(chunk, size // chunk * chunk)
    path = os.path.join(directory, f".bench-disk-rate-{os.getpid()}")
    buf = mmap.mmap(-1, chunk)  # page-aligned, as O_DIRECT needs
    buf[:] = os.urandom(1 << 20) * (chunk >> 20)
    direct = hasattr(os, "O_DIRECT")
    try:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | (os.O_DIRECT if direct else 0), 0o600)
        except OSError:
            direct = False
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        t0 = time.monotonic()
        try:
            for off in range(0, size, chunk):
                buf[:8] = off.to_bytes(8, "little")
                os.write(fd, buf)
        except OSError:
            if not direct:
                raise
            os.close(fd)  # O_DIRECT refused at write time (tmpfs before 6.6): buffered
            return dict(disk_rate_buffered(path, size, buf, chunk), direct=False)
        os.fdatasync(fd)
        write_s = time.monotonic() - t0
        os.close(fd)
        read_s = _read_all(path, size, buf, chunk, direct)
        return {"write_gbps": size / 1e9 / write_s, "read_gbps": size / 1e9 / read_s,
                "direct": direct, "bytes": size, "dir": directory}
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass


def disk_rate_buffered(path, size, buf, chunk):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    t0 = time.monotonic()
    for off in range(0, size, chunk):
        os.write(fd, buf)
    os.fdatasync(fd)
    write_s = time.monotonic() - t0
    os.close(fd)
    read_s = _read_all(path, size, buf, chunk, False)
    return {"write_gbps": size / 1e9 / write_s, "read_gbps": size / 1e9 / read_s, "bytes": size,
            "dir": os.path.dirname(path)}


def _read_all(path, size, buf, chunk, direct):
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECT if direct else 0))
    try:
        if not direct:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        t0 = time.monotonic()
        done = 0
        while done < size:
            n = os.readv(fd, [buf])
            if n <= 0:
                break
            done += n
        return time.monotonic() - t0
    finally:
        os.close(fd)


def free_bytes(directory):
    st = os.statvfs(directory)
    return st.f_bavail * st.f_frsize


def mount_huge_tmpfs(size="90%"):
    """A tmpfs mounted with huge=always (its files in 2 MiB pages: far fewer page allocations per
    byte written than /dev/shm's usual huge=never) on a new directory, for one run; -> its path.
    SystemExit saying why where it cannot be mounted (root is needed)."""
    path = tempfile.mkdtemp(prefix="bench-huge-tmpfs.")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},huge=always,mode=0755", "tmpfs", path],
                       capture_output=True, text=True)
    if r.returncode != 0:
        os.rmdir(path)
        raise SystemExit(f"cannot mount a tmpfs with huge pages (root is needed): {r.stderr.strip()}")
    return path


def unmount(path):
    """Undo mount_huge_tmpfs (what is in it goes with it)."""
    subprocess.run(["umount", path], check=False)
    with contextlib.suppress(OSError):
        os.rmdir(path)


THP_ENABLED = "/sys/kernel/mm/transparent_hugepage/enabled"


def thp_mode(path=THP_ENABLED):
    """The kernel's transparent huge page mode for anonymous memory ("always", "madvise", "never":
    the bracketed word of `path`), or None where it cannot be read."""
    try:
        with open(path) as f:
            words = f.read().split()
    except OSError:
        return None
    return next((w[1:-1] for w in words if w.startswith("[") and w.endswith("]")), None)


def set_thp_mode(mode, path=THP_ENABLED):
    """Set the mode for the processes a run starts (each memory area takes the mode in force when
    it is faulted in); -> the mode before, for the run's end to put back. SystemExit saying why
    where it cannot be set (root is needed)."""
    before = thp_mode(path)
    try:
        with open(path, "w") as f:
            f.write(mode)
    except OSError as e:
        raise SystemExit(f"cannot set transparent huge pages to {mode!r} ({path}: {e.strerror}; root "
                         "is needed)") from None
    return before


def sigterm_as_interrupt():
    """`timeout` sends SIGTERM: as KeyboardInterrupt, the bench still kills its workloads and prints."""
    import signal as _signal

    def handler(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")
    _signal.signal(_signal.SIGTERM, handler)


def versions():
    """Versions worth keeping with the figures (each best effort, nothing imported)."""
    from importlib import metadata
    out = {"python": sys.version.split()[0]}
    for dist in ("torch", "cupy-cuda12x", "cupy-cuda13x", "cupy", "cuda-bindings", "criu-gpushare"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    try:
        with open("/proc/driver/nvidia/version") as f:
            out["driver"] = f.readline().strip()
    except OSError:
        out["driver"] = None
    return out
