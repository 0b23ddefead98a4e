"""`criu-gpushare suspend PID...` and `criu-gpushare resume PID...`: free a group's GPU memory in place.

A resume through the group's holder imports no more than this module's own imports
(engine/resuming.py says why); suspend imports its job (engine/suspension.py) when it runs.
"""
import json
import math

import click

from ..engine import holder, resuming
from ..engine.results import format_summary
from ..engine.settings import load_settings
from ..errors import Interrupted
from ..gpu import devices
from .phases import PhaseClock, format_phases

MAX_TIMEOUT_S = 24 * 3600


def _finish(final, as_json, clock, too_late=None):
    """too_late: what to say when the work succeeded after a Ctrl-C asked to cancel it."""
    if final["ok"]:  # the phases the holder (or the journal's recovery) timed, within the command's
        clock.absorb(final["result"].get("phases", {}), "holder or journal (start, ask, reply)")
        final["result"]["phases"] = clock.result()
    if as_json:
        click.echo(json.dumps(final["result"] if final["ok"] else final, indent=2))
    elif final["ok"]:
        click.echo(format_summary(final["result"]))
        click.echo(format_phases(final["result"]["phases"]))
    if final["ok"] and final.get("interrupted") and too_late:
        raise Interrupted(too_late)
    holder.outcome(final)


def _timeout(ctx, param, value):
    """Refused before anything changes: a timeout must be a finite number of seconds in range."""
    if value is not None and (not math.isfinite(value) or not 0 < value <= MAX_TIMEOUT_S):
        raise click.BadParameter(f"{value!r}: give seconds, more than 0 and at most {MAX_TIMEOUT_S}")
    return value


def parse_gpu_map(items):
    """--gpu-map OLD=NEW (repeatable) -> {OLD: NEW}; a malformed map is a usage error."""
    try:
        return devices.parse_gpu_map(items)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--gpu-map") from None


@click.command()
@click.argument("pids", nargs=-1, type=int, required=True)
@click.option("--tree", is_flag=True, help="Also every descendant of each PID.")
@click.option("--store", help="Chunk store directory (default: settings).")
@click.option("--timeout", "timeout_s", type=float, callback=_timeout,
              help="Seconds each step may wait on the group (its shims, GPU work draining, the "
                   "driver's lock); README \"Timeouts\".  [default: 60]")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def suspend(pids, tree, store, timeout_s, as_json):
    """Free every GPU byte of the processes PIDS (which may share GPU memory), keeping them alive.

    Their GPU memory goes to the chunk store; `criu-gpushare resume` brings it back at the same
    addresses. On failure the workload runs on as before and the failed step is named.
    """
    from ..engine import suspension
    clock = PhaseClock()
    settings = load_settings({"store": store, "timeout_s": timeout_s})
    final = suspension.suspend(pids, settings, tree, report=lambda m: click.echo(m, err=True), mark=clock.mark)
    key = min((final.get("result") or {}).get("pids") or pids)
    _finish(final, as_json, clock, too_late="the interrupt came once the suspend was done: the group "
            f"stays suspended; `criu-gpushare resume {key}` brings it back")


@click.command()
@click.argument("pids", nargs=-1, type=int, required=True)
@click.option("--gpu-map", "gpu_map", multiple=True, metavar="OLD=NEW",
              help="Restore the GPU with UUID OLD onto the GPU with UUID NEW (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def resume(pids, gpu_map, as_json):
    """Bring back processes suspended by `criu-gpushare suspend` (any pid of the group will do).

    If the process that held the group is gone (killed, crashed), the group is resumed from its
    journal and the chunk store by this command.
    """
    clock = PhaseClock()
    settings = load_settings({"gpu_map": parse_gpu_map(gpu_map) or None})
    _finish(resuming.resume(pids, settings, report=lambda m: click.echo(m, err=True), mark=clock.mark),
            as_json, clock)
