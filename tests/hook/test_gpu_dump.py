"""GPU groups through CRIU: `criu-gpushare dump`/`restore` (RPC) and `criu dump`/`criu restore
--action-script criu-gpushare-hook`, a tree (a parent without CUDA) whose two CUDA children share
memory through a cuMem fd export and through legacy CUDA IPC; contents and sharing checked after
each way back, the image free of GPU bytes and /dev/nvidia* files. On the fake driver in CI; with
CRIU_GPUSHARE_TEST_DRIVER=real on a GPU (scripts/gpu-tests.sh)."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "shim"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "bench"))
import benchlib as bl  # noqa: E402  (how the bench reads a hooked CRIU run's log)
from shimtest import REAL_DRIVER, fake_only  # noqa: E402

from criudoors import (HOOK, assert_back, assert_nothing_restored, cli, criu_run, dumped, hook_dump,
                       hook_dumped, state_files, state_of, wait_gone)
from criuwork import SockWorkload, kill_tree, reap, share, start_tree, values, write
from interrupts import interrupt, paused_env, wait_until
from phasecheck import TICK_S, assert_phases_cover, timed_cli
from criu_gpushare import waits
from criu_gpushare.engine.record import RECORD_NAME
from criu_gpushare.errors import NoAnswer


def test_wrapper_dump_then_restore(env, tree, tmp_path):
    parent, a, b = tree
    a.do("stack 4096")  # given back while the memory is out, the program's own value after restore
    images = tmp_path / "images"
    r, wall = timed_cli(env["tool"], "dump", parent.pid, images, "--json")
    # where the time went, CRIU's part included, adds up to the whole command
    assert_phases_cover(r, wall, "tool start", "discover", "criu start; gpu out: other", "save", "record",
                        "save: fds from the shims", "save: open memory (import, map)",
                        "save: GPU start (context, stream, hasher)", "save: pin the ring",
                        "store commit (sync, manifest, ref)", "checkpoint",
                        "criu dump (freeze, memory, images)", "sync: store and image (post-dump)", "criu finish")
    parent.wait(10)
    reap([a.pid, b.pid])
    out = json.loads(r.stdout)
    assert out["gpu_state"] and out["bytes"]["copied"] >= 4 << 20
    record = json.loads((images / RECORD_NAME).read_text())
    assert record["ref"] == out["ref"] and record["gpu_state"]
    from criu_gpushare.criu import images as criu_images
    assert criu_images.device_files(str(images)) == []  # no /dev/nvidia* fd in the image
    print(f"PROBE criu_image bytes={out['image_bytes']} gpu_bytes={out['bytes']['copied']}")
    r, wall = timed_cli(env["tool"], "restore", images, "--json")
    assert_phases_cover(r, wall, "tool start", "check (image, store)",
                        "criu restore (processes, host memory)", "check (GPUs, while CRIU restored)",
                        "journal (the restored pids)", "criu resume (tasks run)", "gpu back: other",
                        "restore", "load", "load: fds from the shims", "load: open memory (import, map)",
                        "load: GPU start (context, stream, hasher)", "load: pin the ring", "reopen")
    assert json.loads(r.stdout)["pid"] == parent.pid
    # the fake GPUs (4 GiB) have too little to spare; an H200 has room for the ring
    assert json.loads(r.stdout)["ring_pinned_ahead"] is REAL_DRIVER, r.stdout
    a.wait_ready()
    assert_back(env, a, b)
    assert a.do("stack")["stack"] == 4096


def test_wrapper_restore_pins_the_ring_and_loads_ahead_while_criu_restores(env, tree, tmp_path):
    """With room to spare on the GPU, the restore pins the load's ring and reads the store into
    GPU memory of its own in threads while CRIU restores the processes (engine/restore.py
    pin_ring_ahead, load_ahead); the load copies from there, and the GPU state comes back whole."""
    parent, a, b = tree
    images, _ = dumped(env, tree, tmp_path)
    roomy = dict(env, tool=dict(env["tool"], FAKECUDA_MEM_MB="16384"))
    r = cli(roomy, "restore", images, "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["ring_pinned_ahead"] is True
    assert out["bytes"]["loaded_ahead"] == out["bytes"]["copied"] > 0, out["bytes"]
    assert "load ahead (not overlapped)" in out["phases"], out["phases"]
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
    images = hook_dumped(criu, env, tree, tmp_path, "-v4")
    t0, began = time.monotonic(), time.clock_gettime(time.CLOCK_BOOTTIME)
    r = criu_run(criu, env, ["restore", "-d", "-v4"], images, "restore.log")
    wall = time.monotonic() - t0
    assert r.returncode == 0, (images / "restore.log").read_text()[-4000:]
    a.wait_ready()
    assert_back(env, a, b)
    # where the time went, in CRIU's logs: each action's own share, the GPU steps of both ends
    dumped, restored = (images / "dump.log").read_text(), (images / "restore.log").read_text()
    for log, actions in ((dumped, ("pre-dump", "post-dump")),
                         (restored, ("pre-restore", "post-restore", "post-resume"))):
        for action in actions:
            assert re.search(rf"criu-gpushare-hook: {action}: took \d+\.\d+ s \(program start", log), action
    assert re.search(r"pre-dump: GPU state of 3 process\(es\) out: .*save \d", dumped), dumped[-3000:]
    # CUDA started in the holder beside its imports, not as a step (engine/dump_holder.py)
    assert re.search(r"pre-dump: beside those steps: CUDA start \(bindings, cuInit\) \d", dumped)
    assert not re.search(r"pre-dump: GPU state .*CUDA start", dumped)
    assert re.search(r"post-resume: GPU state of 3 process\(es\) is back: .*load \d", restored)
    # the bench lays that out in order, CRIU's share between the actions included, adding up to
    # the restore seen from here (within a clock tick at the start of each of the three actions)
    phases = bl.hook_phases(restored, wall, began)
    assert ["criu before pre-restore", "criu before post-restore", "criu before post-resume",
            "criu after post-resume"] == [k for k in phases if k.startswith("criu ")], phases
    took = float(re.search(r"post-resume: took (\d+\.\d+) s", restored).group(1))
    own = {k: v for k, v in phases.items() if k.startswith("post-resume: ")}
    assert {"post-resume: start", "post-resume: other"} <= set(own), phases
    assert abs(sum(own.values()) - took) < 0.005, (own, took)  # its steps (here mostly < 5 ms) inside
    assert abs(sum(phases.values()) - wall) <= 4 * TICK_S, (phases, wall)


@pytest.mark.skipif(HOOK is None, reason="criu-gpushare-hook is not on PATH (package not installed)")
def test_the_hooks_restore_holder_pins_the_ring_and_loads_ahead_while_criu_restores(env, tree, tmp_path, criu):
    """pre-restore starts a holder that, while CRIU restores, checks the image, the store and
    the GPUs, then with room to spare pins the load's ring and reads the store into GPU memory of
    its own; post-restore hears that the check
    passed; post-resume has it bring the GPU state back (no cuInit, no ring, no
    chunk check left for post-resume's own process), and it ends with that."""
    parent, a, b = tree
    images = hook_dumped(criu, env, tree, tmp_path)
    roomy = dict(env, tool=dict(env["tool"], FAKECUDA_MEM_MB="16384"))
    r = criu_run(criu, roomy, ["restore", "-d"], images, "restore.log")
    log = (images / "restore.log").read_text()
    assert r.returncode == 0, log[-4000:]
    assert "post-restore: the load's ring was pinned while CRIU restored the processes" in log, log[-4000:]
    a.wait_ready()
    assert_back(env, a, b)  # the holder is gone too
    logs = [open(os.path.join(env["run"], n)).read() for n in os.listdir(env["run"])
            if n.startswith("holder-restore-") and n.endswith(".log")]
    assert len(logs) == 1 and "load..." in logs[0] and "holder done" in logs[0], logs
    assert re.search(r"loaded \d+\.\d+ MiB ahead in", logs[0]), logs  # while CRIU restored


@pytest.mark.skipif(HOOK is None, reason="criu-gpushare-hook is not on PATH (package not installed)")
def test_a_hooked_restore_without_its_holder_brings_the_gpu_state_back_from_the_image(
        env, tree, tmp_path, criu):
    """CRIU's pre-restore runs another program than the hook (here: a script that skips it), so
    no holder serves the restore: post-resume reads the image post-restore named and brings the
    GPU state back in its own process."""
    parent, a, b = tree
    images = hook_dumped(criu, env, tree, tmp_path)
    script = tmp_path / "all-but-pre-restore"
    script.write_text(f'#!/bin/sh\n[ "$CRTOOLS_SCRIPT_ACTION" = pre-restore ] && exit 0\nexec {HOOK}\n')
    script.chmod(0o755)
    r = subprocess.run([criu, "restore", "-d", "-D", str(images), "--action-script", str(script),
                        "-o", "restore.log"], env=env["tool"], capture_output=True, text=True, timeout=180)
    log = (images / "restore.log").read_text()
    assert r.returncode == 0, log[-4000:]
    assert "pre-restore: took" not in log and "post-resume: GPU state of 3 process(es) is back" in log, log[-4000:]
    a.wait_ready()
    assert_back(env, a, b)
    assert not [n for n in os.listdir(env["run"]) if n.startswith(("holder-restore-", "restore-"))
                and not n.endswith(".log")], os.listdir(env["run"])


@pytest.mark.skipif(HOOK is None, reason="criu-gpushare-hook is not on PATH (package not installed)")
def test_hook_dump_leave_running_gives_the_gpu_state_back(env, tree, tmp_path, criu):
    parent, a, b = tree
    images, r = hook_dump(criu, env, parent, tmp_path, "--leave-running")
    assert r.returncode == 0, (images / "dump.log").read_text()[-4000:]
    # the holder resumes the tree once CRIU has let go: a GPU read waits at the gate until then
    assert values(b, "buf") == [42] * 4
    wait_gone(env)
    assert_back(env, a, b)


@pytest.mark.skipif(HOOK is None, reason="criu-gpushare-hook is not on PATH (package not installed)")
def test_the_same_settings_give_the_same_options_through_the_command_and_the_hook(env, tree, tmp_path, criu):
    """Settings from the environment (a store, verify off, a node cache) reach a dump through
    `criu-gpushare dump` and through the hook alike: the image records hold the same options."""
    parent, a, b = tree
    store = tmp_path / "other-store"
    env = dict(env, tool=dict(env["tool"], CRIU_GPUSHARE_STORE=str(store), CRIU_GPUSHARE_VERIFY="0",
                              CRIU_GPUSHARE_CACHE=str(tmp_path / "cache")))
    r = cli(env, "dump", parent.pid, tmp_path / "by-command", "--leave-running")
    assert r.returncode == 0, r.stderr
    images, r = hook_dump(criu, env, parent, tmp_path, "--leave-running")
    assert r.returncode == 0, (images / "dump.log").read_text()[-4000:]
    wait_gone(env)
    options = []
    for where in (tmp_path / "by-command", images):
        record = json.loads((where / RECORD_NAME).read_text())
        assert record["options"]["ref"] == record["ref"]
        options.append({k: v for k, v in record["options"].items() if k != "ref"})
    assert options[0] == options[1]
    assert options[0]["store"] == str(store) and options[0]["verify"] is False
    assert options[0]["timeout_s"] == 60.0 and options[0]["hold_kind"] == "dump"
    assert_back(env, a, b)


def test_ipc_handles_from_before_the_dump_open_in_a_new_importer(env, tree, tmp_path):
    """CUDA IPC handles taken before a dump open after the restore in a process started then: of
    memory below the backing threshold (the driver's own, which its checkpoint restores; the
    shim's record of the handle comes back in CRIU's image of the process) and of backed memory."""
    parent, a, b = tree
    a.do("malloc small 4096")
    write(a, "small", 5)
    handles = {name: a.do(f"ipcget {name}")["handle"] for name in ("small", "ipc")}
    images, _ = dumped(env, tree, tmp_path)
    r = cli(env, "restore", images)
    assert r.returncode == 0, r.stderr
    a.wait_ready()
    late = SockWorkload(env["app"], tmp_path / "late.sock")
    try:
        for name, size, value in (("small", 4096, 5), ("ipc", 4 << 20, 7)):
            late.do(f"ipcopen {name} {handles[name]} {size}")
            assert values(late, name) == [value] * 4, f"{name}: not the exporter's memory"
            write(late, name, value + 1)
            assert values(a, name) == [value + 1] * 4, f"{name}: sharing is not live"
    finally:
        late.kill()
        late.reap()


def test_restore_refuses_an_image_made_without_criu_gpushare(env, tree, tmp_path):
    images, _ = dumped(env, tree, tmp_path)
    (images / RECORD_NAME).unlink()
    r = cli(env, "restore", images)
    assert r.returncode == 12 and "was not dumped through criu-gpushare" in r.stderr, r.stderr
    assert_nothing_restored(*tree[1:])


def test_restore_refuses_a_store_that_lost_a_chunk(env, tree, tmp_path):
    images, out = dumped(env, tree, tmp_path)
    chunks = [p for p in (tmp_path / "store" / "chunks").rglob("*") if p.is_file()]
    chunks[0].unlink()
    r = cli(env, "restore", images)
    assert r.returncode == 6 and "cannot be read" in r.stderr and "nothing was restored" in r.stderr, r.stderr
    assert_nothing_restored(*tree[1:])


@pytest.mark.skipif(HOOK is None, reason="criu-gpushare-hook is not on PATH (package not installed)")
def test_a_hooked_restore_refuses_a_store_that_lost_a_chunk_before_the_tree_runs(env, tree, tmp_path, criu):
    """The holder checks the store while CRIU restores (pre-restore only starts it): post-restore
    refuses, CRIU kills what it restored, nothing is left, and once the chunk is back the same
    restore works."""
    parent, a, b = tree
    images = hook_dumped(criu, env, tree, tmp_path)
    chunk = next(p for p in (tmp_path / "store" / "chunks").rglob("*") if p.is_file())
    aside = tmp_path / "aside"
    chunk.rename(aside)
    r = criu_run(criu, env, ["restore", "-d"], images, "restore.log")
    log = (images / "restore.log").read_text()
    assert r.returncode != 0 and "post-restore:" in log and "cannot be read" in log, log[-3000:]
    reap([parent.pid])  # CRIU killed the tree it restored; the root's zombie first, then theirs
    assert_nothing_restored(a, b)
    assert not state_files(env)
    aside.rename(chunk)
    r = criu_run(criu, env, ["restore", "-d"], images, "restore-again.log")
    assert r.returncode == 0, (images / "restore-again.log").read_text()[-3000:]
    a.wait_ready()
    assert_back(env, a, b)


def test_restore_refuses_a_corrupt_manifest(env, tree, tmp_path):
    images, out = dumped(env, tree, tmp_path)
    manifest = next((tmp_path / "store" / "manifests").rglob("*.json"))
    manifest.write_text(manifest.read_text()[:-20])
    r = cli(env, "restore", images)
    assert r.returncode == 6, r.stderr
    assert_nothing_restored(*tree[1:])


@fake_only
def test_restore_refuses_a_gpu_that_is_not_here(env, tree, tmp_path):
    images, _ = dumped(env, tree, tmp_path)
    other = dict(env, tool=dict(env["tool"], FAKECUDA_UUID_SEED="another machine"))
    r = cli(other, "restore", images)
    assert r.returncode == 12 and "not on this machine" in r.stderr and "--gpu-map" in r.stderr, r.stderr
    assert_nothing_restored(*tree[1:])


@pytest.mark.parametrize("named_by", ["flag", "environment"])
def test_an_image_and_its_store_move_elsewhere(env, tree, tmp_path, named_by):
    """The moved store named by --store, or by CRIU_GPUSHARE_STORE as the hook reads it: either
    comes before the store the dump recorded."""
    parent, a, b = tree
    images, _ = dumped(env, tree, tmp_path)
    moved = tmp_path / "moved"
    moved.mkdir()
    shutil.move(str(images), moved / "images")
    shutil.move(str(tmp_path / "store"), moved / "store")
    if named_by == "flag":
        r = cli(env, "restore", moved / "images", "--store", moved / "store")
    else:
        r = cli(dict(env, tool=dict(env["tool"], CRIU_GPUSHARE_STORE=str(moved / "store"))),
                "restore", moved / "images")
    assert r.returncode == 0, r.stderr
    a.wait_ready()
    assert_back(env, a, b)


def test_a_failed_dump_rolls_back_and_leaves_no_ref(env, tree, tmp_path):
    parent, a, b = tree
    r = cli(env, "dump", parent.pid, tmp_path / "images", fault="release")
    assert r.returncode != 0 and "failed at step release" in r.stderr and "rolled back" in r.stderr, r.stderr
    assert_back(env, a, b)
    refs = tmp_path / "store" / "refs"
    assert not refs.exists() or not list(refs.iterdir())


def test_a_member_someone_stopped_is_refused_at_pre_dump_and_runs_on_once_continued(env, tree, tmp_path):
    """A process stopped by someone else (SIGSTOP) cannot answer its shim or the driver: the dump
    is refused before anything changes, naming it (exit 19), where it used to wait for it."""
    parent, a, b = tree
    os.kill(b.pid, signal.SIGSTOP)
    try:
        wait_until(lambda: waits.stopped(b.pid), f"pid {b.pid} to stop")
        r = cli(env, "dump", parent.pid, tmp_path / "images", "--leave-running", timeout=90)
    finally:
        os.kill(b.pid, signal.SIGCONT)
    assert r.returncode == NoAnswer.exit_code, r.stderr
    assert f"process {b.pid}: is stopped (SIGSTOP)" in r.stderr and "nothing was changed" in r.stderr
    assert_back(env, a, b)
    refs = tmp_path / "store" / "refs"
    assert not refs.exists() or not list(refs.iterdir())


def test_a_tree_where_a_cuda_process_without_the_shim_imports_is_refused(env, tmp_path, criu):
    """The importer runs without the shim: its import cannot come back; refused, both run on."""
    parent, (a, plain) = start_tree(tmp_path, env["app"], plain=[1])
    try:
        share(a, plain, tmp_path)
        write(a, "buf", 42)
        r = cli(env, "dump", parent.pid, tmp_path / "images")
        assert r.returncode == 5 and f"process {plain.pid}" in r.stderr and "without the" in r.stderr, r.stderr
        assert values(plain, "buf") == [42] * 4
        write(plain, "buf", 43)
        assert values(a, "buf") == [43] * 4
        assert not [n for n in os.listdir(env["run"]) if n.startswith(("pid-", "journal-"))]
    finally:
        kill_tree([a.pid, plain.pid, parent.pid])


def test_a_restore_that_fails_after_criu_stays_held_and_resume_finishes_it(env, tree, tmp_path):
    parent, a, b = tree
    images, _ = dumped(env, tree, tmp_path)
    r = cli(env, "restore", images, fault="load")
    assert r.returncode == 15 and "restore failed at step load" in r.stderr, r.stderr
    status = cli(env, "status", a.pid)
    assert "(restore of group" in status.stdout, status.stdout
    r = cli(env, "resume", a.pid)
    assert r.returncode == 0, r.stderr
    assert_back(env, a, b)


@pytest.mark.skipif(HOOK is None, reason="criu-gpushare-hook is not on PATH (package not installed)")
@pytest.mark.parametrize("phase", ["copy", "release", "checkpoint"])
def test_the_hooks_holder_killed_at_pre_dump_is_recovered_by_resume(env, tree, tmp_path, criu, phase):
    parent, a, b = tree
    images, r = hook_dump(criu, env, parent, tmp_path, fault=f"{phase}:kill")
    assert r.returncode != 0  # CRIU aborted the dump: the tree runs, its GPU state in the journal
    log = (images / "dump.log").read_text()
    assert "criu-gpushare resume" in log, log[-3000:]
    r = cli(env, "resume", a.pid)
    assert r.returncode == 0, r.stderr
    assert_back(env, a, b)


@pytest.mark.skipif(HOOK is None, reason="criu-gpushare-hook is not on PATH (package not installed)")
def test_the_hooks_holder_killed_after_post_dump_of_a_leave_running_dump(env, tree, tmp_path, criu):
    parent, a, b = tree
    images, r = hook_dump(criu, env, parent, tmp_path, "--leave-running", fault="post-dump:kill")
    assert r.returncode != 0  # post-dump got no answer: CRIU fails the dump, the tree runs on
    r = cli(env, "resume", b.pid)
    assert r.returncode == 0, r.stderr
    assert_back(env, a, b)


@pytest.mark.skipif(HOOK is None, reason="criu-gpushare-hook is not on PATH (package not installed)")
def test_the_hook_killed_at_post_resume_is_recovered_by_resume(env, tree, tmp_path, criu):
    parent, a, b = tree
    images = hook_dumped(criu, env, tree, tmp_path)
    r = criu_run(criu, env, ["restore", "-d"], images, "restore.log", "load:kill")
    assert r.returncode == 0, (images / "restore.log").read_text()[-3000:]  # CRIU only logs it
    a.wait_ready()
    status = cli(env, "status", a.pid)
    assert "(restore of group" in status.stdout, status.stdout
    r = cli(env, "resume", a.pid)
    assert r.returncode == 0, r.stderr
    assert_back(env, a, b)


@pytest.mark.skipif(HOOK is None, reason="criu-gpushare-hook is not on PATH (package not installed)")
def test_a_restore_holder_killed_at_post_resume_leaves_the_hook_to_finish(env, tree, tmp_path, criu):
    """The restore's holder dies in the load (as a crash would): the hook's post-resume finishes
    the work from the journal the holder made at post-restore, and the tree runs with its GPU
    state, no command needed."""
    parent, a, b = tree
    images = hook_dumped(criu, env, tree, tmp_path)
    fired = tmp_path / "fired"
    r = criu_run(criu, env, ["restore", "-d"], images, "restore.log", "load:kill", once=fired)
    log = (images / "restore.log").read_text()
    assert r.returncode == 0, log[-3000:]
    assert fired.exists(), "the fault never fired: the holder was not killed"
    assert "resuming from its journal" in log and "is back" in log, log[-3000:]
    a.wait_ready()
    assert_back(env, a, b)


@pytest.mark.skipif(HOOK is None, reason="criu-gpushare-hook is not on PATH (package not installed)")
def test_a_restore_holder_killed_at_post_restore_fails_the_restore_and_loses_nothing(env, tree,
                                                                                  tmp_path, criu):
    """Killed at post-restore, its journal made: CRIU kills the tree it restored, the journal goes
    with it, and the image restores again."""
    parent, a, b = tree
    images = hook_dumped(criu, env, tree, tmp_path)
    r = criu_run(criu, env, ["restore", "-d"], images, "restore.log", "post-restore:kill")
    log = (images / "restore.log").read_text()
    assert r.returncode != 0 and "closed the connection without an answer" in log, log[-3000:]
    reap([parent.pid])  # CRIU killed the tree it restored; the root's zombie first, then theirs
    assert_nothing_restored(a, b)
    assert not state_files(env), "the journal made at post-restore outlived the restore"
    r = criu_run(criu, env, ["restore", "-d"], images, "restore-again.log")
    assert r.returncode == 0, (images / "restore-again.log").read_text()[-3000:]
    a.wait_ready()
    assert_back(env, a, b)


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MiB tmpfs for the store: full before a 4 MiB allocation is saved."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {r.stderr.strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)])


def test_a_full_disk_during_the_dump_rolls_back_and_the_store_stays_consistent(env, tree, tmp_path, small_disk):
    parent, a, b = tree
    store = small_disk / "store"
    r = cli(env, "dump", parent.pid, tmp_path / "images", "--store", store)
    assert r.returncode == 6 and "rolled back" in r.stderr, r.stderr
    assert_back(env, a, b)
    v = cli(env, "store", "--store", store, "verify", "--json")
    assert v.returncode == 0, v.stdout + v.stderr


def test_cuda_processes_without_the_shim_that_share_nothing_take_the_driver_path(env, tmp_path, criu):
    """No shim, nothing shared: the driver checkpoints them and their GPU bytes go into CRIU's
    image; the restore brings them back through the driver."""
    parent, (a, b) = start_tree(tmp_path, env["app"], plain=[0, 1])
    try:
        a.do("malloc x 4194304")
        write(a, "x", 11)
        b.do("malloc y 4194304")
        write(b, "y", 12)
        images = tmp_path / "images"
        r = cli(env, "dump", parent.pid, images, "--json")
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        assert out["gpu_state"] and out["bytes"]["copied"] == 0  # nothing through the store
        parent.wait(10)
        reap([a.pid, b.pid])
        r = cli(env, "restore", images)
        assert r.returncode == 0, r.stderr
        a.wait_ready()
        assert values(a, "x") == [11] * 4 and values(b, "y") == [12] * 4
    finally:
        kill_tree([a.pid, b.pid, parent.pid])


@fake_only  # on the GPU the importer is left CHECKPOINTED for good: tests/probes prove that there
def test_the_same_sharing_tree_without_the_shim_fails_the_driver_way(env, tmp_path, criu):
    """Without the shim nobody releases the import: the driver checkpoints both, but cannot bring
    the importer back (the restore fails and says where)."""
    parent, (a, b) = start_tree(tmp_path, env["app"], plain=[0, 1])
    try:
        share(a, b, tmp_path)
        write(a, "buf", 42)
        images = tmp_path / "images"
        r = cli(env, "dump", parent.pid, images)
        if r.returncode == 0:
            parent.wait(10)
            reap([a.pid, b.pid])
            r = cli(env, "restore", images)
            assert r.returncode == 15 and "restore failed at step restore" in r.stderr, r.stderr
        else:
            assert "CRIU" in r.stderr, r.stderr
        print(f"PROBE driver_way_sharing_tree exit={r.returncode}")
    finally:
        kill_tree([a.pid, b.pid, parent.pid])


def test_stream_ordered_memory_through_the_wrapper(env, tree, tmp_path):
    """cuMemAllocAsync memory goes to the store with the rest and comes back at its address;
    after the restore the pool serves and reuses as before."""
    parent, a, b = tree
    ptr = a.do(f"allocasync pooled {4 << 20}")["ptr"]
    write(a, "pooled", 31)
    images, out = dumped(env, tree, tmp_path)
    assert out["bytes"]["copied"] >= 3 * (4 << 20)  # buf, ipc and the pooled block
    r = cli(env, "restore", images)
    assert r.returncode == 0, r.stderr
    a.wait_ready()
    assert values(a, "pooled") == [31] * 4
    assert_back(env, a, b)
    a.do("freeasync pooled")
    assert a.do(f"allocasync again {4 << 20}")["ptr"] == ptr


# -- no thread of a checkpointed process runs until its driver restore ----------------------------
# A reader thread loops over page-locked host memory the driver itself owns (allocated past the
# shim, as a runtime's own buffers are), which the driver checkpoint unmaps (the fake as the real
# driver): if it ran anywhere between the driver checkpoint and the driver restore (before CRIU
# seizes the tree, after CRIU restores it or lets it go), the process would die.


@pytest.fixture
def reading(tree):
    if REAL_DRIVER:
        pytest.skip("the real driver's internal buffers cannot be asked for: on the GPU, "
                    "tests/gpu/test_criu_trees.py proves the window with JAX's runtime threads")
    parent, a, b = tree
    for w in (a, b):
        w.do("driverhost pinned 1048576")
        w.do("hostfill pinned 77")
        w.do("reader pinned")
    return tree


def assert_readers_ran_on(*workloads):
    import time
    for w in workloads:
        before = w.do("readers")["reads"]
        deadline = time.monotonic() + 10
        while w.do("readers")["reads"] <= before:
            assert time.monotonic() < deadline, f"the reader thread of {w.pid} does not run"
            time.sleep(0.02)
        assert w.do("readers")["value"] == 2 * 77


def test_no_thread_runs_while_checkpointed_through_the_wrapper(env, reading, tmp_path):
    parent, a, b = reading
    images, _ = dumped(env, reading, tmp_path)
    r = cli(env, "restore", images)
    assert r.returncode == 0, r.stderr
    a.wait_ready()
    assert_readers_ran_on(a, b)
    assert_back(env, a, b)


def test_no_thread_runs_while_checkpointed_through_the_wrapper_leave_running(env, reading, tmp_path):
    parent, a, b = reading
    r = cli(env, "dump", parent.pid, tmp_path / "images", "--leave-running")
    assert r.returncode == 0, r.stderr
    assert_readers_ran_on(a, b)
    assert_back(env, a, b)


@pytest.mark.skipif(HOOK is None, reason="criu-gpushare-hook is not on PATH (package not installed)")
@pytest.mark.parametrize("leave_running", [False, True])
def test_no_thread_runs_while_checkpointed_through_the_hook(env, reading, tmp_path, criu, leave_running):
    parent, a, b = reading
    images, r = hook_dump(criu, env, parent, tmp_path, *(["--leave-running"] if leave_running else []))
    assert r.returncode == 0, (images / "dump.log").read_text()[-4000:]
    if leave_running:
        wait_gone(env)
    else:
        parent.wait(10)
        reap([a.pid, b.pid])
        r = criu_run(criu, env, ["restore", "-d"], images, "restore.log")
        assert r.returncode == 0, (images / "restore.log").read_text()[-4000:]
        a.wait_ready()
    assert_readers_ran_on(a, b)
    assert_back(env, a, b)


@pytest.mark.skipif(HOOK is None, reason="criu-gpushare-hook is not on PATH (package not installed)")
def test_a_dump_that_fails_after_pre_dump_leaves_the_tree_running_with_its_memory(env, reading, tmp_path, criu):
    parent, a, b = reading
    images, r = hook_dump(criu, env, parent, tmp_path, fault="post-dump")
    assert r.returncode != 0  # post-dump failed: CRIU fails the dump and lets the tree go
    wait_gone(env)
    assert_readers_ran_on(a, b)
    assert_back(env, a, b)


def test_a_failed_driver_restore_leaves_the_processes_stopped_until_resume(env, reading, tmp_path):
    parent, a, b = reading
    images, _ = dumped(env, reading, tmp_path)
    r = cli(env, "restore", images, fault="driver-restore")
    assert r.returncode == 15 and "restore failed at step restore" in r.stderr, r.stderr
    for w in (a, b):  # stopped, not running on memory the driver has not brought back
        assert state_of(w.pid) == "T", f"pid {w.pid} runs while its GPU state is checkpointed"
    r = cli(env, "resume", a.pid)
    assert r.returncode == 0, r.stderr
    assert_readers_ran_on(a, b)
    assert_back(env, a, b)


@pytest.mark.skipif(HOOK is None, reason="criu-gpushare-hook is not on PATH (package not installed)")
def test_a_failed_gpu_restore_through_the_hook_is_said_plainly(env, reading, tmp_path, criu):
    parent, a, b = reading
    images = hook_dumped(criu, env, reading, tmp_path)
    r = criu_run(criu, env, ["restore", "-d"], images, "restore.log", "driver-restore")
    assert r.returncode == 0  # CRIU ignores post-resume's exit
    log = (images / "restore.log").read_text()
    assert "GPU state NOT restored" in log and "criu-gpushare resume" in log, log[-3000:]
    assert state_of(a.pid) == "T" and state_of(b.pid) == "T"
    status = cli(env, "status", a.pid)
    assert "restore failed" in status.stdout, status.stdout
    r = cli(env, "resume", a.pid)
    assert r.returncode == 0, r.stderr
    assert_readers_ran_on(a, b)
    assert_back(env, a, b)


@fake_only
def test_dump_to_s3_and_two_nodes_restore_it_through_their_own_caches(env, tree, tmp_path,
                                                                      s3_server, s3_store_url):
    """`dump --store s3://...`, then two "nodes" (each its own state directory and node cache,
    warmed by `store prefetch`) restore the same image from the bucket, one after the other.
    No secret reaches any output, record or state file."""
    from s3server import SECRET_KEY
    aws = {k: v for k, v in s3_server.env().items() if k.startswith("AWS_")}
    for k in ("tool", "app"):
        env[k].update(aws)
    parent, a, b = tree
    images = tmp_path / "images"
    r = cli(env, "dump", parent.pid, images, "--json", "--store", s3_store_url)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["store"] == s3_store_url
    outputs = [r.stdout + r.stderr]
    parent.wait(10)
    reap([a.pid, b.pid])
    for node in ("node-a", "node-b"):
        run = tmp_path / node
        run.mkdir(mode=0o700)
        node_env = {"tool": dict(env["tool"], CRIU_GPUSHARE_RUN_DIR=str(run),
                                 CRIU_GPUSHARE_STORE=s3_store_url,
                                 CRIU_GPUSHARE_CACHE=str(tmp_path / f"cache-{node}"))}
        r = cli(node_env, "store", "prefetch", "--json")
        assert r.returncode == 0 and json.loads(r.stdout)["fetched"] >= 1, r.stderr
        outputs.append(r.stdout + r.stderr)
        r = cli(node_env, "restore", images, "--json")
        assert r.returncode == 0, r.stderr
        outputs.append(r.stdout + r.stderr)
        a.wait_ready()
        assert values(a, "buf") == [42] * 4 and values(b, "buf") == [42] * 4
        assert values(a, "ipc") == [7] * 4
        write(b, "buf", 43)  # shared again
        assert values(a, "buf") == [43] * 4
        outputs += [p.read_text(errors="replace") for p in run.rglob("*") if p.is_file()]
        kill_tree([a.pid, b.pid, parent.pid])
        reap([parent.pid, a.pid, b.pid])
    outputs += [(images / RECORD_NAME).read_text()]
    assert not [o for o in outputs if SECRET_KEY in o]


def test_ctrl_c_on_dump_cancels_and_rolls_back(env, tree, tmp_path):
    """The first Ctrl-C cancels before the dump's next step: rolled back, CRIU's dump failed, no
    ref left (exit 17)."""
    parent, a, b = tree
    pause = tmp_path / "pause"
    r = interrupt(["dump", parent.pid, tmp_path / "images"], paused_env(env["tool"], "save", pause), pause)
    assert r.returncode == 17, r.stderr
    assert "dump cancelled by an interrupt at step unkeep" in r.stderr and "rolled back" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and "Aborted" not in r.stderr
    assert_back(env, a, b)
    refs = tmp_path / "store" / "refs"
    assert not refs.exists() or not list(refs.iterdir())


def test_ctrl_c_on_restore_once_criu_began_lets_it_finish(env, tree, tmp_path):
    parent, a, b = tree
    images, _ = dumped(env, tree, tmp_path)
    pause = tmp_path / "pause"
    r = interrupt(["restore", images], paused_env(env["tool"], "load", pause), pause)
    assert r.returncode == 0, r.stderr
    assert "interrupt: the restore goes on" in r.stderr
    a.wait_ready()
    assert_back(env, a, b)
