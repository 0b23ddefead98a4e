"""`criu-gpushare dump PID DIR` and `criu-gpushare restore DIR`: CRIU with the GPU steps, in one
process (CRIU's RPC notifications are answered here; no action script runs).

dump: pre-dump runs the dump's steps (engine/dump.py), post-dump makes the store durable; once CRIU
returns, processes it left running (--leave-running, or a failed dump) get their GPU state back.
restore: the image and the store are checked before CRIU restores anything, the GPUs while CRIU
restores the processes (post-restore waits for that verdict: a refusal makes CRIU kill what it
restored); once the tree runs, its GPU state comes back (engine/restore.py), and the restored root
pid is printed.
"""
import json
import os

import click

from ..criu import rpc
from ..engine import jobs
from ..engine.results import format_summary
from ..engine.settings import load_settings
from .phases import PhaseClock, format_phases
from .suspend import parse_gpu_map


def _extra_options(ctx, param, items):
    try:
        return rpc.check_extra(items)
    except ValueError as e:
        raise click.BadParameter(str(e), ctx=ctx, param=param) from None


def criu_flags(fn):
    """The CRIU options passed through, each meaning what criu's flag of that name does, and any
    other through --criu-opt (written into CRIU's configuration file for this request)."""
    fn = click.option("--criu-opt", "criu_opt", multiple=True, metavar="OPTION[=VALUE]",
                      callback=_extra_options,
                      help="Any other CRIU option, by its long name (repeatable), e.g. "
                           "--criu-opt ext-mount-map=auto.")(fn)
    for flag in ("manage-cgroups", "file-locks", "ext-unix-sk", "tcp-established", "shell-job"):
        fn = click.option(f"--{flag}", flag.replace("-", "_"), is_flag=True,
                          help=f"CRIU's --{flag}.")(fn)
    return fn


def _passed(kwargs):
    names = ("shell_job", "tcp_established", "ext_unix_sk", "file_locks", "manage_cgroups")
    passed = {n: kwargs.pop(n) for n in names}
    passed["extra"] = kwargs.pop("criu_opt")
    return passed


def _say(message):
    click.echo(message, err=True)


@click.command()
@click.argument("pid", type=int)
@click.argument("images_dir", metavar="DIR", type=click.Path(file_okay=False))
@click.option("--leave-running", is_flag=True, help="Keep the tree running after the dump.")
@click.option("--link-remap/--no-link-remap", default=True, show_default=True,
              help="CRIU's --link-remap: files deleted but still open (the semaphores of Python "
                   "multiprocessing's queues and locks) are dumped through a hard link.")
@click.option("--store", help="Chunk store for the GPU memory (default: settings).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@criu_flags
def dump(pid, images_dir, leave_running, link_remap, store, as_json, **kwargs):
    """Checkpoint the process tree of PID into DIR with CRIU, its GPU memory into the store.

    The processes may share GPU memory. Without --leave-running CRIU kills the tree once it is
    dumped. On failure the tree runs on as before.
    """
    clock = PhaseClock()
    settings = load_settings({"store": store})
    job = jobs.Dump.of_command(pid, images_dir, settings, report=_say)
    summary = job.run(dict(_passed(kwargs), leave_running=leave_running, link_remap=link_remap), clock)
    _print(summary, as_json, f"dumped {pid} into {job.images_dir}")


@click.command()
@click.argument("images_dir", metavar="DIR", type=click.Path(exists=True, file_okay=False))
@click.option("--store", help="Chunk store to read the GPU memory from (default: settings, else the "
                               "dump's).")
@click.option("--gpu-map", "gpu_map", multiple=True, metavar="OLD=NEW",
              help="Restore the GPU with UUID OLD onto the GPU with UUID NEW (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@criu_flags
def restore(images_dir, store, gpu_map, as_json, **kwargs):
    """Restore the tree dumped into DIR, GPU state included; print the restored root pid."""
    clock = PhaseClock()
    settings = load_settings({"store": store, "gpu_map": parse_gpu_map(gpu_map) or None})
    job = jobs.Restore(os.path.realpath(images_dir), settings, report=_say)
    summary = job.run_criu(_passed(kwargs), clock)
    _print(summary, as_json, f"restored {job.images_dir}: root pid {summary['pid']}")
    if not as_json:
        click.echo(summary["pid"])


def _print(summary, as_json, line):
    if as_json:
        click.echo(json.dumps(summary, indent=2))
    else:
        _say(line)
        if summary.get("gpu_state") and summary.get("bytes"):
            _say(format_summary(summary))
        if summary.get("phases"):
            _say(format_phases(summary["phases"]))
