"""The durable state of a group's suspend, dump or restore: what any later run of the tool needs to
finish or undo it without the process that began it.

State files (engine/statedir.py), for a group keyed by its lowest pid K:
  journal-K.json  the journal: kind, pids and their start times, the run's options whole
                  ("options": store, ref, timeout, GPU map, verify, cache; the store, ref, verify
                  and cache also beside it, as older versions wrote them), the group (its plan:
                  members, units, attachments, GPUs; the steps begun), the state, and the process
                  doing the work (the worker)
  pid-P           the claim on pid P: {"key": K, "started": P's start time}; created exclusively,
                  so two runs of the tool can never work on one process at once

A step is recorded as done before it runs, so a run killed half-way through a step is undone as if
the step had finished (every undo tolerates a step that did only part of its work). A claim whose
process has gone (a different start time) or whose journal is missing is stale and is removed, and
so is a journal whose processes have all exited with no process working on it. The journals decide
who holds a process (owner_of); a state file that is not whole, not a regular file or not ours is
refused with StateFileError, naming it.
"""
import os
import time

from ..errors import ProcessError, StateFileError
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
    def create(cls, kind, pids, state, options=None, **fields):
        """Claim every pid (refusing one that another journal holds) and write the journal.
        options (engine/steps.py Options): kept whole, and its store, ref, verify and cache also
        as the fields older versions of the tool read."""
        if options is not None:
            fields = {"store": options.store, "ref": options.ref, "verify": options.verify,
                      "cache": options.cache, "cache_limit": options.cache_limit,
                      "options": options.stored(), **fields}
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
        """Whether another process, still running, works on the group."""
        return (self.data.get("worker") or {}).get("pid") != os.getpid() and self._worker_runs()

    def _worker_runs(self):
        w = self.data.get("worker") or {}
        return statedir.same_process(w.get("pid"), w.get("started"))

    def processes_alive(self):
        """The pids of the group that are still the processes the journal names."""
        return [p for p in self.pids if statedir.same_process(p, self.data["started"][str(p)])]

    def abandoned(self):
        """Nothing is left to finish or undo: every process of the group has exited and no process
        works on it (a holder that died with its group; a restore whose CRIU failed, killing the
        tree, after its journal was made)."""
        return not self._worker_runs() and not self.processes_alive()

    def close(self):
        """The group is running and free again: drop the claims, then the journal."""
        for pid in self.pids:
            claim = statedir.read_json(f"pid-{pid}")
            if isinstance(claim, dict) and claim.get("key") == self.key:
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
    claim = _read_claim(pid) or {}
    at = claim.get("at")
    young = isinstance(at, (int, float)) and time.time() - at < CLAIM_GRACE_S
    if owner_of(pid) is None and not (young and claim.get("started") == started):
        statedir.remove(f"pid-{pid}")  # stale: try once more (exclusive: one run wins)
        return statedir.create_exclusive(f"pid-{pid}", record)
    return False


def _is_pid(x):
    return isinstance(x, int) and not isinstance(x, bool) and x > 0


def read_journal(name):
    """The journal in state file `name`, or None; one that is not a whole journal of ours is a
    StateFileError naming it (a fake group must neither be listed nor resumed)."""
    data = statedir.read_json(name)
    if data is None:
        return None
    pids = data.get("pids") if isinstance(data, dict) else None
    started = data.get("started") if isinstance(data, dict) else None
    if not (isinstance(pids, list) and pids and all(_is_pid(p) for p in pids)
            and data.get("key") == min(pids) and name == f"journal-{data['key']}.json"
            and data.get("kind") in ("suspend", "dump", "restore")
            and isinstance(data.get("state"), str) and isinstance(started, dict)
            and all(isinstance(started.get(str(p)), int) for p in pids)):
        raise statedir.bad_file(name, "is not a criu-gpushare journal (fields missing or wrong)")
    return Journal(data)


def _read_claim(pid):
    claim = statedir.read_json(f"pid-{pid}")
    if claim is not None and not (isinstance(claim, dict) and _is_pid(claim.get("key"))):
        raise statedir.bad_file(f"pid-{pid}", "is not a criu-gpushare pid claim")
    return claim


def owner_of(pid):
    """The journal that holds process pid, or None. The journals decide: a claim whose journal does
    not name the process (as the same process: its start time) is stale, and a journal that names
    it counts even if its claim is stale or gone, so `status` and `resume` always agree."""
    started = statedir.start_time(pid)
    if started is None:
        return None

    def holds(j):
        return j is not None and pid in j.pids and j.data["started"][str(pid)] == started

    claim = _read_claim(pid)
    if claim:
        journal = read_journal(f"journal-{claim['key']}.json")
        if holds(journal):
            return journal
    journals, problems = all_journals()
    for journal in journals:
        if holds(journal):
            return journal
    if problems:
        raise problems[0]  # it may be the one that held pid: do not guess
    return None


def all_journals():
    """(every journal, a StateFileError for each journal file that cannot be trusted). An
    abandoned journal is removed as it is read, as a stale claim is: no pid can name its group
    again, so nothing else would (the store's holds of it go stale by themselves)."""
    out, problems = [], []
    for name in statedir.names("journal-"):
        try:
            journal = read_journal(name)
        except StateFileError as e:
            problems.append(e)
            continue
        if journal and journal.abandoned():
            journal.close()
        elif journal:
            out.append(journal)
    return out, problems
