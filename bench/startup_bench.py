#!/usr/bin/env python3
"""The tool's fixed start cost: wall time of a fresh interpreter running each entry point.

    python3 bench/startup_bench.py               # median of 10 runs per case, milliseconds
    python3 bench/startup_bench.py --runs 20 --json

CRIU starts the hook for every action of a dump or a restore, most of which it ignores; each
command pays the same start before its first useful step. Cases:
  python     the bare interpreter (`python -c pass`): the floor under every other case
  cli-help   `criu-gpushare --help` (every command registered, none run)
  hook-skip  the hook for an action it ignores (CRTOOLS_SCRIPT_ACTION=network-lock): its shell
             launcher (hooks/criu-gpushare-hook), which answers it without Python
  hook-skip-python  the same action given to the hook's Python entry point (what the launcher spares)
  pre-restore   the hook's pre-restore of an image of ours (a store that holds its ref), under a
             shell that stands for CRIU: CRIU restores nothing until it returns; the holder it
             starts checks while CRIU restores, and ends with that shell
  post-restore  the hook's post-restore of an image of ours (it keeps the image's path and the
             root pid for post-resume): the restored tree waits for it
  post-resume   the hook's post-resume with nothing to bring back: the start it pays before it asks
             the restore's holder
  suspend-imports  what `criu-gpushare suspend` imports before it forks its holder (the command's
             module and its job, engine/suspension.py), paid by every in-place suspend
  status     `criu-gpushare status` with no workload running (an empty state directory)
  resume     `criu-gpushare resume PID` of a group whose holder answers at once (a holder of this
             bench's, which loads nothing): the command's start, its journal check, the request and
             the reply, what a user's in-place resume pays beyond the holder's own work
No GPU needed for those; run it on the machine whose figures you want.

    python3 bench/startup_bench.py --gpu          # on a GPU machine: also the GPU's start, step by step

--gpu adds the GPU side of a command's fixed start, timed step by step inside fresh interpreters
(the median per step), then the exit of such a process seen from outside:
  import     the driver bindings and the copy engine (what a save imports)
  cuInit     the driver's start in this process
  context    GPU 0's primary context retained and made current (memory.use_device)
  stream     a copy stream and 16 events
  hasher     the XXH3 module loaded and self-tested (fingerprint.GpuHasher.create)
  ring       16 x 64 MiB pinned (memory.pin_buffers), as a save or load of 1 GiB or more pins
  exit       the interpreter's exit with all that held (the driver tears the context down)
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCHER = os.path.join(REPO, "hooks", "criu-gpushare-hook")  # CRIU's action script, as installed
sys.path.insert(0, REPO)
from criu_gpushare.engine import holder, journal as jn  # noqa: E402


class AnswersResume(holder.Work):
    """A suspend's holder as `resume` finds it (the group's worker), with no GPU work: it answers
    "resume" at once with an empty summary, which names what it was asked with ("asked")."""

    def __init__(self, journal):
        self.journal, self.key, self.pids = journal, journal.key, journal.pids

    def begin(self, report):
        self.journal.adopt()
        return {}, True

    def handle(self, cmd, fields, report):
        self.journal.close()
        return {"state": "resumed", "pids": self.pids, "seconds": {}, "phases": {}, "asked": fields,
                "bytes": {"copied": 0, "written": 0, "deduplicated": 0, "zero": 0}}, False


def suspended(pid):
    """Before each run of the resume case: pid's group suspended, its holder listening."""
    def prepare():
        journal = jn.Journal.create("suspend", [pid], jn.SUSPENDED, store="-", ref="-")
        final = holder.start(AnswersResume(journal), on_progress=lambda m: None)
        if not final["ok"]:
            raise RuntimeError(f"the bench's holder did not start: {final}")
    return prepare


def no_restore_holder(run_dir):
    """Before each run of the pre-restore case: the holder of the run before it gone (it ends
    with its stand-in CRIU, and would compete for the CPU)."""
    def prepare(timeout_s=10.0):
        deadline = time.monotonic() + timeout_s
        while any(n.startswith("holder-restore-") and n.endswith(".sock") for n in os.listdir(run_dir)):
            if time.monotonic() > deadline:
                raise RuntimeError("the pre-restore case's holder did not end with its CRIU")
            time.sleep(0.01)
    return prepare


def restorable_image(run_dir):
    """An image of ours with GPU state whose store holds its ref (a manifest of no process), as
    pre-restore sees one; -> its directory."""
    from criu_gpushare.store import Manifest, open_store
    store_dir, images_dir = os.path.join(run_dir, "store"), os.path.join(run_dir, "restore-images")
    with open_store(store_dir, create=True) as store:
        session = store.begin_write("startup bench")
        session.commit("bench", Manifest(processes=[]))
    os.mkdir(images_dir)
    with open(os.path.join(images_dir, "criu-gpushare.json"), "w") as f:
        json.dump({"format": 1, "gpu_state": True, "store": store_dir, "ref": "bench", "gpus": [],
                   "processes": [], "group": {"units": [], "members": []}}, f)
    return images_dir


def cases(py, images_dir, member, run_dir):
    """name -> (argv, environment added, what runs before each run or None)."""
    hook = "import sys; from criu_gpushare.hook.entry import main; sys.exit(main())"  # its entry point
    restored = {"CRTOOLS_IMAGE_DIR": images_dir, "CRTOOLS_INIT_PID": str(os.getpid())}
    as_criu = ["sh", "-c", '"$0" -c "$1"; true', py, hook]  # the shell is the CRIU its holder watches
    return {
        "python": ([py, "-c", "pass"], {}, None),
        "cli-help": ([py, "-m", "criu_gpushare.cli", "--help"], {}, None),
        "hook-skip": ([LAUNCHER], {"CRTOOLS_SCRIPT_ACTION": "network-lock"}, None),
        "hook-skip-python": ([py, "-c", hook], {"CRTOOLS_SCRIPT_ACTION": "network-lock"}, None),
        "pre-restore": (as_criu, {"CRTOOLS_SCRIPT_ACTION": "pre-restore",
                                  "CRTOOLS_IMAGE_DIR": restorable_image(run_dir)}, no_restore_holder(run_dir)),
        "post-restore": ([py, "-c", hook], dict(restored, CRTOOLS_SCRIPT_ACTION="post-restore"), None),
        # its own state directory, where post-restore's runs have left nothing to bring back
        "post-resume": ([py, "-c", hook], dict(restored, CRTOOLS_SCRIPT_ACTION="post-resume",
                                               CRIU_GPUSHARE_RUN_DIR=os.path.join(images_dir, "run")), None),
        "suspend-imports": ([py, "-c", "from criu_gpushare.cli import suspend; "
                                       "from criu_gpushare.engine import suspension"], {}, None),
        "status": ([py, "-m", "criu_gpushare.cli", "status"], {}, None),
        "resume": ([py, "-m", "criu_gpushare.cli", "resume", str(member)], {}, suspended(member)),
    }


GPU_STEPS = r"""
import json, sys, time
t = time.monotonic()
marks = {}
def mark(name):
    global t
    now = time.monotonic(); marks[name] = now - t; t = now
from cuda.bindings import driver as cu
from criu_gpushare.gpu import copy_engine, driver as drv, memory
from criu_gpushare.gpu.fingerprint import GpuHasher
mark("import")
drv.driver()
mark("cuInit")
memory.use_device(0)
mark("context")
stream = drv.check(cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING), "stream")
events = [drv.check(cu.cuEventCreate(cu.CUevent_flags.CU_EVENT_DISABLE_TIMING), "event") for _ in range(16)]
mark("stream")
hasher = GpuHasher.create(0)
if hasher is None:
    sys.exit("no usable GPU hasher")
mark("hasher")
ring = memory.pin_buffers(copy_engine.CHUNK_SIZE, 16)
mark("ring")
print(json.dumps(marks), flush=True)
"""


def gpu_steps(py, env, runs):
    """{step: median ms} of GPU_STEPS over `runs` fresh interpreters (after one not counted), with
    'exit': the wall time less the steps and the bare interpreter's start."""
    floor = statistics.median(time_once([py, "-c", "pass"], env) for _ in range(runs))
    rows = []
    for n in range(runs + 1):
        t0 = time.monotonic()
        proc = subprocess.run([py, "-c", GPU_STEPS], env=env, cwd=REPO, capture_output=True, text=True)
        wall = time.monotonic() - t0
        if proc.returncode != 0:
            raise RuntimeError(f"GPU steps: exit {proc.returncode}: {proc.stderr.strip()[-300:]}")
        marks = json.loads(proc.stdout.strip().splitlines()[-1])
        marks["exit"] = max(0.0, wall - floor - sum(marks.values()))
        if n:
            rows.append(marks)
    return {k: round(statistics.median(r[k] for r in rows) * 1e3, 1) for k in rows[0]}


def time_once(argv, env, prepare=None):
    if prepare is not None:
        prepare()
    t0 = time.monotonic()
    proc = subprocess.run(argv, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: exit {proc.returncode}: {proc.stderr.strip()[-300:]}")
    return wall


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=10, help="runs per case (the median is reported)")
    ap.add_argument("--python", default=sys.executable, help="the interpreter the tool is installed in")
    ap.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    ap.add_argument("--gpu", action="store_true", help="also the GPU's start, step by step (needs a GPU)")
    args = ap.parse_args(argv)
    member = subprocess.Popen(["sleep", "3600"])  # the resume case's suspended group
    try:
        return run(args, member.pid)
    finally:
        member.kill()
        member.wait()


def run(args, member):
    with tempfile.TemporaryDirectory(prefix="criu-gpushare-startup.") as run_dir:
        os.chmod(run_dir, 0o700)
        os.environ["CRIU_GPUSHARE_RUN_DIR"] = run_dir  # the resume case's journal and holder too
        base = dict(os.environ,
                    PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])))
        images_dir = os.path.join(run_dir, "images")  # an image of ours, as post-restore sees one
        os.mkdir(images_dir)
        os.mkdir(os.path.join(images_dir, "run"), 0o700)
        with open(os.path.join(images_dir, "criu-gpushare.json"), "w") as f:
            json.dump({"format": 1, "gpu_state": False, "store": run_dir, "ref": "-", "gpus": [],
                       "processes": [], "group": {}}, f)
        results = {}
        for name, (cmd, extra, prepare) in cases(args.python, images_dir, member, run_dir).items():
            env = dict(base, **extra)
            time_once(cmd, env, prepare)  # warm the page cache and the bytecode cache: not counted
            runs = [time_once(cmd, env, prepare) for _ in range(args.runs)]
            results[name] = {"median_ms": round(statistics.median(runs) * 1e3, 1),
                             "min_ms": round(min(runs) * 1e3, 1), "max_ms": round(max(runs) * 1e3, 1),
                             "runs": args.runs, "command": " ".join(cmd)}
        steps = gpu_steps(args.python, base, args.runs) if args.gpu else None
    if args.json:
        print(json.dumps(dict(results, **({"gpu_steps_ms": steps} if steps else {})), indent=2))
        return 0
    print(f"{'case':<16} {'median ms':>10} {'min':>8} {'max':>8}  command")
    for name, r in results.items():
        print(f"{name:<16} {r['median_ms']:>10.1f} {r['min_ms']:>8.1f} {r['max_ms']:>8.1f}  {r['command']}")
    if steps:
        print(f"\nGPU start, step by step (median ms of {args.runs} fresh interpreters)")
        for name, ms in steps.items():
            print(f"{name:<12} {ms:>10.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
