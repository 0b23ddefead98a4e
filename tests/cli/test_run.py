"""`criu-gpushare run -- CMD`: CMD runs with the shim preloaded and its exit code comes back."""
import subprocess
import sys

from criu_gpushare.shimctl.shimlib import shim_path

CLI = [sys.executable, "-m", "criu_gpushare.cli"]


def test_command_runs_with_the_shim_first_in_ld_preload():
    r = subprocess.run(CLI + ["run", "--", "sh", "-c", 'echo "$LD_PRELOAD"; exit 7'],
                       capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", "LD_PRELOAD": "libother.so"})
    assert r.returncode == 7
    assert r.stdout.split() == [shim_path(), "libother.so"]


def test_command_options_are_not_taken_for_ours():
    r = subprocess.run(CLI + ["run", "--", "sh", "-c", "exit 0", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "Usage" not in r.stdout


def test_missing_command_exits_127_with_its_name():
    r = subprocess.run(CLI + ["run", "--", "no-such-program-xyz"], capture_output=True, text=True)
    assert r.returncode == 127
    assert "no-such-program-xyz" in r.stderr
