"""Bounded waits: every wait of the tool on a process of the group ends by a deadline, and a process
that cannot answer because it is stopped is named at once, not waited for (README, "Timeouts").

A Deadline is carried down a step's waits: each wait gets what is left of it, so that waits one
after another share one bound instead of each getting a full one. The lower layers (shimctl, gpu)
take seconds left; the engine makes the deadlines: one per step, --timeout long for the steps of
a suspend or dump, UNDO_WAIT_S for each step of a resume or rollback.
"""
import os
import time

from .procfs import thread_states

UNDO_WAIT_S = 60.0      # a resume or rollback step's waits on the group (there is no --timeout there)
DRIVER_MOVE_S = 600.0   # a driver checkpoint or restore call: it moves the GPU memory of a process
                        # without the shim itself, at the driver's rate (about 2 GB/s out)
POLL_S = 0.1            # how often a wait looks whether the process it waits on is stopped


class Deadline:
    """A point in time that the waits of one step must not pass."""

    def __init__(self, seconds):
        self.seconds = seconds
        self.end = time.monotonic() + seconds

    def left(self):
        """Seconds left (0 once passed)."""
        return max(0.0, self.end - time.monotonic())

    def passed(self):
        return time.monotonic() >= self.end


def stopped(pid):
    """"stopped (SIGSTOP)" while a thread of pid is in a job-control stop (state T: the whole
    process stops; no thread of it answers until SIGCONT), else None. A thread stopped by a tracer
    (state t) is not counted: the tool's own freezer stops threads that way and spares the ones
    it needs."""
    return "stopped (SIGSTOP)" if "T" in thread_states(pid).values() else None


def stopped_by_tracer(pid):
    """"stopped by its tracer (pid N)" when pid's main thread is in a tracing stop by another
    process than this one (a debugger), else None."""
    if thread_states(pid).get(pid) != "t":
        return None
    try:
        with open(f"/proc/{pid}/status") as f:
            tracer = next((int(line.split()[1]) for line in f if line.startswith("TracerPid:")), 0)
    except (OSError, ValueError):
        return None
    return f"stopped by its tracer (pid {tracer})" if tracer not in (0, os.getpid()) else None
