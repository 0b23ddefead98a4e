"""`criu-gpushare suspend PID...` and `criu-gpushare resume PID...`: free a group's GPU memory in place."""
import json
import os
import time

import click

from ..engine import holder
from ..config import load_settings
from ..errors import ProcessError
from ..engine.steps import Group, Options, format_summary
from ..shimctl.processes import process_tree


class GroupWork(holder.Work):
    """What the holder runs for one group: suspend at start, then resume or status on request."""

    def __init__(self, pids, options):
        self.pids, self.key, self.options = sorted(pids), min(pids), options
        self.group = None

    def suspend(self, report):
        self.group = Group(self.pids, self.options, report)
        return self.group.suspend()

    def handle(self, cmd, fields, report):
        if cmd == "status":
            return {"state": "suspended", "holder": os.getpid(), "pids": self.pids,
                    "done": list(self.group.done), "ref": self.options.ref}, True
        if cmd == "resume":
            self.group.report = report
            gpu_map = fields.get("gpu_map") or None
            return self.group.resume(gpu_map), False
        raise ProcessError(self.key, f"unknown holder command {cmd!r}")


def _pids(pids, tree):
    out = []
    for pid in pids:
        out.extend(process_tree(pid) if tree else [pid])
        if not os.path.exists(f"/proc/{pid}"):
            raise ProcessError(pid, "no such process")
    return sorted(set(out))


def _finish(final, as_json):
    if as_json:
        click.echo(json.dumps(final["result"] if final["ok"] else final, indent=2))
    elif final["ok"]:
        click.echo(format_summary(final["result"]))
    holder.finish(final)


@click.command()
@click.argument("pids", nargs=-1, type=int, required=True)
@click.option("--tree", is_flag=True, help="Also every descendant of each PID.")
@click.option("--store", help="Chunk store directory (default: settings).")
@click.option("--timeout", "timeout_s", type=float, default=60.0, show_default=True,
              help="Seconds to wait for GPU work to drain and for the driver lock.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def suspend(pids, tree, store, timeout_s, as_json):
    """Free every GPU byte of the processes PIDS (which may share GPU memory), keeping them alive.

    Their GPU memory goes to the chunk store; `criu-gpushare resume` brings it back at the same
    addresses. On failure the workload runs on as before and the failed step is named.
    """
    pids = _pids(pids, tree)
    for pid in pids:
        if holder.holder_key(pid) is not None:
            raise ProcessError(pid, "is already suspended (criu-gpushare resume it first)")
    settings = load_settings({"store": store})
    ref = f"suspend-{min(pids)}-{time.strftime('%Y%m%dT%H%M%S')}"
    options = Options(store=settings.store, timeout_s=timeout_s, ref=ref, verify=settings.verify)
    final = holder.start(GroupWork(pids, options), on_progress=lambda m: click.echo(m, err=True))
    _finish(final, as_json)


@click.command()
@click.argument("pids", nargs=-1, type=int, required=True)
@click.option("--gpu-map", "gpu_map", multiple=True, metavar="OLD=NEW",
              help="Restore the GPU with UUID OLD onto the GPU with UUID NEW (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def resume(pids, gpu_map, as_json):
    """Bring back processes suspended by `criu-gpushare suspend` (any pid of the group will do)."""
    mapping = {}
    for item in gpu_map:
        old, sep, new = item.partition("=")
        if not sep:
            raise click.BadParameter(f"{item!r} is not OLD=NEW", param_hint="--gpu-map")
        mapping[old] = new
    keys = {holder.holder_key(pid) for pid in pids}
    if None in keys:
        missing = [pid for pid in pids if holder.holder_key(pid) is None]
        raise ProcessError(missing[0], "is not suspended by criu-gpushare")
    if len(keys) > 1:
        raise ProcessError(pids[0], "the pids belong to different suspended groups: resume each group")
    final = holder.ask(pids[0], "resume", on_progress=lambda m: click.echo(m, err=True), gpu_map=mapping)
    _finish(final, as_json)
