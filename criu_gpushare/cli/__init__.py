"""The `criu-gpushare` command line: one module per command, registered here.

Errors from the package (criu_gpushare.errors.Error) become one line on stderr and their exit code;
anything else is a bug and keeps its traceback. A Ctrl-C that no command turned into its own error
(engine/cancel.py) stopped the command where it was: Interrupted's code.
"""
import sys

import click

from .. import __version__
from ..errors import Error, Interrupted


class _Main(click.Group):
    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            e = Interrupted("interrupted: stopped where it was; `criu-gpushare status` lists any "
                            "process the tool still holds")
        except Error as err:
            e = err
        click.echo(f"criu-gpushare: {e}", err=True)
        sys.exit(e.exit_code)


@click.group(cls=_Main, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="criu-gpushare")
def main():
    """Checkpoint and restore NVIDIA GPU processes, including groups that share GPU memory."""


def _register():
    from . import checkpoint, doctor, run, suspend

    for cmd in (doctor.doctor, run.run, run.shim_path, suspend.suspend, suspend.resume,
                checkpoint.dump, checkpoint.restore):
        main.add_command(cmd)
    import importlib

    # Commands whose modules land one by one; each module defines a click command of its name.
    for name in ("store", "status"):
        try:
            module = importlib.import_module(f".{name}", __name__)
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":
                raise
            continue
        main.add_command(getattr(module, name))


_register()
