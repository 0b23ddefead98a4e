"""The CRIU paths under faults (hooks/README.md, "Faults", is this matrix with its results), through
both doors where the fault applies: `criu-gpushare dump`/`restore` (the wrapper) and `criu
--action-script criu-gpushare-hook` (the hook), on tests/hook/criutree.py's tree.

Dump side: after each fault the tree runs with its GPU memory (contents and sharing checked), the
store holds no ref of the failed dump and verifies, and the next dump and restore work.
Restore side: the tree is absent (nothing half-restored), the image and the store are as they were,
and the same restore, tried again, brings the tree back whole.
"""
import os
import signal
import socket
import sys
import time

import psutil
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "shim"))
from shimtest import fake_only  # noqa: E402

from criudoors import (HOOK, assert_back, cli, door_dump, door_restore, hook_argv, state_files, state_of,
                       wait_gone, wait_no_holder)
from criu_gpushare.engine.record import RECORD_NAME
from criuwork import SockWorkload, reap
from interrupts import paused, paused_env, tool_argv

needs_hook = pytest.mark.skipif(HOOK is None, reason="criu-gpushare-hook is not on PATH (package not installed)")
DOORS = ["wrapper", pytest.param("hook", marks=needs_hook)]


def refs(tmp_path):
    d = tmp_path / "store" / "refs"
    return sorted(p.name for p in d.rglob("*") if p.is_file()) if d.exists() else []


def assert_store_consistent(env, tmp_path):
    v = cli(env, "store", "verify", "--json")
    assert v.returncode == 0, v.stdout + v.stderr


def assert_dumps_again(door, criu, env, tree, tmp_path, value=43, name="again"):
    """The fault left nothing in the way: a new dump and its restore work, contents intact (buf
    holds `value`: assert_back leaves it one up)."""
    parent, a, b = tree
    images = tmp_path / name
    r = door_dump(door, criu, env, parent.pid, images)
    assert r.returncode == 0, r.text[-3000:]
    parent.wait(10)
    reap([a.pid, b.pid])
    r = door_restore(door, criu, env, images)
    assert r.returncode == 0, r.text[-3000:]
    a.wait_ready()
    assert_back(env, a, b, value)


# -- CRIU fails the dump after pre-dump ----------------------------------------------------------


@pytest.mark.parametrize("door", DOORS)
@pytest.mark.parametrize("cause", ["external-socket", "deleted-path"])
def test_criu_failing_after_pre_dump_leaves_the_tree_running_whole(env, tree, tmp_path, criu, door, cause):
    parent, a, b = tree
    if cause == "external-socket":  # a connection to a peer outside the tree
        outside = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        outside.bind(str(tmp_path / "outside.sock"))
        outside.listen(1)
        fd = a.do(f"connect {tmp_path / 'outside.sock'}")["fd"]
        peer, _ = outside.accept()
        r = door_dump(door, criu, env, parent.pid, tmp_path / "images")
        said = "External socket is used"
    else:  # a file open under a path that is gone while the file lives on (another link)
        fd = b.do(f"unlinked {tmp_path / 'held'}")["fd"]
        r = door_dump(door, criu, env, parent.pid, tmp_path / "images", link_remap=False)
        said = "Use link-remap option"
    assert r.returncode != 0 and said in r.text, r.text[-3000:]
    if door == "wrapper":
        assert r.returncode == 11 and "Traceback" not in r.stderr, r.stderr
    wait_gone(env)  # the hook's holder gives the GPU state back once CRIU has exited
    assert_back(env, a, b)
    assert refs(tmp_path) == []
    assert_store_consistent(env, tmp_path)
    if cause == "external-socket":
        a.do(f"closefd {fd}")
    assert_dumps_again(door, criu, env, tree, tmp_path)


# -- CRIU fails before its pre-dump ------------------------------------------------------------
# The wrapper takes the GPU state out while CRIU starts (engine/jobs.py Dump.run); a CRIU that
# fails before it asks for pre-dump must find that undone. A stand-in `criu` answers --version
# and, as `swrk`, exits without a word: at once, or once the GPU steps are done (they write the
# image's record last).

FAILING_CRIU = """#!/bin/sh
case "$1" in
  --version) echo "Version: 4.2.1" ;;
  swrk)
    i=0
    while [ -n "$WAIT_FOR" ] && [ ! -e "$WAIT_FOR" ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done
    echo "stand-in criu: ending before pre-dump" >&2
    exit 1 ;;
esac
"""


@pytest.mark.parametrize("when", ["at-once", "after-the-gpu-steps"])
def test_criu_failing_before_pre_dump_leaves_the_tree_running_whole(env, tree, tmp_path, criu, when):
    parent, a, b = tree
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "criu").write_text(FAILING_CRIU)
    (bindir / "criu").chmod(0o755)
    images = tmp_path / "images"
    images.mkdir()
    failing = dict(env, tool=dict(env["tool"], PATH=f"{bindir}:{env['tool']['PATH']}",
                                  WAIT_FOR=str(images / RECORD_NAME) if when != "at-once" else ""))
    r = cli(failing, "dump", parent.pid, images)
    assert r.returncode == 11 and "Traceback" not in r.stderr, r.stderr
    assert "criu swrk ended without an answer" in r.stderr, r.stderr
    assert "bringing their GPU state back" in r.stderr, r.stderr
    if when != "at-once":  # the GPU steps had run: they were undone
        assert (images / RECORD_NAME).exists()
    assert_back(env, a, b)
    assert refs(tmp_path) == []
    assert_store_consistent(env, tmp_path)
    assert not state_files(env), state_files(env)
    assert_dumps_again("wrapper", criu, env, tree, tmp_path)


# -- a process killed during the dump ----------------------------------------------------------
# Paused at a point (CRIU_GPUSHARE_FAULT=<point>:pause): "stop", the last step of pre-dump (CRIU
# waits for its answer, the tasks not yet seized), or "post-dump" (CRIU has seized and dumped the
# tasks and waits for its answer).


def criu_child(pid):
    """The CRIU process (`criu swrk`, which renames itself) the wrapper process pid runs."""
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            exe = os.path.basename(os.readlink(f"/proc/{entry}/exe"))
        except (OSError, ValueError):
            continue
        if ppid == pid and exe == "criu":
            return int(entry)
    raise AssertionError(f"no CRIU process under {pid}")


def alive(pid):
    """pid runs (a zombie does not)."""
    try:
        return state_of(pid) != "Z"
    except FileNotFoundError:
        return False


def dump_paused(door, criu, env, pid, images, point, pause):
    os.makedirs(images, exist_ok=True)
    argv = (tool_argv(["dump", pid, images]) if door == "wrapper"
            else hook_argv(criu, ["dump", "-t", pid], images, "dump.log"))
    return paused(argv, paused_env(env["tool"], point, pause), pause)


@pytest.mark.parametrize("point", ["stop", "post-dump"])
def test_the_wrapper_killed_during_the_dump_gives_the_tree_back_by_itself(env, tree, tmp_path, criu, point):
    """A dead wrapper cannot give the GPU state back itself: its CRIU, the answer lost, ends the
    dump and lets the tasks go, the checkpointed ones stopped (none runs on missing memory); its
    watch (engine/dumpwatch.py) then resumes them from the journal, with no one asking, and the
    failed dump's ref is dropped."""
    parent, a, b = tree
    pause = tmp_path / "pause"
    with dump_paused("wrapper", criu, env, parent.pid, tmp_path / "images", point, pause) as (proc, _):
        worker = criu_child(proc.pid)
        proc.kill()
        proc.wait()
    reap([worker])  # CRIU ends (its socket closed) and, orphaned, is reaped here
    assert not alive(worker), "CRIU stays after its wrapper died"
    wait_gone(env, timeout=60)
    log = "".join(open(os.path.join(env["run"], n)).read() for n in os.listdir(env["run"])
                  if n.startswith("dumpwatch-"))
    assert "its command died" in log and "resuming from its journal" in log, log
    assert_back(env, a, b)
    assert refs(tmp_path) == []
    assert_store_consistent(env, tmp_path)
    assert_dumps_again("wrapper", criu, env, tree, tmp_path)


def test_a_wrapper_that_ends_on_its_own_stands_its_watch_down(env, tree, tmp_path, criu):
    """The watch acts only when the wrapper dies: a dump that ends by itself leaves no watch
    running and no log of it."""
    parent, a, b = tree
    r = door_dump("wrapper", criu, env, parent.pid, tmp_path / "images")
    assert r.returncode == 0, r.text[-3000:]
    parent.wait(10)
    assert not [n for n in os.listdir(env["run"]) if n.startswith("dumpwatch-")]
    watch = ["-m", "criu_gpushare.engine.dumpwatch", str(min(p.pid for p in tree))]  # this dump's
    assert not [p for p in psutil.process_iter(["cmdline"]) if (p.info["cmdline"] or [])[1:4] == watch]


@pytest.mark.parametrize("door", DOORS)
@pytest.mark.parametrize("point", ["stop", "post-dump"])
def test_criu_killed_during_the_dump_gives_the_tree_back(env, tree, tmp_path, criu, door, point):
    """CRIU dies (before or after it seized and dumped the tasks): the wrapper, or the hook's
    holder watching CRIU, gives the tree its GPU state back; no ref of the dump is left."""
    parent, a, b = tree
    pause = tmp_path / "pause"
    with dump_paused(door, criu, env, parent.pid, tmp_path / "images", point, pause) as (proc, err):
        os.kill(criu_child(proc.pid) if door == "wrapper" else proc.pid, signal.SIGKILL)
        if door == "hook":
            proc.wait()
    said = open(err).read()
    if door == "wrapper":
        assert proc.returncode == 11 and "killed by signal 9" in said, said
        assert "bringing their GPU state back" in said and "Traceback" not in said, said
    wait_gone(env)  # the hook's holder works once CRIU is gone
    assert_back(env, a, b)
    assert refs(tmp_path) == []
    assert_store_consistent(env, tmp_path)
    assert_dumps_again(door, criu, env, tree, tmp_path)


# -- restores that fail --------------------------------------------------------------------------


def image_files(images):
    """name -> bytes of every image file (CRIU's logs and its stats of a restore aside)."""
    return {p.name: p.read_bytes() for p in images.iterdir()
            if p.is_file() and not p.name.endswith(".log") and p.name != "stats-restore"}


def dumped_through(door, criu, env, tree, tmp_path):
    parent, a, b = tree
    images = tmp_path / "images"
    r = door_dump(door, criu, env, parent.pid, images)
    assert r.returncode == 0, r.text[-3000:]
    parent.wait(10)
    return images


def assert_absent(tree, env):
    """Nothing of the tree runs and no state of a restore is left."""
    for pid in (p.pid for p in tree):
        assert not alive(pid), f"pid {pid} is left half-restored"
    assert not state_files(env)
    wait_no_holder(env)  # a hook restore's holder ends with CRIU


@pytest.mark.parametrize("door", DOORS)
@pytest.mark.parametrize("cause", ["pid-taken", "damaged-image"])
def test_a_restore_failing_part_way_leaves_nothing_and_can_be_retried(env, tree, tmp_path, criu, door, cause):
    parent, a, b = tree
    images = dumped_through(door, criu, env, tree, tmp_path)
    before = image_files(images)
    kept = refs(tmp_path)
    if cause == "pid-taken":
        reap([a.pid])  # b's corpse, a zombie child of this test, keeps b's pid taken
    else:
        reap([a.pid, b.pid])
        core = images / f"core-{b.pid}.img"
        core.write_bytes(before[core.name][: len(before[core.name]) // 2])
    r = door_restore(door, criu, env, images)
    assert r.returncode != 0, r.text[-3000:]
    if door == "wrapper":
        assert r.returncode == 11 and "restore of" in r.stderr and "Traceback" not in r.stderr, r.stderr
    reap([parent.pid, a.pid, b.pid])  # what CRIU killed (and b's corpse)
    assert_absent(tree, env)
    if cause == "damaged-image":
        core.write_bytes(before[core.name])
    assert image_files(images) == before and refs(tmp_path) == kept
    assert_store_consistent(env, tmp_path)
    r = door_restore(door, criu, env, images)
    assert r.returncode == 0, r.text[-3000:]
    a.wait_ready()
    assert_back(env, a, b)


@fake_only  # tests/gpu/test_criu_faults_gpu.py fills a real GPU
@pytest.mark.parametrize("door", DOORS)
def test_a_restore_whose_gpu_lacks_memory_restores_nothing_until_there_is_room(env, tree, tmp_path, criu, door):
    parent, a, b = tree
    images = dumped_through(door, criu, env, tree, tmp_path)
    reap([a.pid, b.pid])
    # another process takes all but 2 MiB of the fake GPU's 4096 MiB (the tree needs 8 MiB)
    filler = SockWorkload(env["tool"], tmp_path / "filler.sock")
    try:
        filler.do(f"malloc all {(4096 - 2) << 20}")
        r = door_restore(door, criu, env, images)
    finally:
        filler.kill()
        filler.reap()
    assert r.returncode != 0 and "which has 0.00 GiB free" in r.text, r.text[-3000:]
    if door == "wrapper":
        assert r.returncode == 12 and "Traceback" not in r.stderr, r.stderr
    # refused at post-restore (the GPU check overlaps CRIU's restore): CRIU killed what it restored
    reap([parent.pid, a.pid, b.pid])
    assert_absent(tree, env)
    r = door_restore(door, criu, env, images)
    assert r.returncode == 0, r.text[-3000:]
    a.wait_ready()
    assert_back(env, a, b)


# -- the wrapper killed during a restore ---------------------------------------------------------


def test_the_wrapper_killed_at_post_restore_leaves_nothing_and_the_image_restores_again(env, tree, tmp_path,
                                                                                      criu):
    """It made the journal, then died before CRIU let the tree run: CRIU, its answer lost, kills
    the tree it restored; the journal, abandoned (no process of it, nobody working on it), goes
    when the journals are next read; the same restore brings the tree back."""
    parent, a, b = tree
    images = dumped_through("wrapper", criu, env, tree, tmp_path)
    reap([a.pid, b.pid])
    r = cli(env, "restore", images, fault="post-restore:kill")
    assert r.returncode == -signal.SIGKILL, r.stderr
    reap([parent.pid, a.pid, b.pid])
    status = cli(env, "status")  # reads the journals
    assert status.returncode == 0, status.stderr
    assert_absent(tree, env)
    r = door_restore("wrapper", criu, env, images)
    assert r.returncode == 0, r.text[-3000:]
    a.wait_ready()
    assert_back(env, a, b)


def untraced(pid):
    with open(f"/proc/{pid}/status") as f:
        return next(line for line in f if line.startswith("TracerPid:")).split()[1] == "0"


def test_the_wrapper_killed_as_criu_lets_the_tree_run_leaves_resume_to_finish(env, tree, tmp_path, criu):
    """It dies at CRIU's pre-resume, the journal made at post-restore: CRIU lets the tree go, its
    checkpointed processes stopped (none runs on missing memory), and `criu-gpushare resume`
    brings their GPU state back from the journal."""
    parent, a, b = tree
    images = dumped_through("wrapper", criu, env, tree, tmp_path)
    reap([a.pid, b.pid])
    r = cli(env, "restore", images, fault="pre-resume:kill")
    assert r.returncode == -signal.SIGKILL, r.stderr
    deadline = time.monotonic() + 30
    # CRIU lets them go, stopped (the stop takes effect a moment after): their GPU state is not back
    while not all(untraced(p.pid) and state_of(p.pid) == "T" for p in (a, b)):
        assert time.monotonic() < deadline, (f"after its wrapper died, CRIU keeps the tree seized or "
                                             f"lets it run: {state_of(a.pid)} {state_of(b.pid)}")
        time.sleep(0.05)
    status = cli(env, "status", a.pid)
    assert "its GPU state is not back yet" in status.stdout, status.stdout
    r = cli(env, "resume", a.pid)
    assert r.returncode == 0 and "resuming from its journal" in r.stderr, r.stderr
    a.wait_ready()
    assert_back(env, a, b)
