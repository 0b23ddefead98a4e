"""Fixtures of the CRIU front-door tests."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "shim"))
from shimtest import NO_MULTICAST_ENV, REAL_DRIVER  # noqa: E402

from criu_gpushare.shimctl.shimlib import shim_path  # noqa: E402


@pytest.fixture
def env(request, tmp_path):
    """The tool's environment (its own state directory and store) and the workloads' (the shim
    preloaded), over the fake driver, or the real one with CRIU_GPUSHARE_TEST_DRIVER=real."""
    base = dict(os.environ, **NO_MULTICAST_ENV) if REAL_DRIVER else request.getfixturevalue("fake_env")
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    tool = dict(base, CRIU_GPUSHARE_RUN_DIR=str(run_dir), CRIU_GPUSHARE_STORE=str(tmp_path / "store"),
                CRIU_GPUSHARE_CACHE="")
    return {"tool": tool, "app": dict(tool, LD_PRELOAD=shim_path()), "run": run_dir}
