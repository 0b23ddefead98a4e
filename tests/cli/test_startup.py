"""Every command pays the tool's start before its first useful step (CRIU's hook once per action):
the command line imports a command's module only when that command runs, and `--help` lists every
command without importing any (bench/startup_bench.py measures the start)."""
import click

from criu_gpushare.cli import COMMANDS, main
from imports import modules_after


def test_help_lists_each_command_with_its_own_help_line():
    """The table `--help` reads is the commands' own first help line, and names their modules."""
    ctx = click.Context(main)
    for name, (_, _, line) in COMMANDS.items():
        cmd = main.get_command(ctx, name)
        assert cmd is not None and cmd.name == name
        assert cmd.get_short_help_str(limit=10**6) == line, name


def test_help_imports_no_command():
    code = ("from criu_gpushare.cli import main\n"
            "try:\n    main(['--help'])\nexcept SystemExit as e:\n    assert not e.code, e.code")
    imported, r = modules_after(code, ["criu_gpushare."])
    assert "suspend" in r.stdout and "restore" in r.stdout
    assert imported == ["criu_gpushare.cli", "criu_gpushare.errors"]


def test_suspend_imports_nothing_of_the_criu_jobs():
    """A suspend's start (before its holder forks) is paid on every in-place cycle: its job imports
    neither CRIU's bindings nor the dump and restore built on them."""
    imported, _ = modules_after("from criu_gpushare.cli import suspend; from criu_gpushare.engine import suspension",
                                ["criu_gpushare.criu", "criu_gpushare.engine.jobs", "criu_gpushare.engine.dump",
                                 "criu_gpushare.engine.restore", "criu_gpushare.engine.record"])
    assert imported == []


def test_finding_a_tree_does_not_import_psutil():
    """Every suspend, dump and restore walks its process tree: the kernel's lists of children do
    it without importing psutil (12-17 ms of a start, bench/RESULTS.md "twenty-eighth"; psutil
    serves kernels without those lists)."""
    imported, _ = modules_after("import os\n"
                                "from criu_gpushare.cli import suspend, checkpoint\n"
                                "from criu_gpushare.engine import suspension, dump, restore\n"
                                "from criu_gpushare.shimctl.processes import process_tree\n"
                                "assert os.getpid() in process_tree(os.getppid())", ["psutil"])
    assert imported == []
