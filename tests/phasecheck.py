"""The per-phase account every GPU command gives (`--json` "phases"), checked against the command's
wall time as its caller saw it."""
import json
import subprocess
import sys
import time

# The tool's own clock starts with its process (clock ticks: 10 ms); the caller's wall time also
# holds the fork and exec before it and the interpreter's exit after it.
TICK_S = 0.02
EXIT_S = 1.5  # generous: a loaded 2-core machine, never a timing claim


def timed_cli(env, *args, timeout=180):
    """`criu-gpushare ARGS` -> (CompletedProcess, wall seconds seen from here)."""
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "criu_gpushare.cli", *map(str, args)], env=env,
                       capture_output=True, text=True, timeout=timeout)
    return r, time.monotonic() - t0


def assert_phases_cover(r, wall, *names):
    """r: a successful `--json` run. The named phases are there, none is negative, they add up to
    the command's total, and that total is its wall time (less the start and exit around it).
    Returns the phases."""
    assert r.returncode == 0, r.stderr
    phases = dict(json.loads(r.stdout)["phases"])
    total = phases.pop("total")
    missing = [n for n in names if n not in phases]
    assert not missing, f"phases {missing} missing from {phases}"
    assert all(v >= 0 for v in phases.values()), phases
    assert abs(sum(phases.values()) - total) < 0.01 + 0.001 * len(phases), (phases, total)
    assert wall - EXIT_S <= total <= wall + TICK_S, (total, wall, phases)
    assert phases["tool start"] > 0, phases
    print("PROBE phases", json.dumps(phases))
    return phases
