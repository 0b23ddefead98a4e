"""The one reader of /proc/PID/stat: a process's (or thread's) state letter and start time.

Field numbers are stat(5)'s. The command name (field 2) may hold spaces and ')', so the fields are
split after its last ')'.
"""
import os
import time


def _fields(path):
    """stat's fields from field 3 (the state) on, or None when the process is gone."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return data[data.rindex(b")") + 2:].split()


def state_and_start(pid):
    """(state letter, start time in clock ticks since boot: fields 3 and 22) of pid ("self" for this
    process), or None when it is gone. A pid and its start time name one process, even after the
    pid is reused."""
    fields = _fields(f"/proc/{pid}/stat")
    return None if fields is None else (fields[0].decode(), int(fields[19]))


def seconds_since_start(pid="self"):
    """How long pid has run (the boot clock less its start time), within a clock tick; None when it
    is gone or unreadable. For this process: the interpreter's start and imports so far."""
    try:
        stat = state_and_start(pid)
        if stat is None:
            return None
        return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - stat[1] / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


def thread_state(pid, tid):
    """The state letter of thread tid of pid (R, S, T, t, Z, ...), or None when it is gone."""
    try:
        fields = _fields(f"/proc/{pid}/task/{tid}/stat")
    except OSError:
        return None
    return fields[0].decode() if fields else None


def thread_states(pid):
    """{tid: state letter} of pid's threads (those that exit meanwhile left out); {} when pid is
    gone."""
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return {}
    states = {tid: thread_state(pid, tid) for tid in tids}
    return {tid: s for tid, s in states.items() if s is not None}
