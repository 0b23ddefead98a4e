"""`criu-gpushare suspend PID...` and `criu-gpushare resume PID...`: free a group's GPU memory in place."""
import json
import math
import os
import time

import click

from ..config import load_settings
from ..engine import holder, journal as jn, suspension
from ..engine.steps import Options, format_summary
from ..errors import Interrupted, ProcessError
from ..gpu import devices
from ..shimctl.processes import process_tree, uses_cuda

MAX_TIMEOUT_S = 24 * 3600


def _pids(pids, tree):
    out = []
    for pid in pids:
        if not os.path.exists(f"/proc/{pid}"):
            raise ProcessError(pid, "no such process")
        out.extend(process_tree(pid) if tree else [pid])
    return sorted(set(out))


def _finish(final, as_json, too_late=None):
    """too_late: what to say when the work succeeded after a Ctrl-C asked to cancel it."""
    if as_json:
        click.echo(json.dumps(final["result"] if final["ok"] else final, indent=2))
    elif final["ok"]:
        click.echo(format_summary(final["result"]))
    if final["ok"] and final.get("interrupted") and too_late:
        raise Interrupted(too_late)
    holder.finish(final)


def _timeout(ctx, param, value):
    """Refused before anything changes: a timeout must be a finite number of seconds in range."""
    if not math.isfinite(value) or not 0 < value <= MAX_TIMEOUT_S:
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
@click.option("--timeout", "timeout_s", type=float, default=60.0, show_default=True, callback=_timeout,
              help="Seconds each step may wait on the group (its shims, GPU work draining, the "
                   "driver's lock); README \"Timeouts\".")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def suspend(pids, tree, store, timeout_s, as_json):
    """Free every GPU byte of the processes PIDS (which may share GPU memory), keeping them alive.

    Their GPU memory goes to the chunk store; `criu-gpushare resume` brings it back at the same
    addresses. On failure the workload runs on as before and the failed step is named.
    """
    pids = _pids(pids, tree)
    if not any(uses_cuda(pid) for pid in pids):
        raise ProcessError(", ".join(map(str, pids)), "does not use CUDA: nothing to suspend")
    settings = load_settings({"store": store})
    ref = f"suspend-{min(pids)}-{time.strftime('%Y%m%dT%H%M%S')}"
    journal = jn.Journal.create("suspend", pids, jn.SUSPENDING, store=settings.store, ref=ref,
                                verify=settings.verify, cache=settings.cache,
                                cache_limit=settings.cache_limit)
    options = Options(store=settings.store, timeout_s=timeout_s, ref=ref, verify=settings.verify,
                      cache=settings.cache, cache_limit=settings.cache_limit)
    final = holder.start(suspension.SuspendWork(journal, options),
                         on_progress=lambda m: click.echo(m, err=True), cancellable=True)
    _finish(final, as_json, too_late="the interrupt came once the suspend was done: the group stays "
            f"suspended; `criu-gpushare resume {pids[0]}` brings it back")


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
    mapping = parse_gpu_map(gpu_map)
    journals = {}
    for pid in pids:
        j = jn.owner_of(pid)
        if j is None:
            raise ProcessError(pid, "is not suspended by criu-gpushare")
        journals[j.key] = j
    if len(journals) > 1:
        raise ProcessError(pids[0], "the pids belong to different suspended groups: resume each group")
    verify = load_settings({}).verify
    (journal,) = journals.values()
    final = suspension.resume(journal, mapping, report=lambda m: click.echo(m, err=True), verify=verify)
    _finish(final, as_json)
