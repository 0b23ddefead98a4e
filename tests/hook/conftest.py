"""Fixtures of the CRIU front-door tests."""
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "shim"))
from shimtest import NO_MULTICAST_ENV, REAL_DRIVER  # noqa: E402

from criu_gpushare.shimctl.shimlib import shim_path  # noqa: E402
from criuwork import kill_tree, share, start_tree, write  # noqa: E402


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


@pytest.fixture(autouse=True)
def no_link_remaps_left(request):
    """CRIU leaves /dev/shm/link_remap.N for an image it never restores (a --leave-running dump,
    a refused restore), and a later dump whose file gets the same N fails ("Can't link remap ...
    File exists"): each test removes the ones it made, so that no test depends on another."""
    import glob
    before = set(glob.glob("/dev/shm/link_remap.*"))
    yield
    for path in set(glob.glob("/dev/shm/link_remap.*")) - before:
        try:
            os.unlink(path)
        except OSError:
            pass


@pytest.fixture
def tree(env, tmp_path, criu):
    """tests/hook/criutree.py's tree: a parent without CUDA, two children a and b sharing `buf`
    (a cuMem fd export, 42) and `ipc` (legacy CUDA IPC of a's cuMemAlloc memory, 7)."""
    parent, (a, b) = start_tree(tmp_path, env["app"])
    share(a, b, tmp_path)
    write(a, "buf", 42)
    a.do("malloc ipc 4194304")  # cuMemAlloc memory the shim backs with cuMem: legacy IPC through it
    b.do(f"ipcopen ipc {a.do('ipcget ipc')['handle']} 4194304")
    write(b, "ipc", 7)
    yield parent, a, b
    kill_tree([a.pid, b.pid, parent.pid])
    try:
        parent.wait(5)
    except subprocess.TimeoutExpired:
        pass
