"""Python multiprocessing trees through every CRIU door (tests/hook/mptree.py: queues, an Event,
a CUDA child under the shim). Their semaphores are deleted files still open, which CRIU dumps only
with link-remap: `criu-gpushare dump` turns it on by default, the hook's users add it to CRIU's
options (hooks/runc.conf, hooks/default.conf). After each restore the queues work, the GPU memory
is back, and CRIU's link_remap files are gone."""
import glob
import json
import os
import subprocess
import sys
import time

import pytest

from criudoors import cli
from criuwork import Client, kill_tree
from procs import become_subreaper, reap_children

HERE = os.path.dirname(os.path.abspath(__file__))
HOOK = __import__("shutil").which("criu-gpushare-hook")


@pytest.fixture
def mptree(env, tmp_path, criu):
    become_subreaper()
    sock = tmp_path / "mp.sock"
    proc = subprocess.Popen([sys.executable, os.path.join(HERE, "mptree.py"), str(sock)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True, env=env["app"])
    deadline = time.monotonic() + 60
    while not sock.exists():
        assert proc.poll() is None and time.monotonic() < deadline, "the tree did not start"
        time.sleep(0.05)
    client = Client(sock, proc.pid)
    client.wait_ready()
    pids = client.do("pids")["pids"]
    client.do("write 42")
    yield proc, client, pids
    kill_tree(pids)


def reap_all(timeout=10):
    """Every process CRIU killed, reparented to us: multiprocessing's resource tracker too (a zombie
    still holds the tree's session id, and the restore needs that pid free)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and reap_children():
        time.sleep(0.02)


def assert_phases_add_up(summary, *names):
    """The --json phases cover the whole command: they add up to its total, CRIU's part included."""
    phases = dict(summary["phases"])
    total = phases.pop("total")
    assert all(n in phases for n in names), phases
    assert abs(sum(phases.values()) - total) < 0.01 + 0.001 * len(phases), summary["phases"]


def remaps():
    return sorted(glob.glob("/dev/shm/link_remap.*"))


def assert_back(client, value=42):
    client.wait_ready()
    assert client.do("read")["values"] == [value, value]
    client.do(f"write {value + 1}")  # the queues carry work both ways again
    assert client.do("read")["values"] == [value + 1, value + 1]


def test_the_wrapper_dumps_a_multiprocessing_tree_with_link_remap_by_default(env, mptree, tmp_path):
    proc, client, pids = mptree
    before = remaps()
    images = tmp_path / "images"
    r = cli(env, "dump", proc.pid, images, "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["gpu_state"]
    assert_phases_add_up(out, "criu dump (freeze, memory, images)", "criu start; gpu out: other",
                         "save")
    assert out["criu_stats"]["frozen"] > 0 and out["criu_stats"]["pages_written"] > 0
    proc.wait(10)
    reap_all()
    r = cli(env, "restore", images, "--json")
    assert r.returncode == 0, r.stderr
    back = json.loads(r.stdout)
    assert_phases_add_up(back, "criu restore (processes, host memory)", "gpu back: other", "load")
    assert back["criu_stats"]["restore"] > 0
    assert_back(client)
    assert remaps() == before, "CRIU's link_remap files are left behind"


def test_no_link_remap_gives_criu_s_own_error_and_the_tree_runs_on(env, mptree, tmp_path):
    proc, client, pids = mptree
    r = cli(env, "dump", proc.pid, tmp_path / "images", "--no-link-remap")
    assert r.returncode == 11 and "link-remap" in r.stderr, r.stderr
    assert "rolled back" in r.stderr or "run on" in r.stderr or "bringing their GPU state back" in r.stderr, r.stderr
    assert_back(client)


@pytest.mark.parametrize("bad", ["link-remap", "action-script=/bin/true", "no such", "x=a\"b"])
def test_criu_opt_refuses_what_it_cannot_pass_before_anything_changes(env, mptree, tmp_path, bad):
    proc, client, pids = mptree
    r = cli(env, "dump", proc.pid, tmp_path / "images", "--criu-opt", bad)
    assert r.returncode == 2 and "--criu-opt" in r.stderr, r.stderr
    assert not (tmp_path / "images").exists() or not os.listdir(tmp_path / "images")
    assert client.do("read")["values"] == [42, 42]


def test_criu_opt_reaches_criu(env, mptree, tmp_path):
    """An option CRIU cannot honour here fails the dump the way CRIU says, so it reached CRIU; the
    tree runs on with its GPU memory."""
    proc, client, pids = mptree
    missing = "/sys/fs/cgroup/criu-gpushare-test-no-such-cgroup"
    r = cli(env, "dump", proc.pid, tmp_path / "images", "--criu-opt", f"freeze-cgroup={missing}")
    assert r.returncode == 11, r.stderr
    log = (tmp_path / "images" / "dump.log").read_text()
    assert "freezer.state" in log and "cgroup.freeze" in log, log[-2000:]  # CRIU looked for it
    assert_back(client)


@pytest.mark.skipif(HOOK is None, reason="criu-gpushare-hook is not on PATH (package not installed)")
def test_the_hook_with_link_remap_dumps_and_restores_a_multiprocessing_tree(env, mptree, tmp_path, criu):
    proc, client, pids = mptree
    before = remaps()
    images = tmp_path / "images"
    images.mkdir()
    run = dict(env=env["tool"], capture_output=True, text=True, timeout=180)
    r = subprocess.run([criu, "dump", "-t", str(proc.pid), "-D", str(images), "--action-script", HOOK,
                        "--link-remap", "-o", "dump.log"], **run)
    assert r.returncode == 0, (images / "dump.log").read_text()[-3000:]
    proc.wait(10)
    reap_all()
    r = subprocess.run([criu, "restore", "-d", "-D", str(images), "--action-script", HOOK,
                        "-o", "restore.log"], **run)
    assert r.returncode == 0, (images / "restore.log").read_text()[-3000:]
    assert_back(client)
    assert remaps() == before, "CRIU's link_remap files are left behind"
