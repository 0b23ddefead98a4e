"""Quiesce holds kernel launches and memory operations at the shim's gates, drains the GPU, and on
resume lets the held calls go on with correct results; a GPU that does not drain in time makes
quiesce answer busy with both gates open again (fake driver)."""
from __future__ import annotations

import time

import pytest

from criu_gpushare.shimctl import client as control
from criu_gpushare.errors import BusyError


def test_quiesce_holds_concurrent_callers_and_resume_loses_nothing(workload):
    w = workload()
    w.send("hammer 2.5 4")
    time.sleep(0.6)
    control.quiesce(w.pid, timeout_ms=5000)
    held_from = time.monotonic()
    st = w.status()
    assert st["gates"]["launch"] == {"closed": True, "inflight": 0}
    assert st["gates"]["memory"] == {"closed": True, "inflight": 0}
    time.sleep(0.8)
    held_to = time.monotonic()
    control.resume(w.pid)
    r = w.reply(30)
    assert r["ok"], r
    for count, values, stalls in zip(r["counts"], r["values"], r["stalls"]):
        assert count > 0
        assert values == [count], "every launch ran exactly once"
        # No iteration completed while the gates were closed.
        assert any(a <= held_from and b >= held_to for a, b in stalls), (held_from, held_to, stalls)


def test_quiesce_waits_for_work_in_flight(workload):
    w = workload()
    w.do("malloc buf 2097152")
    w.do("fill buf 5")
    w.do("sleep 600000")  # a 0.6 s kernel
    w.do("add buf 1")
    t0 = time.monotonic()
    control.quiesce(w.pid, timeout_ms=5000)
    assert time.monotonic() - t0 >= 0.4, "quiesce returned before the GPU drained"
    control.resume(w.pid)
    assert w.do("read buf 2")["values"] == [6, 6]


def test_quiesce_drains_contexts_the_program_created(workload):
    w = workload()
    w.do("newctx")
    w.do("malloc buf 2097152")
    w.do("sleep 600000")
    t0 = time.monotonic()
    control.quiesce(w.pid, timeout_ms=5000)
    assert time.monotonic() - t0 >= 0.4, "a created context was not drained"
    control.resume(w.pid)


def test_quiesce_that_cannot_drain_is_busy_and_reopens_the_gates(workload):
    w = workload()
    w.do("malloc buf 2097152")
    w.do("sleep 3000000")  # 3 s on the GPU
    with pytest.raises(BusyError, match="did not drain within 300 ms"):
        control.quiesce(w.pid, timeout_ms=300)
    gates = w.status()["gates"]
    assert not gates["launch"]["closed"] and not gates["memory"]["closed"]
    w.do("fill buf 9", timeout=10)  # not held
    w.do("sync", timeout=10)
    assert w.do("read buf 1")["values"] == [9]
    control.quiesce(w.pid, timeout_ms=5000)  # the GPU has drained now
    control.resume(w.pid)


def test_quiesce_and_resume_are_idempotent(workload):
    w = workload()
    control.quiesce(w.pid)
    control.quiesce(w.pid)
    control.resume(w.pid)
    control.resume(w.pid)
    w.do("malloc buf 2097152")
    w.do("fill buf 1")
    w.do("sync")


def test_copies_pass_while_launches_drain_then_are_held(workload):
    """The launch gate closes first: while kernels in flight drain, memory operations still go
    through (NCCL's proxy thread issues copies its kernels wait for); then they are held too."""
    import threading

    w = workload()
    w.do("malloc buf 2097152")
    w.do("sleep 1500000")  # a 1.5 s kernel in flight
    done = threading.Event()
    threading.Thread(target=lambda: (control.quiesce(w.pid, timeout_ms=5000), done.set()),
                     daemon=True).start()
    time.sleep(0.2)
    assert w.status()["gates"]["launch"]["closed"] and not done.is_set()
    w.do("memset buf 4", timeout=5)  # not held while the launches drain...
    assert not done.is_set()  # ...which they still do
    assert done.wait(10)
    w.send("memset buf 5")  # now held
    with pytest.raises(AssertionError, match="no reply"):
        w.reply(0.4)
    control.resume(w.pid)
    assert w.reply(10)["ok"]
    w.do("sync")
    assert w.do("read buf 1")["values"] == [5]
