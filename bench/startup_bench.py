#!/usr/bin/env python3
"""The tool's fixed start cost: wall time of a fresh interpreter running each entry point.

    python3 bench/startup_bench.py               # median of 10 runs per case, milliseconds
    python3 bench/startup_bench.py --runs 20 --json

CRIU starts the hook (a new Python) for every action of a dump or a restore, most of which it
ignores; each command pays the same start before its first useful step. Cases:
  python     the bare interpreter (`python -c pass`): the floor under every other case
  cli-help   `criu-gpushare --help` (every command registered, none run)
  hook-skip  the hook for an action it ignores (CRTOOLS_SCRIPT_ACTION=network-lock)
  post-restore  the hook's post-restore of an image of ours (it keeps the image's path and the
             root pid for post-resume): the restored tree waits for it
  post-resume   the hook's post-resume with nothing to bring back: the start it pays before it asks
             the restore's holder
  status     `criu-gpushare status` with no workload running (an empty state directory)
No GPU needed; run it on the machine whose figures you want.
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


def cases(py, images_dir):
    hook = "import sys; from criu_gpushare.hook.entry import main; sys.exit(main())"  # its entry point
    restored = {"CRTOOLS_IMAGE_DIR": images_dir, "CRTOOLS_INIT_PID": str(os.getpid())}
    return {
        "python": ([py, "-c", "pass"], {}),
        "cli-help": ([py, "-m", "criu_gpushare.cli", "--help"], {}),
        "hook-skip": ([py, "-c", hook], {"CRTOOLS_SCRIPT_ACTION": "network-lock"}),
        "post-restore": ([py, "-c", hook], dict(restored, CRTOOLS_SCRIPT_ACTION="post-restore")),
        # its own state directory, where post-restore's runs have left nothing to bring back
        "post-resume": ([py, "-c", hook], dict(restored, CRTOOLS_SCRIPT_ACTION="post-resume",
                                               CRIU_GPUSHARE_RUN_DIR=os.path.join(images_dir, "run"))),
        "status": ([py, "-m", "criu_gpushare.cli", "status"], {}),
    }


def time_once(argv, env):
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
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="criu-gpushare-startup.") as run_dir:
        os.chmod(run_dir, 0o700)
        base = dict(os.environ, CRIU_GPUSHARE_RUN_DIR=run_dir,
                    PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])))
        images_dir = os.path.join(run_dir, "images")  # an image of ours, as post-restore sees one
        os.mkdir(images_dir)
        os.mkdir(os.path.join(images_dir, "run"), 0o700)
        with open(os.path.join(images_dir, "criu-gpushare.json"), "w") as f:
            json.dump({"format": 1, "gpu_state": False, "store": run_dir, "ref": "-", "gpus": [],
                       "processes": [], "group": {}}, f)
        results = {}
        for name, (cmd, extra) in cases(args.python, images_dir).items():
            env = dict(base, **extra)
            time_once(cmd, env)  # warm the page cache and the bytecode cache: not counted
            runs = [time_once(cmd, env) for _ in range(args.runs)]
            results[name] = {"median_ms": round(statistics.median(runs) * 1e3, 1),
                             "min_ms": round(min(runs) * 1e3, 1), "max_ms": round(max(runs) * 1e3, 1),
                             "runs": args.runs, "command": " ".join(cmd)}
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print(f"{'case':<12} {'median ms':>10} {'min':>8} {'max':>8}  command")
    for name, r in results.items():
        print(f"{name:<12} {r['median_ms']:>10.1f} {r['min_ms']:>8.1f} {r['max_ms']:>8.1f}  {r['command']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
