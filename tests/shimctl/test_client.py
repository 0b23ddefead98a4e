"""The shim client (criu_gpushare/shimctl/client.py) against servers that are not a working shim:
every failure is the tool's Error, in bounded time, and an answer counts only from the process the
socket name promises, running as root or as that process's owner (shim/protocol.md,
"Authentication")."""
from __future__ import annotations

import json
import os
import signal
import time

import pytest

from criu_gpushare import waits
from criu_gpushare.errors import BusyError, Error, NoAnswer, ProcessNoAnswer, ShimError, ShimNotServing
from criu_gpushare.shimctl import client as control

NOBODY = 65534
STATUS = json.dumps({"v": 2, "ok": True, "allocations": [], "imports": []})


def test_a_full_backlog_is_retried_then_busy(fake_server):
    pid = fake_server("squat")
    t0 = time.monotonic()
    with pytest.raises(BusyError, match=f"listen backlog of @criu-gpushare.{pid} stayed full"):
        control.status(pid)
    took = time.monotonic() - t0
    assert control.CONNECT_RETRY_S <= took < control.CONNECT_RETRY_S + 5, took


def test_a_server_that_never_answers_times_out(fake_server):
    pid = fake_server("mute")
    with pytest.raises(ShimError, match=f"process {pid}: no reply to 'status' within 0.5 s"):
        control.status(pid, timeout=0.5)


def test_a_stopped_server_is_named_at_once_not_waited_for(fake_server):
    """SIGSTOP: nothing of the process runs until SIGCONT, so the request fails as soon as that is
    seen (NoAnswer's exit code), however long its timeout."""
    pid = fake_server("reply", "--reply", STATUS)
    os.kill(pid, signal.SIGSTOP)
    try:
        deadline = time.monotonic() + 10
        while not waits.stopped(pid):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        t0 = time.monotonic()
        with pytest.raises(ProcessNoAnswer, match=rf"process {pid}: is stopped \(SIGSTOP\)") as e:
            control.status(pid, timeout=60)
        assert time.monotonic() - t0 < 10
        assert e.value.exit_code == NoAnswer.exit_code
    finally:
        os.kill(pid, signal.SIGCONT)
    assert control.status(pid)["ok"]  # running again: it answers


def test_no_socket_is_not_serving(sleeper):
    with pytest.raises(ShimNotServing, match=f"process {sleeper.pid} has no control socket"):
        control.status(sleeper.pid)


def test_the_owner_of_the_process_is_believed(fake_server):
    pid = fake_server("reply", "--uid", NOBODY, "--reply", STATUS)
    assert control.status(pid)["ok"]


def test_a_server_whose_uid_is_not_the_processes_is_refused(fake_server):
    """The process runs as root, but its socket was made by uid nobody (SO_PEERCRED): not believed."""
    pid = fake_server("reply", "--listen-uid", NOBODY, "--reply", STATUS)
    with pytest.raises(ShimError, match=f"served as uid {NOBODY}, but process {pid} runs as uid 0"):
        control.status(pid)


def test_every_failure_is_the_tools_error(fake_server):
    for pid in (fake_server("squat"), fake_server("reply", "--reply", "not json")):
        with pytest.raises(Error):
            control.status(pid, timeout=2)
