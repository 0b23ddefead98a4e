"""A group of processes suspended together, and the plan of what to save for it.

Every distinct piece of GPU memory is saved once, by one owner:
  - an allocation a process created (cuMemCreate, or the cuMem memory behind a large cuMemAlloc) is
    owned by that process;
  - memory a process imported whose exporter no longer holds it (the exporter freed it while the
    importer still maps it) is adopted by the lowest-pid importer: at resume it re-creates the memory
    at its own addresses, and the other importers attach to it.
Imports are linked to their origin by (exporter pid, allocation id), never by address or handle.

Refused before anything changes (ProcessError, with what to do):
  - a process that uses CUDA without the shim while any process of the group shares GPU memory;
  - an import from a process outside the group (suspend them together);
  - what a shim reports it cannot track (e.g. a legacy IPC import of memory allocated without it).
"""
import dataclasses

from ..shimctl import client as control
from ..errors import Error, ProcessError, ShimError
from ..shimctl.processes import cuda_and_shim


@dataclasses.dataclass
class Member:
    pid: int
    cuda: bool
    shim: bool
    status: dict = None  # the shim's status, when it has one

    @property
    def shares(self):
        s = self.status or {}
        return bool(s.get("imports") or any(a.get("exports") or a.get("ipc_handles")
                                            for a in s.get("allocations", [])))


@dataclasses.dataclass(frozen=True)
class Unit:
    """One piece of GPU memory to save and bring back: who re-creates it and how to reach it."""
    owner: int      # pid
    kind: str       # "allocation" (owner created it) or "import" (adopted from a freed exporter)
    id: int         # allocation id or import id in the owner's shim
    size: int
    device: int
    origin: tuple   # (pid, allocation id) that importers name

    @property
    def key(self):
        return f"{self.owner}:{self.kind}:{self.id}"


@dataclasses.dataclass(frozen=True)
class Attachment:
    """An import to re-attach at resume: importer's import id -> the unit that backs it."""
    importer: int
    import_id: int
    unit: Unit


def discover(pids):
    """Members for the given pids (status read from each shim that answers)."""
    members = []
    for pid in pids:
        cuda, shim = cuda_and_shim(pid)
        status = None
        if shim:
            try:
                status = control.status(pid)
            except ShimError:
                status = None  # the shim has not started its socket: the process shares nothing
        members.append(Member(pid, cuda, shim, status))
    return members


def check(members):
    """Refusals that must happen before anything changes."""
    sharing = [m.pid for m in members if m.shares]
    for m in members:
        if m.cuda and not m.shim and sharing:
            raise ProcessError(m.pid, "uses CUDA without the criu-gpushare shim while process(es) "
                               f"{', '.join(map(str, sharing))} of the group share GPU memory; start it "
                               "with `criu-gpushare run` (or LD_PRELOAD the shim)")
        for reason in (m.status or {}).get("untracked", []):
            raise ProcessError(m.pid, f"cannot be checkpointed: {reason}")
    pids = {m.pid for m in members}
    for m in members:
        for imp in (m.status or {}).get("imports", []):
            exporter = imp.get("exporter")
            if exporter is None:
                raise ProcessError(m.pid, f"imports GPU memory (import {imp['id']}) from an unknown "
                                   "process; the exporter must run with the shim")
            if exporter["pid"] not in pids and _alive(exporter["pid"]):
                raise ProcessError(m.pid, f"imports GPU memory from process {exporter['pid']}, which "
                                   "is not in the group: suspend them together")
    if any(m.shares for m in members):
        _check_outside_importers(pids)


def _check_outside_importers(pids):
    """A process outside the group that maps memory of the group would keep mapping the old
    memory after resume (the group's copy is re-created): refuse, naming it."""
    for pid in control.shim_pids():
        if pid in pids or not _alive(pid):
            continue
        try:
            status = control.status(pid)
        except Error:
            continue  # gone, busy, or not reachable: it cannot be checked
        for imp in status.get("imports", []):
            exporter = imp.get("exporter") or {}
            if exporter.get("pid") in pids:
                raise ProcessError(pid, f"imports GPU memory from process {exporter['pid']} of the "
                                   "group but is not in it: suspend them together")


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat"):
            return True
    except FileNotFoundError:
        return False


def plan(members):
    """(units to save, attachments to restore) for members with a shim status."""
    units, by_origin = [], {}
    for m in sorted(members, key=lambda m: m.pid):
        for a in (m.status or {}).get("allocations", []):
            u = Unit(m.pid, "allocation", a["id"], a["size"], a["device"], (m.pid, a["id"]))
            units.append(u)
            by_origin[u.origin] = u
    attachments = []
    for m in sorted(members, key=lambda m: m.pid):
        for imp in (m.status or {}).get("imports", []):
            origin = (imp["exporter"]["pid"], imp["exporter"]["id"])
            unit = by_origin.get(origin)
            if unit is None:  # the exporter freed it: this importer adopts it
                unit = Unit(m.pid, "import", imp["id"], imp["size"], _import_device(m, imp), origin)
                units.append(unit)
                by_origin[origin] = unit
            else:
                attachments.append(Attachment(m.pid, imp["id"], unit))
    return units, attachments


def _import_device(member, imp):
    """The device an adopted import lives on: the first device its mappings give access to."""
    for mp in member.status.get("mappings", []):
        if mp.get("object") == "import" and mp.get("id") == imp["id"]:
            for acc in mp.get("access", []):
                if acc.get("prot") != "none":
                    return acc["location"]
    return imp.get("device", 0)
