"""A group of processes suspended together, and the plan of what to save for it.

Every distinct piece of GPU memory is saved once, by one owner:
  - an allocation a process created (cuMemCreate, or the cuMem memory behind a large cuMemAlloc) is
    owned by that process;
  - memory a process imported whose exporter no longer holds it (the exporter freed it while the
    importer still maps it) is adopted by the lowest-pid importer: at resume it re-creates the memory
    at its own addresses, and the other importers attach to it.
Imports are linked to their origin by (exporter pid, allocation id), never by address or handle.

Refused before anything changes (ProcessError, with what to do):
  - a process that is stopped (SIGSTOP, or by a debugger): neither its shim nor the driver can
    reach it until it runs again (NoAnswer's exit code);
  - a process that another tool has locked or checkpointed through the driver (its driver state
    is read first: it is not RUNNING);
  - a shim that does not answer in time or refuses us: fail closed, never "shares nothing";
  - a process that uses CUDA without the shim while any process of the group shares GPU memory;
  - an import from a process outside the group (suspend them together);
  - what a shim reports it cannot track (e.g. a legacy IPC import of memory allocated without it).
"""
import dataclasses

from .. import waits
from ..errors import Error, ProcessError, ProcessNoAnswer, ShimNotServing
from ..gpu import checkpoint_api as ck
from ..shimctl import client as control
from ..shimctl.processes import cuda_and_shim


@dataclasses.dataclass
class Member:
    pid: int
    cuda: bool
    shim: bool
    status: dict = None  # the shim's status, when it has one
    devices: dict = None  # {ordinal: GPU UUID} the process sees (its shim's status)

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
    gpu: str = None  # the UUID of device, as the owner's shim reports it
    saved_as: str = None  # its key in the store's manifest, where the owner had another pid then

    @property
    def key(self):
        return f"{self.owner}:{self.kind}:{self.id}"

    @property
    def manifest_key(self):
        """The key of its bytes in the manifest: its key at the dump."""
        return self.saved_as or self.key


@dataclasses.dataclass(frozen=True)
class Attachment:
    """An import to re-attach at resume: importer's import id -> the unit that backs it."""
    importer: int
    import_id: int
    unit: Unit


def discover(pids, deadline):
    """Members for the given pids: whether each has CUDA state (its driver state, read before
    anything changes) and what its shim tracks, all within deadline (a waits.Deadline). Needs CUDA
    initialised in this process."""
    for pid in pids:  # before any question: a stopped process would answer none
        why = waits.stopped(pid) or waits.stopped_by_tracer(pid)
        if why:
            raise ProcessNoAnswer(pid, f"is {why}: neither its shim nor the CUDA driver can answer "
                                  "until it runs again; nothing was changed (continue it, e.g. "
                                  f"kill -CONT {pid}, and try again)")
    members = []
    for pid in pids:
        cuda, shim = cuda_and_shim(pid)
        status = None
        if cuda:
            state = ck.state_if_initialized(pid, deadline.left())
            if state is None:
                cuda = False  # libcuda is loaded but cuInit was never called: no GPU state
            elif state is not ck.State.RUNNING:
                raise ProcessError(pid, f"is {state.value} in the CUDA driver already (another "
                                   "checkpoint tool, or an earlier run that did not finish, holds "
                                   "it): restore or unlock it with that tool first")
        if shim and cuda:
            try:
                status = control.status(pid, timeout=deadline.left())
            except ShimNotServing as e:
                # The shim serves from cuInit on: CUDA state without its socket is not ours to guess.
                raise ProcessError(pid, f"has CUDA state but its shim does not serve ({e})") from None
        devices = {d["ordinal"]: d["uuid"] for d in (status or {}).get("devices", []) if d.get("uuid")}
        members.append(Member(pid, cuda, shim, status, devices))
    return members


def member_state(m):
    return {"pid": m.pid, "cuda": m.cuda, "shim": m.shim, "served": m.status is not None,
            "devices": {str(k): v for k, v in (m.devices or {}).items()}}


def member_from_state(d):
    return Member(d["pid"], d["cuda"], d["shim"], {} if d["served"] else None,
                  {int(k): v for k, v in d.get("devices", {}).items()})


def unit_state(u):
    return dataclasses.asdict(u)


def unit_from_state(d):
    return Unit(**dict(d, origin=tuple(d["origin"])))


def remap_state(state, pids):
    """A group's state (Group.state()) with its pids replaced through pids ({old: new}): a tree
    restored by CRIU into a new pid namespace has other pids than at its dump, as seen from here."""
    def p(pid):
        return pids.get(pid, pid)
    return dict(state,
                pids=sorted(p(x) for x in state["pids"]),
                restore_tids={str(p(int(k))): t for k, t in state.get("restore_tids", {}).items()},
                members=[dict(m, pid=p(m["pid"])) for m in state["members"]],
                units=[dict(u, owner=p(u["owner"]), origin=[p(u["origin"][0]), u["origin"][1]],
                            saved_as=unit_from_state(u).manifest_key)
                       for u in state["units"]],
                attachments=[dict(a, importer=p(a["importer"]), unit=_remap_key(a["unit"], p))
                             for a in state["attachments"]])


def _remap_key(key, p):
    owner, rest = key.split(":", 1)
    return f"{p(int(owner))}:{rest}"


def attachment_state(a):
    return {"importer": a.importer, "import_id": a.import_id, "unit": a.unit.key}


def attachment_from_state(d, units_by_key):
    return Attachment(d["importer"], d["import_id"], units_by_key[d["unit"]])


def check(members, deadline=None):
    """Refusals that must happen before anything changes (questions to processes outside the
    group within deadline, a waits.Deadline)."""
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
        _check_outside_importers(pids, deadline)


def _check_outside_importers(pids, deadline=None):
    """A process outside the group that maps memory of the group would keep mapping the old
    memory after resume (the group's copy is re-created): refuse, naming it.

    A claim counts only from a process running as root or as the exporter's owner: a member's shim
    answers `whose` to no one else (shim/protocol.md, "Authentication"), so anyone else's claim to
    import from it is not true, and would let another user stop the group's suspend."""
    owners = {}
    for pid in pids:
        try:
            owners[pid] = control.owner_uid(pid)
        except Error:
            pass  # gone: a claim about it does not matter
    for pid in control.shim_pids():
        if pid in pids or not _alive(pid):
            continue
        try:
            uid = control.owner_uid(pid)
            if uid != 0 and uid not in owners.values():
                continue  # could not have learned any member as its exporter: not asked
            status = control.status(pid, timeout=min(control.DEFAULT_TIMEOUT, deadline.left())
                                    if deadline else control.DEFAULT_TIMEOUT)
        except Error:
            continue  # gone, busy, or not reachable: it cannot be checked
        for imp in status.get("imports", []):
            exporter = imp.get("exporter") or {}
            if exporter.get("pid") in pids and uid in (0, owners.get(exporter["pid"])):
                raise ProcessError(pid, f"imports GPU memory from process {exporter['pid']} of the "
                                   "group but is not in it: suspend them together")


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat"):
            return True
    except FileNotFoundError:
        return False


def make_plan(members):
    """(units to save, attachments to restore) for members with a shim status."""
    units, by_origin = [], {}
    for m in sorted(members, key=lambda m: m.pid):
        for a in (m.status or {}).get("allocations", []):
            u = Unit(m.pid, "allocation", a["id"], a["size"], a["device"], (m.pid, a["id"]), a.get("gpu"))
            units.append(u)
            by_origin[u.origin] = u
    attachments = []
    for m in sorted(members, key=lambda m: m.pid):
        for imp in (m.status or {}).get("imports", []):
            origin = (imp["exporter"]["pid"], imp["exporter"]["id"])
            unit = by_origin.get(origin)
            if unit is None:  # the exporter freed it: this importer adopts it
                unit = Unit(m.pid, "import", imp["id"], imp["size"], _import_device(m, imp), origin,
                            imp.get("gpu"))
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
