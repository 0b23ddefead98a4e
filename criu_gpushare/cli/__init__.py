"""The `criu-gpushare` command line: a module per family of commands (checkpoint.py: dump and
restore; suspend.py: suspend and resume; ...), listed in COMMANDS below and imported only when one
of its commands runs.

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


# name -> (module of this package, its click command, the line `--help` lists). Each command's
# module is imported only when that command runs: the engine, the store and CRIU's bindings cost
# start-up time that `status` or `--help` need not pay. tests/cli/test_startup.py pins each line to
# the command's own help.
COMMANDS = {
    "doctor": ("doctor", "doctor",
               "Check that this machine can checkpoint GPU processes, and say how to fix what fails."),
    "dump": ("checkpoint", "dump",
             "Checkpoint the process tree of PID into DIR with CRIU, its GPU memory into the store."),
    "restore": ("checkpoint", "restore",
                "Restore the tree dumped into DIR, GPU state included; print the restored root pid."),
    "resume": ("suspend", "resume", "Bring back processes suspended by `criu-gpushare suspend` (any pid "
               "of the group will do)."),
    "run": ("run", "run", "Run COMMAND with the shim preloaded; its exit code is passed through."),
    "shim-path": ("run", "shim_path", "Print the path of the shim library (for LD_PRELOAD)."),
    "status": ("status", "status",
               "Show what the shim tracks in process PID (all shim processes if PID is left out)."),
    "store": ("store", "store", "Inspect and maintain the chunk store that holds checkpointed GPU memory."),
    "suspend": ("suspend", "suspend", "Free every GPU byte of the processes PIDS (which may share GPU "
                "memory), keeping them alive."),
}


class _Lazy(_Main):
    def list_commands(self, ctx):
        return sorted(set(COMMANDS) | set(self.commands))

    def get_command(self, ctx, name):
        if name not in self.commands and name in COMMANDS:
            import importlib
            module, attr, _ = COMMANDS[name]
            self.add_command(getattr(importlib.import_module(f".{module}", __name__), attr), name)
        return self.commands.get(name)

    def format_commands(self, ctx, formatter):
        names = self.list_commands(ctx)
        limit = formatter.width - 6 - max(map(len, names))  # as click's own listing
        rows = []
        for name in names:
            loaded = self.commands.get(name)
            rows.append((name, loaded.get_short_help_str(limit) if loaded is not None
                         else click.utils.make_default_short_help(COMMANDS[name][2], limit)))
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=_Lazy, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="criu-gpushare")
def main():
    """Checkpoint and restore NVIDIA GPU processes, including groups that share GPU memory."""
