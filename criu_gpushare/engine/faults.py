"""Fault injection for tests, as CRIU's --fault: CRIU_GPUSHARE_FAULT=<point>[:kill].

A point is a step name (the fault fires right after the step did its work, so its undo runs
exactly as after a real failure), "copy" (inside save, after the first unit is in the store),
"driver-restore" (inside restore, in place of the driver's restore call), "post-dump" (a dump
marked complete at CRIU's post-dump), "post-restore" (a restore's journal made at CRIU's
post-restore: in the hook's holder before it answers, in `restore` before CRIU goes on) or
"pre-resume" (`restore` at CRIU's pre-resume).
`<point>` raises the tool's error there; `<point>:kill` SIGKILLs this process there, as a crash
would; `<point>:bug` raises an exception that is not the tool's (as a bug would); `<point>:pause`
writes this process's pid to the file $CRIU_GPUSHARE_FAULT_PAUSE and waits there while that file
exists (60 s at most: a test interrupts the command meanwhile, then removes it). With
CRIU_GPUSHARE_TEST_KILL_AT_FAULT=PID, process PID is SIGKILLed there first (a member crashing).
With CRIU_GPUSHARE_FAULT_ONCE=PATH it fires in the first process to reach the point only (the one
that creates PATH), as a crash would, and not again in the process that takes over its work:
CRIU gives every action script it runs the same environment.
"""
import os
import signal
import time

from .. import procfs
from ..errors import Error

FAULT_ENV = "CRIU_GPUSHARE_FAULT"


class InjectedFault(Error):
    """fault injected at {} ({})"""


def fault_point(point):
    want, _, how = os.environ.get(FAULT_ENV, "").partition(":")
    if want != point or not _first_time():
        return
    victim = os.environ.get("CRIU_GPUSHARE_TEST_KILL_AT_FAULT")
    if victim:  # tests: another process (a member of the group) dies here, as a crash would
        os.kill(int(victim), signal.SIGKILL)
        _wait_dead(int(victim))
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if how == "pause":
        path = os.environ["CRIU_GPUSHARE_FAULT_PAUSE"]
        with open(path, "w") as f:
            f.write(str(os.getpid()))
        deadline = time.monotonic() + 60
        while os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.02)
        return
    if how == "bug":
        raise RuntimeError(f"bug injected at {point} ({FAULT_ENV})")
    raise InjectedFault(point, FAULT_ENV)


def _first_time():
    once = os.environ.get("CRIU_GPUSHARE_FAULT_ONCE")
    if not once:
        return True
    try:
        os.close(os.open(once, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        return False
    return True


def _wait_dead(pid, timeout_s=10):
    """Until pid is a zombie or gone: a SIGKILL takes effect a moment after it is sent, and a crash
    is seen only once it has."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if procfs.thread_state(pid, pid) in (None, "Z", "X"):
            return
        time.sleep(0.005)
