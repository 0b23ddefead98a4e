"""A CRIU restore's GPU side: checks before and while CRIU restores, `run` once the tasks run.

  check_image         before CRIU restores anything: the image's record (engine/record.py) is there
                      and readable, the store holds its manifest and every chunk (stat only);
                      -> (record, manifest). No CUDA here.
  check_gpus          while CRIU restores the processes, whose post-restore waits for it (CUDA's
                      start, 0.3 s, then overlaps CRIU's): every GPU the group used is here (by
                      UUID, or mapped with --gpu-map OLD=NEW), of the same model, with room for the
                      memory that comes back; -> each GPU's room to spare. A refusal fails CRIU's
                      post-restore, and CRIU kills what it restored: nothing of the tree runs.
  pin_ring_ahead      after check_gpus: the load's pinned ring made in a thread, where there is
                      room to spare.
  load_ahead          then, where a GPU has room for a second copy, the store read into the tool's
                      own GPU memory in a thread (engine/ahead.py): the load copies from there.
  journal_group       once CRIU restored the processes (the hook's holder: at post-restore): the
                      group with its pids of now, under a journal of kind "restore".
  run(group, journal) post-resume (tasks running, their GPU work waiting at the shims' gates): the
                      undo of the dump's steps, in a new process and maybe on another machine:
                      driver restore of every process, unlock, re-create, load, re-attach, reopen.
                      A failure leaves the processes suspended (gates closed), and
                      `criu-gpushare resume PID` retries it from the journal.
"""
from ..errors import ImageError, ProcessError
from ..gpu import driver as drv
from ..gpu.copy_engine import ring_shape
from ..gpu.memory import free_memory, pin_ahead, release_device
from ..shimctl import client as control
from ..shimctl.processes import process_tree
from ..store.backend import open_store
from . import ahead, journal as jn, plan, record
from .steps import Group, check_readable
from .suspension import resume_group


def check_image(images_dir, store_path=None, has_libcuda=None):
    """(the image's record, its manifest) when it has GPU state to bring back, else (None, None);
    ImageError/StoreError saying what is wrong. has_libcuda() tells whether an image without a
    record needs one."""
    try:
        rec = record.read(images_dir)
    except record.RecordMissing:
        if has_libcuda is not None and not has_libcuda():
            return None, None  # no CUDA anywhere in the tree: nothing for us to do
        raise
    if not rec["gpu_state"]:
        return None, None
    store_path = store_path or rec["store"]
    with open_store(store_path) as store:
        manifest = store.read_manifest(store.read_ref(rec["ref"]).manifest)
        check_readable(store, manifest, rec["ref"], "nothing was restored")
    return rec, manifest


def check_gpus(images_dir, rec, gpu_map=None):
    """Every GPU the group used is here, of its model, with room; -> {GPU ordinal here: its free
    bytes less what comes back to it} (pin_ring_ahead decides by it). ImageError otherwise."""
    gpu_map = gpu_map or {}
    here = {g["uuid"]: (i, g) for i, g in enumerate(drv.gpu_inventory())}
    then = {g["uuid"]: g for g in rec["gpus"]}
    need = {}
    for u in rec["group"]["units"]:
        uuid = u.get("gpu") or (rec["gpus"][u["device"]]["uuid"] if u["device"] < len(rec["gpus"]) else None)
        need[uuid] = need.get(uuid, 0) + u["size"]
    used = set(need) | (set(then) if any(m["cuda"] and not m["served"] for m in rec["group"]["members"]) else set())
    room = {}
    for uuid in sorted(u for u in used if u):
        target = gpu_map.get(uuid, uuid)
        if target not in here:
            raise ImageError(images_dir, f"its GPU {uuid} ({then.get(uuid, {}).get('name', '?')}) is "
                             "not on this machine: restore it with --gpu-map "
                             f"{uuid}=<UUID of a GPU here> (here: {', '.join(here) or 'none'})")
        ordinal, gpu = here[target]
        model = then.get(uuid, {}).get("name")
        if model and gpu["name"] != model:
            raise ImageError(images_dir, f"its GPU {uuid} was a {model}; {target} here is a "
                             f"{gpu['name']}: GPU state cannot move between models")
        free = free_memory(ordinal)  # its context kept for the ring and the load ahead (or given back)
        if need.get(uuid, 0) > free:
            raise ImageError(images_dir, f"needs {need[uuid] / 2**30:.2f} GiB on GPU {target}, "
                             f"which has {free / 2**30:.2f} GiB free")
        room[ordinal] = room.get(ordinal, free) - need.get(uuid, 0)
    return room


# The tool's own context and its ring on a GPU, with room to spare: below this on any GPU of the
# restore, the ring is pinned only by the load, after the processes' memory is back, as before.
RING_AHEAD_MARGIN = 4 << 30


def pin_ring_ahead(headroom, total_bytes):
    """Pin the load's ring now, in a thread, while CRIU restores the processes: pinning (0.1-0.2 s
    for 1 GiB) makes this process's context too (0.3 s), which the load would otherwise wait for.
    Only where every GPU of the restore has RING_AHEAD_MARGIN to spare: this process's
    context then exists before the driver restores the processes' memory; elsewhere the context
    check_gpus made is given back. -> whether it started."""
    if not headroom or min(headroom.values()) < RING_AHEAD_MARGIN or not total_bytes:
        for ordinal in headroom or {}:
            release_device(ordinal)
        return False
    pin_ahead(*ring_shape(total_bytes), min(headroom))
    return True


def pid_map(rec, root_pid):
    """{pid at dump: pid now} through each process's pid in its own namespace (NSpid)."""
    now = {control.ns_pid(p): p for p in process_tree(root_pid)}
    out = {}
    for proc in rec["processes"]:
        if proc["nspid"] not in now:
            raise ImageError("record", f"process {proc['pid']} (pid {proc['nspid']} in its "
                             "namespace) of the dump is not in the restored tree")
        out[proc["pid"]] = now[proc["nspid"]]
    return out


def warm_cache(rec, store_path, cache, cache_limit):
    """Fill the node cache with the chunks the restore will read (the store is only read)."""
    from ..store.cache import NodeCache
    from ..store.prefetch import prefetch
    with open_store(store_path or rec["store"]) as store, NodeCache.open(cache, cache_limit) as c:
        return prefetch(store, c, refs=[rec["ref"]])


def load_ahead(rec, options, manifest, report=print):
    """After check_gpus: the store read into spare GPU memory, in a thread, while CRIU restores the
    processes (engine/ahead.py); the StagedLoad for run(), or None."""
    return ahead.start(Group.from_state(rec["group"], options, report, manifest=manifest), report)


def journal_group(rec, root_pid, options, report=print, manifest=None):
    """The restored tree's group (its pids those of now) and its journal of kind "restore", made
    before any GPU step: from then on a process that dies doing the work loses nothing, and
    `criu-gpushare resume`, or the hook's post-resume, finishes it (engine/resuming.py).
    -> (group, journal). manifest: the one check_image() read in this process."""
    state = plan.remap_state(rec["group"], pid_map(rec, root_pid))
    group = Group.from_state(state, options, report, manifest=manifest)
    journal = jn.Journal.create("restore", group.pids, jn.SUSPENDED, options=options,
                                group=group.state())
    return group, journal


def run(group, journal, loading_ahead=None):
    """Bring the GPU state of a restored tree back: journal_group's group and journal, the group's
    options those of the dump's record unless the settings named another store; -> summary.
    loading_ahead: what load_ahead() started. RestoreIncomplete on failure."""
    return resume_group(group, journal, verb="restore", checked=group.manifest is not None,
                        loading_ahead=loading_ahead)


def journal_of_tree(root_pid):
    """The journal that holds a process of root_pid's tree (a restore's, made by journal_group),
    or None; None too when root_pid is gone."""
    try:
        tree = process_tree(root_pid)
    except ProcessError:
        return None
    for pid in tree:
        journal = jn.owner_of(pid)
        if journal is not None:
            return journal
    return None
