"""Fixtures of the CLI tests: `criu-gpushare` run as a user runs it, in its own process, with a
state directory and an empty config file of the test's own (the store: the command's, or the
record's)."""
import os
import subprocess
import sys

import pytest


@pytest.fixture
def env(tmp_path):
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    (tmp_path / "config.toml").write_text("")  # no node-wide settings
    env = dict(os.environ, CRIU_GPUSHARE_RUN_DIR=str(run), CRIU_GPUSHARE_CONFIG=str(tmp_path / "config.toml"))
    env.pop("CRIU_GPUSHARE_STORE", None)
    return env


@pytest.fixture
def cli():
    """cli(env, *args) -> CompletedProcess (text); a traceback is never what a user gets."""
    def run(env, *args):
        r = subprocess.run([sys.executable, "-m", "criu_gpushare.cli", *map(str, args)], env=env,
                           capture_output=True, text=True, timeout=60)
        assert "Traceback" not in r.stderr, r.stderr
        return r
    return run
