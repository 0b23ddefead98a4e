"""`criu-gpushare run -- CMD...` and `criu-gpushare shim-path`."""
import os
import sys

import click

from ..shimctl.shimlib import shim_path as _shim_path


def preload_env(environ, shim):
    """A copy of environ with the shim first in LD_PRELOAD (once)."""
    env = dict(environ)
    rest = [p for p in env.get("LD_PRELOAD", "").replace(":", " ").split() if p != shim]
    env["LD_PRELOAD"] = " ".join([shim] + rest)
    return env


@click.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def run(command):
    """Run COMMAND with the shim preloaded; its exit code is passed through."""
    env = preload_env(os.environ, _shim_path())
    try:
        os.execvpe(command[0], list(command), env)
    except OSError as e:
        click.echo(f"criu-gpushare run: cannot run {command[0]}: {e.strerror}", err=True)
        sys.exit(127 if isinstance(e, FileNotFoundError) else 126)  # as a shell would


@click.command("shim-path")
def shim_path():
    """Print the path of the shim library (for LD_PRELOAD)."""
    click.echo(_shim_path())
