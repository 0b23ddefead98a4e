"""The durable record of a group's suspend, dump or restore: what any later run of the tool needs to
finish or undo it without the process that began it.

State files (engine/statedir.py), for a group keyed by its lowest pid K:
  journal-K.json  the journal: kind, pids and their start times, store and ref, the group (its plan:
                  members, units, attachments, GPUs; the steps begun), the state, and the process
                  doing the work (the worker)
  pid-P           the claim on pid P: {"key": K, "started": P's start time}; created exclusively,
                  so two runs of the tool can never work on one process at once

A step is recorded as done before it runs, so a run killed half-way through a step is undone as if
the step had finished (every undo tolerates a step that did only part of its work). A claim whose
process has gone (a different start time) or whose journal is missing is stale and is removed.
"""
import os
import time

from ..errors import ProcessError
from . import statedir

# state: what the journal's group is doing now
SUSPENDING, SUSPENDED, RESUMING, HELD = "suspending", "suspended", "resuming", "held"
DUMPING, DUMPED = "dumping", "dumped"


class Journal:
    def __init__(self, data):
        self.data = data

    # the fields every caller reads
    key = property(lambda self: self.data["key"])
    kind = property(lambda self: self.data["kind"])
    pids = property(lambda self: self.data["pids"])
    state = property(lambda self: self.data["state"])
    done = property(lambda self: self.data.get("group", {}).get("done", []))

    @property
    def name(self):
        return f"journal-{self.key}.json"

    @classmethod
    def create(cls, kind, pids, state, **fields):
        """Claim every pid (refusing one that another journal holds) and write the journal."""
        pids = sorted(set(pids))
        key = min(pids)
        started = {}
        for pid in pids:
            started[str(pid)] = statedir.start_time(pid)
            if started[str(pid)] is None:
                raise ProcessError(pid, "no such process")
        journal = cls({"key": key, "kind": kind, "pids": pids, "started": started, "state": state,
                       "created": time.time(), "worker": _me(), **fields})
        claimed = []
        try:
            for pid in pids:
                if not _claim(pid, key, started[str(pid)]):
                    other = owner_of(pid)
                    raise ProcessError(pid, f"is already being handled by criu-gpushare ({other.kind}, "
                                       f"{other.state}, group {other.key}): `criu-gpushare status` "
                                       "shows it; resume it first" if other else
                                       "is claimed by another criu-gpushare run right now")
                claimed.append(pid)
            journal.save()
        except BaseException:
            for pid in claimed:
                statedir.remove(f"pid-{pid}")
            raise
        return journal

    def save(self):
        statedir.write_json(self.name, self.data)

    def set(self, **fields):
        self.data.update(fields)
        self.save()

    def adopt(self):
        """This process now does the group's work (a resume taking over from a dead holder)."""
        self.set(worker=_me())

    def worker_alive(self):
        w = self.data.get("worker") or {}
        return w.get("pid") != os.getpid() and statedir.same_process(w.get("pid"), w.get("started"))

    def processes_alive(self):
        """The pids of the group that are still the processes the journal names."""
        return [p for p in self.pids if statedir.same_process(p, self.data["started"][str(p)])]

    def close(self):
        """The group is running and free again: drop the claims, then the journal."""
        for pid in self.pids:
            claim = statedir.read_json(f"pid-{pid}")
            if claim and claim.get("key") == self.key:
                statedir.remove(f"pid-{pid}")
        statedir.remove(self.name)


def _me():
    return {"pid": os.getpid(), "started": statedir.start_time(os.getpid())}


# A claim is written just before its journal: one this young without a journal is still live.
CLAIM_GRACE_S = 30


def _claim(pid, key, started):
    record = {"key": key, "started": started, "at": time.time()}
    if statedir.create_exclusive(f"pid-{pid}", record):
        return True
    claim = statedir.read_json(f"pid-{pid}") or {}
    young = time.time() - claim.get("at", 0) < CLAIM_GRACE_S
    if owner_of(pid) is None and not (young and claim.get("started") == started):
        statedir.remove(f"pid-{pid}")  # stale: try once more (exclusive: one run wins)
        return statedir.create_exclusive(f"pid-{pid}", record)
    return False


def owner_of(pid):
    """The journal that claims pid, or None (a stale claim, whose process is gone or whose journal
    is missing, counts as none)."""
    claim = statedir.read_json(f"pid-{pid}")
    if not claim:
        return None
    data = statedir.read_json(f"journal-{claim.get('key')}.json")
    if data is None:
        return None
    if claim.get("started") != statedir.start_time(pid):
        return None
    return Journal(data)


def all_journals():
    out = []
    for name in statedir.names("journal-"):
        data = statedir.read_json(name)
        if data:
            out.append(Journal(data))
    return out
