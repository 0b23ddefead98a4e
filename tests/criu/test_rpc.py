"""criu_gpushare.criu.rpc: dumps and restores through `criu swrk`, notifications, errors."""
from __future__ import annotations

import os
import signal
import stat
import sys
import time

import pytest

from criu_gpushare.criu import images, rpc
from criu_gpushare.errors import CriuError
from criutest import alive, children_named, counter, dies, runs, sleeper, state, status_field

# CRIU 4.2.1's notifications for a tree without namespaces of its own, in order (CRIU's
# test/others/action-script/check_actions.py pins the same for a tree with them, which adds
# network-lock/-unlock and setup-namespaces/post-setup-namespaces). query-ext-files exists in RPC
# mode only: CRIU asks the client for external files to add.
DUMP_ACTIONS = ["pre-dump", "query-ext-files", "post-dump"]
RESTORE_ACTIONS = ["pre-restore", "post-restore", "pre-resume", "post-resume"]


class Recorder:
    """An on_notify callback that records (action, pid, the dumped process's state), and can
    raise at one action."""

    def __init__(self, watched_pid: int, fail_at: str | None = None, error=RuntimeError):
        self.watched_pid = watched_pid
        self.fail_at = fail_at
        self.error = error
        self.calls = []

    def __call__(self, action, pid):
        self.calls.append((action, pid, state(self.watched_pid)))
        if action == self.fail_at:
            raise self.error(f"refused at {action}")

    @property
    def actions(self):
        return [action for action, _, _ in self.calls]


def images_dir(tmp_path):
    path = tmp_path / "images"
    path.mkdir(exist_ok=True)
    return str(path)


def test_dump_notifies_each_action_in_order_then_kills_the_process(criu, tmp_path, processes):
    proc = sleeper(tmp_path, processes)
    recorder = Recorder(proc.pid)
    rpc.dump(images_dir(tmp_path), proc.pid, rpc.CriuOptions(), recorder)
    assert recorder.actions == DUMP_ACTIONS
    assert [pid for _, pid, _ in recorder.calls] == [None, None, None]  # dump actions carry none
    states = dict((action, st) for action, _, st in recorder.calls)
    assert states["pre-dump"] in ("R", "S")  # still running: the window for GPU work
    assert states["post-dump"] == "t"  # seized by CRIU
    assert proc.wait(10) == -signal.SIGKILL
    assert os.path.exists(os.path.join(images_dir(tmp_path), "dump.log"))


def test_restore_notifies_in_order_and_returns_the_running_root(criu, tmp_path, processes):
    proc, ticks = counter(tmp_path, processes)
    pid = proc.pid
    rpc.dump(images_dir(tmp_path), pid, rpc.CriuOptions())
    proc.wait(10)  # reap it: its pid must be free for the restore
    recorder = Recorder(pid)
    restored = rpc.restore(images_dir(tmp_path), rpc.CriuOptions(), recorder)
    assert restored == pid
    assert recorder.actions == RESTORE_ACTIONS
    # Only post-restore carries a pid (setup-namespaces too, for a tree with namespaces).
    assert [p for _, p, _ in recorder.calls] == [None, pid, None, None]
    assert recorder.calls[0][2] is None  # pre-restore: nothing is restored yet
    assert recorder.calls[2][2] == "t"  # pre-resume: restored, still stopped
    assert runs(ticks)
    # Detached from CRIU: the root is this process's child (rst_sibling), in its own session,
    # and no criu worker is left.
    assert status_field(pid, "PPid") == str(os.getpid())
    assert os.getsid(pid) == pid
    assert children_named("criu") == []


def test_leave_running_keeps_the_process_running(criu, tmp_path, processes):
    proc, ticks = counter(tmp_path, processes)
    rpc.dump(images_dir(tmp_path), proc.pid, rpc.CriuOptions(leave_running=True))
    assert proc.poll() is None
    assert runs(ticks)
    assert images.pids(images_dir(tmp_path)) == [proc.pid]


def test_a_callback_failing_at_pre_dump_aborts_the_dump_and_the_process_keeps_running(
        criu, tmp_path, processes):
    proc, ticks = counter(tmp_path, processes)
    recorder = Recorder(proc.pid, fail_at="pre-dump")
    with pytest.raises(RuntimeError, match="refused at pre-dump"):
        rpc.dump(images_dir(tmp_path), proc.pid, rpc.CriuOptions(), recorder)
    assert recorder.actions == ["pre-dump"]  # CRIU stopped there
    assert proc.poll() is None and runs(ticks)
    assert not os.path.exists(os.path.join(images_dir(tmp_path), "pstree.img"))
    assert children_named("criu") == []


def test_a_callback_failing_at_post_dump_fails_the_dump_and_the_process_keeps_running(
        criu, tmp_path, processes):
    proc, ticks = counter(tmp_path, processes)
    recorder = Recorder(proc.pid, fail_at="post-dump")
    with pytest.raises(RuntimeError, match="refused at post-dump"):
        rpc.dump(images_dir(tmp_path), proc.pid, rpc.CriuOptions(), recorder)
    assert recorder.actions == DUMP_ACTIONS
    assert proc.poll() is None and runs(ticks)  # CRIU resumed it instead of killing it


def test_an_interrupt_in_a_callback_kills_criu_and_propagates(criu, tmp_path, processes):
    proc = sleeper(tmp_path, processes)
    recorder = Recorder(proc.pid, fail_at="pre-dump", error=KeyboardInterrupt)
    with pytest.raises(KeyboardInterrupt):
        rpc.dump(images_dir(tmp_path), proc.pid, rpc.CriuOptions(), recorder)
    assert children_named("criu") == []
    assert alive(proc.pid)  # CRIU had not seized it yet


def test_restore_fails_with_the_log_when_the_pid_is_taken(criu, tmp_path, processes):
    proc = sleeper(tmp_path, processes)
    rpc.dump(images_dir(tmp_path), proc.pid, rpc.CriuOptions(leave_running=True))
    with pytest.raises(CriuError) as failure:
        rpc.restore(images_dir(tmp_path), rpc.CriuOptions())
    log = os.path.join(images_dir(tmp_path), "restore.log")
    assert failure.value.log_path == log
    assert log in str(failure.value) and "Error" in str(failure.value)
    assert failure.value.exit_code == 11
    assert alive(proc.pid)


def test_restore_of_a_directory_without_images_fails_with_the_log(criu, tmp_path):
    with pytest.raises(CriuError) as failure:
        rpc.restore(images_dir(tmp_path), rpc.CriuOptions(log_file="mine.log"))
    assert failure.value.log_path == os.path.join(images_dir(tmp_path), "mine.log")
    assert os.path.exists(failure.value.log_path)
    assert failure.value.log_errors  # the log's error lines are in the message


def test_a_missing_image_directory_is_named(criu, tmp_path, processes):
    proc = sleeper(tmp_path, processes)
    missing = str(tmp_path / "missing")
    with pytest.raises(CriuError, match=f"image directory {missing}: No such file"):
        rpc.dump(missing, proc.pid, rpc.CriuOptions())
    assert alive(proc.pid)


def test_a_missing_criu_binary_is_named(tmp_path):
    with pytest.raises(CriuError, match="/nonexistent/criu not found"):
        rpc.dump(images_dir(tmp_path), 1, rpc.CriuOptions(binary="/nonexistent/criu"))
    with pytest.raises(CriuError, match="not found"):
        rpc.check("/nonexistent/criu")


def test_check_gives_the_version_of_a_working_criu(criu):
    assert int(rpc.check(criu).split(".")[0]) >= 4


def fake_criu(tmp_path, version: str, swrk: str) -> str:
    """A stand-in for CRIU: says version, and runs the shell code swrk when started as a worker."""
    path = tmp_path / "criu"
    path.write_text(f'#!/bin/sh\ncase "$1" in\n  --version) echo "Version: {version}" ;;\n'
                    f'  swrk) {swrk} ;;\n  check) echo "Looks good." ;;\nesac\n')
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def test_criu_3_is_refused(tmp_path):
    old = fake_criu(tmp_path, "3.17.1", "exit 0")
    with pytest.raises(CriuError, match="CRIU 3.17.1; CRIU >= 4 is needed"):
        rpc.check(old)
    with pytest.raises(CriuError, match="CRIU >= 4 is needed"):
        rpc.dump(images_dir(tmp_path), 1, rpc.CriuOptions(binary=old))


def test_without_pycriu_the_error_says_where_it_comes_from(tmp_path, monkeypatch):
    for module in ("pycriu", "pycriu.rpc_pb2"):
        monkeypatch.setitem(sys.modules, module, None)  # importing it fails
    criu_4 = fake_criu(tmp_path, "4.2.1", "exit 0")
    with pytest.raises(CriuError, match="pycriu cannot be imported .*ships with CRIU"):
        rpc.dump(images_dir(tmp_path), 1, rpc.CriuOptions(binary=criu_4))


def test_a_worker_that_dies_gives_its_exit_status_and_output(pycriu_messages, tmp_path):
    dying = fake_criu(tmp_path, "4.2.1", "echo cannot go on >&2; exit 3")
    with pytest.raises(CriuError, match=r"ended without an answer \(exit status 3\)") as failure:
        rpc.dump(images_dir(tmp_path), 1, rpc.CriuOptions(binary=dying))
    assert "cannot go on" in failure.value.log_errors


def test_a_worker_that_hangs_is_killed_after_the_timeout(pycriu_messages, tmp_path):
    hanging = fake_criu(tmp_path, "4.2.1", "exec sleep 60")
    # a sleep another test left as our child (a tree reparented to this subreaper) is not this one
    earlier = set(children_named("sleep"))
    started = time.monotonic()
    with pytest.raises(CriuError, match="no answer from CRIU in 0.5 s"):
        rpc.dump(images_dir(tmp_path), 1, rpc.CriuOptions(binary=hanging, timeout_s=0.5))
    assert time.monotonic() - started < 10
    assert set(children_named("sleep")) - earlier == set()


@pytest.mark.parametrize("action", ["pre-resume", "post-resume"])
def test_a_callback_failing_after_the_restore_propagates_but_the_tree_runs(
        criu, tmp_path, processes, action):
    proc, ticks = counter(tmp_path, processes)
    rpc.dump(images_dir(tmp_path), proc.pid, rpc.CriuOptions())
    proc.wait(10)
    recorder = Recorder(proc.pid, fail_at=action)
    with pytest.raises(RuntimeError, match=f"refused at {action}"):
        rpc.restore(images_dir(tmp_path), rpc.CriuOptions(), recorder)
    assert recorder.actions == RESTORE_ACTIONS  # CRIU only logs these failures, and goes on
    assert alive(proc.pid) and runs(ticks)


@pytest.mark.parametrize("action", ["pre-restore", "post-restore"])
def test_a_callback_failing_during_the_restore_leaves_nothing_running(
        criu, tmp_path, processes, action):
    proc = sleeper(tmp_path, processes)
    rpc.dump(images_dir(tmp_path), proc.pid, rpc.CriuOptions())
    proc.wait(10)
    recorder = Recorder(proc.pid, fail_at=action)
    with pytest.raises(RuntimeError, match=f"refused at {action}"):
        rpc.restore(images_dir(tmp_path), rpc.CriuOptions(), recorder)
    assert recorder.actions == RESTORE_ACTIONS[:RESTORE_ACTIONS.index(action) + 1]
    assert dies(proc.pid)  # CRIU killed what it had restored
    assert children_named("criu") == []
