"""Loading ahead: what of a resume's or a restore's GPU memory is read from the store before its
load step, into spare GPU memory of this process (gpu/staging.py), and when; and a suspended
group's chunk files registered for its resume while it stays suspended (register).

Before the load step can copy anything, the memory it copies into must exist again: the driver
restores each process, the shims re-create their memory (a resume), and before that CRIU restores
the processes themselves (a restore). That is about a second on the H200 in which the link and the
store sat idle, while the load itself is bound by reading the store (40 GiB from tmpfs in
1.2-1.8 s). Started at the beginning of a resume, or once the GPU check passed during CRIU's
restore, the reading overlaps all of it, and the load step copies device to device.

Only where a GPU has room for a second copy: its free memory, less what comes back to it, less
MARGIN (this process's context and ring) and PER_PROCESS for each restored process (the driver
brings their contexts back after this began). Allocations are taken whole, in the plan's order,
while they fit; the others load as before. CRIU_GPUSHARE_LOAD_AHEAD=0 turns it off.
"""
from ..config import env_switch
from ..gpu import file_pages
from ..gpu.memory import free_memory
from ..gpu.staging import StagedLoad
from .steps import open_for_load

ENV_SWITCH = "CRIU_GPUSHARE_LOAD_AHEAD"
MARGIN = 4 << 30
PER_PROCESS = 1 << 30


def enabled(environ=None):
    """False when CRIU_GPUSHARE_LOAD_AHEAD says 0/no/false/off."""
    return env_switch(ENV_SWITCH, environ) is not False


def start(group, report=print):
    """A StagedLoad started for group's units (group.manifest read) that fit; None when it is off
    or there is nothing to load. What fits is decided in its thread (CUDA may start there)."""
    if not enabled() or not group.units or group.manifest is None:
        return None
    return StagedLoad(lambda: placements(group), lambda: open_for_load(group.options, report),
                      verify=group.options.verify, registered=group.registered).start()


def placements(group):
    """[(manifest Allocation, GPU ordinal here)] of group's units that fit on their GPUs now."""
    allocations = {a.key: a for p in group.manifest.processes for a in p.allocations}
    devices = {u.key: group.tool_device(u) for u in group.units}
    need = {}
    for u in group.units:
        need[devices[u.key]] = need.get(devices[u.key], 0) + u.size
    processes = len(group.pids_with_cuda())
    room = {}
    for device, n in need.items():
        room[device] = free_memory(device) - n - MARGIN - PER_PROCESS * processes
    out = []
    for u in group.units:
        allocation, device = allocations.get(u.manifest_key), devices[u.key]
        if allocation is not None and 0 < allocation.size <= room[device]:
            room[device] -= allocation.size
            out.append((allocation, device))
    return out


def register(group, report=print):
    """A suspended group's chunk files registered with the driver from now on, in a thread, for
    its resume to copy in place (gpu/file_pages.py): a started RegisteredAhead, or None where
    the store does not keep them in memory pages worth it, or there is nothing to load."""
    if group.manifest is None or not group.units:
        return None
    with open_for_load(group.options, report) as store:
        if not file_pages.wanted(store.chunk_pages()):
            return None
    chunks = {c.id: c.length for p in group.manifest.processes for a in p.allocations
              for c in a.chunks if not c.is_zero}
    device = group.tool_device(group.units[0])
    return file_pages.RegisteredAhead(lambda: open_for_load(group.options, report), list(chunks.items()),
                                      device).start()
