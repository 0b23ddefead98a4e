"""Every command pays the tool's start before its first useful step (CRIU's hook once per action):
the command line imports a command's module only when that command runs, and `--help` lists every
command without importing any (bench/startup_bench.py measures the start)."""
import subprocess
import sys

import click

from criu_gpushare.cli import COMMANDS, main


def test_help_lists_each_command_with_its_own_help_line():
    """The table `--help` reads is the commands' own first help line, and names their modules."""
    ctx = click.Context(main)
    for name, (_, _, line) in COMMANDS.items():
        cmd = main.get_command(ctx, name)
        assert cmd is not None and cmd.name == name
        assert cmd.get_short_help_str(limit=10**6) == line, name


def test_help_imports_no_command():
    probe = ("import sys; from criu_gpushare.cli import main\n"
             "try:\n    main(['--help'])\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
             "print(sorted(m for m in sys.modules if m.startswith('criu_gpushare.')))")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    listed = r.stdout.splitlines()
    assert "suspend" in "\n".join(listed[:-1]) and "restore" in "\n".join(listed[:-1])
    assert listed[-1] == "['criu_gpushare.cli', 'criu_gpushare.errors']"


def test_suspend_imports_nothing_of_the_criu_jobs():
    """A suspend's start (before its holder forks) is paid on every in-place cycle: its job imports
    neither CRIU's bindings nor the dump and restore built on them."""
    probe = ("import sys; from criu_gpushare.cli import suspend; from criu_gpushare.engine import suspension\n"
             "print(sorted(m for m in sys.modules if m.startswith(('criu_gpushare.criu', "
             "'criu_gpushare.engine.jobs', 'criu_gpushare.engine.dump', 'criu_gpushare.engine.restore', "
             "'criu_gpushare.engine.record'))))")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "[]\n", r.stdout
