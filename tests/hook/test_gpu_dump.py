"""GPU groups through CRIU on the fake driver: `criu-gpushare dump`/`restore` (RPC) and
`criu dump`/`criu restore --action-script criu-gpushare-hook`, a tree whose two CUDA children share
memory through a cuMem fd export; contents and sharing checked after each way back."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from criuwork import kill_tree, reap, share, start_tree, values, write
from criu_gpushare.engine.record import RECORD_NAME
from criu_gpushare.shimctl.shimlib import shim_path

HOOK = shutil.which("criu-gpushare-hook")


@pytest.fixture
def env(fake_env, tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    tool = dict(fake_env, CRIU_GPUSHARE_RUN_DIR=str(run_dir), CRIU_GPUSHARE_STORE=str(tmp_path / "store"),
                CRIU_GPUSHARE_CACHE="")
    return {"tool": tool, "app": dict(tool, LD_PRELOAD=shim_path()), "run": run_dir}


@pytest.fixture
def tree(env, tmp_path, criu):
    parent, (a, b) = start_tree(tmp_path, env["app"])
    share(a, b, tmp_path)
    write(a, "buf", 42)
    yield parent, a, b
    kill_tree([a.pid, b.pid, parent.pid])
    try:
        parent.wait(5)
    except subprocess.TimeoutExpired:
        pass


def cli(env, *args, timeout=180):
    return subprocess.run([sys.executable, "-m", "criu_gpushare.cli", *map(str, args)], env=env["tool"],
                          capture_output=True, text=True, timeout=timeout)


def assert_back(env, a, b, value=42):
    assert values(b, "buf") == [value] * 4 and values(a, "buf") == [value] * 4
    write(b, "buf", value + 1)
    assert values(a, "buf") == [value + 1] * 4, "sharing is not live"
    assert not [n for n in os.listdir(env["run"]) if n.startswith(("pid-", "journal-", "restore-"))]


def test_wrapper_dump_then_restore(env, tree, tmp_path):
    parent, a, b = tree
    images = tmp_path / "images"
    r = cli(env, "dump", parent.pid, images, "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["gpu_state"] and out["bytes"]["copied"] >= 4 << 20
    parent.wait(10)  # CRIU killed the tree: reap it, freeing its pids
    reap([a.pid, b.pid])
    record = json.loads((images / RECORD_NAME).read_text())
    assert record["ref"] == out["ref"] and record["gpu_state"]
    r = cli(env, "restore", images, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["pid"] == parent.pid
    a.wait_ready()
    assert_back(env, a, b)


def test_wrapper_dump_leave_running(env, tree, tmp_path):
    parent, a, b = tree
    r = cli(env, "dump", parent.pid, tmp_path / "images", "--leave-running")
    assert r.returncode == 0, r.stderr
    assert_back(env, a, b)


@pytest.mark.skipif(HOOK is None, reason="criu-gpushare-hook is not on PATH (package not installed)")
def test_hook_dump_then_restore(env, tree, tmp_path, criu):
    parent, a, b = tree
    images = tmp_path / "images"
    images.mkdir()
    r = subprocess.run([criu, "dump", "-t", str(parent.pid), "-D", str(images), "--action-script", HOOK,
                        "-o", "dump.log", "-v4"], env=env["tool"], capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, (images / "dump.log").read_text()[-4000:]
    parent.wait(10)
    reap([a.pid, b.pid])
    r = subprocess.run([criu, "restore", "-D", str(images), "-d", "--action-script", HOOK,
                        "-o", "restore.log", "-v4"], env=env["tool"], capture_output=True, text=True,
                       timeout=180)
    assert r.returncode == 0, (images / "restore.log").read_text()[-4000:]
    a.wait_ready()
    assert_back(env, a, b)
