"""`criu-gpushare dump PID DIR` and `criu-gpushare restore DIR`: CRIU with the GPU steps, in one
process (CRIU's RPC notifications are answered here; no action script runs).

dump: pre-dump runs the dump's steps (engine/dump.py), post-dump makes the store durable; once CRIU
returns, processes it left running (--leave-running, or a failed dump) get their GPU state back.
restore: pre-restore checks the image, the store and the GPUs before CRIU restores anything; once
the tree runs, its GPU state comes back (engine/restore.py), and the restored root pid is printed.
"""
import json
import os
import shutil

import click

from ..config import load_settings
from ..criu import images, libdir, rpc
from ..engine import cancel, dump as dump_engine, restore as restore_engine
from ..engine.steps import format_summary
from ..errors import Cancelled, Interrupted, ProcessError
from .phases import PhaseClock, format_phases
from .suspend import parse_gpu_map


def _criu_options(ctx_opts, **more):
    plugins = libdir.plugin_dir_without_cuda()  # CRIU's CUDA plugin must not touch our tasks
    return rpc.CriuOptions(libdir=plugins, **ctx_opts, **more), plugins


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
    if not os.path.exists(f"/proc/{pid}"):
        raise ProcessError(pid, "no such process")
    os.makedirs(images_dir, exist_ok=True)
    images_dir = os.path.realpath(images_dir)
    settings = load_settings({"store": store})
    options, plugins = _criu_options(_passed(kwargs), leave_running=leave_running,
                                     link_remap=link_remap)
    interrupt = cancel.Cancel()  # Ctrl-C: engine/cancel.py
    job = dump_engine.DumpJob(pid, images_dir, settings.store, verify=settings.verify, report=_say,
                              cancel=interrupt)
    state = {"gpu": False}

    def on_notify(action, _pid):
        if action == "pre-dump":
            clock.mark("criu start")
            state["gpu"] = job.begin()
            clock.absorb(job.group.phases() if state["gpu"] else {}, "gpu out: plan, journal, record")
        elif action == "post-dump":
            if interrupt.requested():  # CRIU then fails the dump and lets the tree run on
                raise Cancelled(f"dump of {pid} cancelled by an interrupt at CRIU's post-dump: the tree "
                                "runs on as before")
            if state["gpu"]:
                clock.mark("criu dump (freeze, memory, images)")
                job.complete()
                clock.mark("store sync (post-dump)")

    def first_interrupt():
        interrupt.request()
        _say("interrupt: cancelling the dump at its next step (or at CRIU's post-dump), then rolling "
             "back (Ctrl-C again interrupts the step at once)")

    try:
        with cancel.on_interrupt(first_interrupt):
            criu_ok = False
            try:
                rpc.dump(images_dir, pid, options, on_notify)
                criu_ok = True
                clock.mark("criu finish")
            finally:
                if plugins:
                    shutil.rmtree(plugins, ignore_errors=True)
                if state["gpu"]:
                    job.after_criu(criu_ok)
                    clock.mark("gpu back (tasks run on)")
    except KeyboardInterrupt:  # the second Ctrl-C, in CRIU's dump: CRIU was stopped, the tree let go
        raise Cancelled(f"dump of {pid} interrupted: CRIU was stopped, the tree runs on as before") from None
    if interrupt.requested():
        raise Interrupted(f"the interrupt came once the dump was done: {images_dir} holds it"
                          + ("" if leave_running else " and the tree has ended"))
    summary = job.group.summary("dumped") if state["gpu"] else {"state": "dumped", "pids": [], "seconds": {}}
    summary.update(phases=clock.result(), criu_stats=images.stats(images_dir, "dump"))
    summary.update(images_dir=images_dir, image_bytes=_image_bytes(images_dir),
                   gpu_state=state["gpu"], left_running=leave_running)
    if state["gpu"]:
        summary.update(store=settings.store, ref=job.ref)
    _print(summary, as_json, f"dumped {pid} into {images_dir}")


@click.command()
@click.argument("images_dir", metavar="DIR", type=click.Path(exists=True, file_okay=False))
@click.option("--store", help="Chunk store to read the GPU memory from (default: the dump's).")
@click.option("--gpu-map", "gpu_map", multiple=True, metavar="OLD=NEW",
              help="Restore the GPU with UUID OLD onto the GPU with UUID NEW (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@criu_flags
def restore(images_dir, store, gpu_map, as_json, **kwargs):
    """Restore the tree dumped into DIR, GPU state included; print the restored root pid."""
    clock = PhaseClock()
    images_dir = os.path.realpath(images_dir)
    mapping = parse_gpu_map(gpu_map)
    settings = load_settings({})
    try:
        rec = restore_engine.check(images_dir, store, mapping, lambda: images.maps_libcuda(images_dir))
    except KeyboardInterrupt:
        raise Cancelled(f"restore of {images_dir} interrupted before CRIU began: nothing was restored") from None
    options, plugins = _criu_options(_passed(kwargs))
    clock.mark("check (image, store, GPUs)")
    # Once CRIU restores, nothing takes it back: an interrupt says so and the restore goes on.
    with cancel.on_interrupt(lambda: _say(cancel.GOES_ON.format("restore"))):
        try:
            root = rpc.restore(images_dir, options)
            clock.mark("criu restore (processes, host memory)")
        finally:
            if plugins:
                shutil.rmtree(plugins, ignore_errors=True)
        summary = {"state": "restored", "pid": root, "pids": [], "seconds": {}, "gpu_state": rec is not None}
        if rec is not None:
            summary.update(restore_engine.run(rec, root, store, mapping, settings.verify, report=_say,
                                              cache=settings.cache, cache_limit=settings.cache_limit))
            summary["pid"] = root
            clock.absorb(summary.get("phases", {}), "gpu back: plan, journal")
    summary.update(phases=clock.result(), criu_stats=images.stats(images_dir, "restore"))
    _print(summary, as_json, f"restored {images_dir}: root pid {root}")
    if not as_json:
        click.echo(root)


def _image_bytes(images_dir):
    return sum(e.stat().st_size for e in os.scandir(images_dir) if e.is_file())


def _print(summary, as_json, line):
    if as_json:
        click.echo(json.dumps(summary, indent=2))
    else:
        _say(line)
        if summary.get("gpu_state") and summary.get("bytes"):
            _say(format_summary(summary))
        if summary.get("phases"):
            _say(format_phases(summary["phases"]))
