"""Streams GPU memory to and from the chunk store through a ring of pinned host buffers.

Saving one allocation: chunk i is copied device->host into ring slot i % N on a CUDA stream, and a
worker thread waits for that copy's event, then hashes and stores the slot (Store.put releases the
GIL, so N workers hash and write in parallel while the next copies run). A slot is reused only when
its previous chunk is stored.
Loading: workers read chunks from the store into the slots ahead of time (in parallel); in order,
each filled slot is copied host->device on the stream; a slot is refilled once its copy has ended.
All-zero chunks are never stored and are loaded with a memset. An allocation already loaded into
the tool's own GPU memory (gpu/staging.py, while CRIU restored the processes) is copied device to
device; a chunk whose file was registered with the driver ahead (gpu/file_pages.py: a suspended
group's store in memory) is copied from that file's own pages, taking no slot.

Unchanged chunks never cross the link (store/FORMAT.md section 13): before copying an allocation,
the engine computes every chunk's id on the GPU (fingerprint.GpuHasher: XXH3-128, the store's
content address). A chunk whose id is the all-zero id, or that the store already holds with that
size (its mtime refreshed as a PRESENT put does), goes into the manifest without a copy; only the
others are copied and put under their GPU ids: hashing 64 MiB again on the host costs a quarter of
a cold save's CPU time (measured on the H200: 40 GiB saved in 2.15 s without it, 2.82 s with it).
What section 13 asks instead: of the chunks copied from each GPU, the first of each length and
every HOST_CHECK_EVERY-th are hashed by put on the host and must match their GPU ids (a broken
kernel fails the save), and once an allocation's copies are done its ids are computed on the GPU
again and must not have changed (memory written during the save fails it). Without a usable hasher
(CRIU_GPUSHARE_GPU_HASH=0, a driver that runs no kernels such as the tests' fake, a pointer not
16-byte aligned) every chunk is copied and hashed by put, as before.

The kernel runs a CUDA block per chunk, so one allocation of a few chunks keeps a few SMs busy:
allocations are taken HASH_GROUP at a time, and the ids of a group are computed at once, on
HASH_STREAMS streams, before its copies (a save), after them (the save's second look, a load's
check). Forty 1 GiB allocations hashed one by one took 0.16 s on the H200, 40 GiB at once 0.015 s.
"""
import concurrent.futures
import contextlib
import ctypes
import dataclasses
import logging
import os
import sys
import time

from . import driver as drv
from .fingerprint import GpuHasher
from .memory import PinnedRing, keep_pinned, pin_ahead, use_device
from ..errors import DriverError
from ..store.layout import zero_chunk_id
from ..store.manifest import Allocation
from ..store.results import PutResult, PutStatus

log = logging.getLogger(__name__)

CHUNK_SIZE = 64 << 20
HOST_CHECK_EVERY = 64  # of the chunks copied from one GPU, those put also hashes on the host
HASH_GROUP = 16  # items a save or a load holds open and hashes at once (GPU ids of many at a time)
HASH_STREAMS = 8  # streams their kernels run on, side by side


RING_SLOTS = 16  # a CopyEngine's pinned ring at most: 1 GiB of CHUNK_SIZE buffers


def ring_size(total_bytes, most=RING_SLOTS, chunk_size=CHUNK_SIZE):
    """The pinned ring's slots for moving total_bytes: `most`, fewer where fewer chunks will do."""
    return max(1, min(most, -(-total_bytes // chunk_size)))


def ring_shape(total_bytes):
    """(buffer size, buffers) of the ring a CopyEngine made with its defaults pins for moving
    total_bytes: what memory.pin_ahead and memory.fault_in_ahead prepare ahead of it."""
    return CHUNK_SIZE, ring_size(total_bytes)


def _settle(futures):
    """After a failure: cancel queued work and wait for running work, which still uses the ring."""
    for f in futures:
        if not f.cancel():
            f.exception()


def _close_after_failure(opened, exc, what):
    """After a failure: each [(key, its ExitStack)] still open closed, last first, its open() told
    the failure (exc: sys.exc_info()); a failure to close is logged, the first one is raised."""
    for key, stack in reversed(opened):
        try:
            stack.__exit__(*exc)
        except BaseException as e:  # noqa: BLE001 - the first failure is the one raised
            log.warning("closing %s after a failed %s: %s", key, what, e)


@dataclasses.dataclass
class CopyStats:
    """What moved: bytes copied over the link, newly written, already stored (dedup), all zero.

    written + deduplicated + zero is the size saved. `unchanged` is the part of deduplicated +
    zero that never crossed the link (its id, computed on the GPU, was the zero id or a stored
    chunk's); copied + unchanged is the size saved. `ahead`: of a load's copied bytes, those
    loaded ahead into the tool's own GPU memory (gpu/staging.py) and copied device to device.
    """
    copied: int = 0
    written: int = 0
    deduplicated: int = 0
    zero: int = 0
    unchanged: int = 0
    ahead: int = 0
    in_place: int = 0
    seconds: float = 0.0  # the item's own time (a load leaves out its group's shared end)
    opening: float = 0.0  # of seconds: in item.open() (the memory's fd, its import and mapping)
    closing: float = 0.0  # of seconds: leaving it (unmapping and releasing the memory)

    def add(self, other):
        for f in dataclasses.fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


class CopyEngine:
    """One per save or load: the worker threads, and the pinned ring (slow to allocate: taken from
    and given back to what earlier engines of this process kept, and the rest pinned while the
    first copies run: memory.PinnedRing)."""

    def __init__(self, store, ring_slots=RING_SLOTS, chunk_size=CHUNK_SIZE, workers=None, verify_loads=False,
                 progress=None, gpu_hash=True, total_bytes=None, pin_ahead=False, registered=None):
        """`store`: a Store or a WriteSession (puts go through it). gpu_hash=False copies every
        chunk even where the GPU could tell it unchanged (CRIU_GPUSHARE_GPU_HASH=0 does too).
        total_bytes, when the caller knows what it will move, caps the pinned ring to it: pinning
        1 GiB costs a near-empty process more than its whole copy. pin_ahead: a save in a process
        that loads next (a suspend's holder), which needs a ring either way (the save's, kept for
        the load, or, when nothing crosses the link, the load's): it is pinned in the background
        from the save's first step on (memory.pin_ahead), beside the GPU start and the hashing
        that come before the first copy, and a resume of unchanged memory pays for it no more
        than one after a full copy. registered:
        {chunk id: file_pages.FilePages} registered ahead (a suspended group's chunk files): a
        load copies those chunks from their files' own pages, the others through the ring."""
        if total_bytes is not None:
            ring_slots = ring_size(total_bytes, ring_slots, chunk_size)
        # Measured on an H200 (16 cores, store on tmpfs): 8 slots/8 workers 9.8 GB/s out, 16/16 14.2.
        workers = workers or min(16, os.cpu_count() or 4)
        self.store, self.chunk_size, self.verify_loads = store, chunk_size, verify_loads
        self.ring_slots, self.progress = ring_slots, progress or (lambda n: None)
        self.gpu_hash, self.pin_ahead = gpu_hash, pin_ahead
        self.pool = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="copy")
        self.registered = registered or {}
        self._ring = None
        self._streams = {}
        self._events = {}
        self._hashers = {}  # device -> GpuHasher, or None where none is usable
        self._hash_stream_sets = {}  # device -> the streams _gpu_ids runs kernels on
        self._copied = {}  # device -> (chunks copied from it, their lengths): host check sampling
        # seconds spent making ready, for the command's phases: "start" (a GPU's context, stream,
        # events and hasher: paid once per GPU) and "pin" (making the ring, and this thread's
        # waits for its buffers while they are pinned)
        self.setup = {"start": 0.0, "pin": 0.0}

    def close(self):
        self.pool.shutdown(wait=True, cancel_futures=True)
        cu = drv.driver()
        for hasher in self._hashers.values():
            if hasher is not None:
                hasher.close()
        keep_pinned(self._ring.release() if self._ring else [])  # for the next engine of this process
        self._ring = None
        for stream in [*self._streams.values(), *(s for ss in self._hash_stream_sets.values() for s in ss)]:
            cu.cuStreamDestroy(stream)
        for events in self._events.values():
            for ev in events:
                cu.cuEventDestroy(ev)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def prepare(self, device, ring=True):
        """The ring (shared by all devices; with ring=False not yet) and a stream + per-slot
        events on this device."""
        cu = drv.driver()
        t = time.monotonic()
        use_device(device)
        if self.pin_ahead and not self._streams:  # the first step: no ring can exist yet
            pin_ahead(self.chunk_size, self.ring_slots, device)  # see __init__: needed either way
        if device not in self._streams:
            flags = cu.CUstream_flags.CU_STREAM_NON_BLOCKING
            self._streams[device] = drv.check(cu.cuStreamCreate(flags), "create a copy stream")
            self._events[device] = [drv.check(cu.cuEventCreate(cu.CUevent_flags.CU_EVENT_DISABLE_TIMING),
                                              "create an event") for _ in range(self.ring_slots)]
        self.setup["start"] += time.monotonic() - t
        if ring and self._ring is None:
            t = time.monotonic()
            self._ring = PinnedRing(self.chunk_size, self.ring_slots, on_wait=self._waited_for_pinning)
            self.setup["pin"] += time.monotonic() - t
        return self._streams[device], self._events[device]

    def _waited_for_pinning(self, seconds):
        self.setup["pin"] += seconds

    def _chunks(self, size):
        return [(off, min(self.chunk_size, size - off)) for off in range(0, size, self.chunk_size)]

    def hasher(self, device):
        """The GpuHasher of `device`, made at first use; None when none is usable (then, once,
        a debug line says why)."""
        if device not in self._hashers:
            t = time.monotonic()
            self._hashers[device] = GpuHasher.create(device) if self.gpu_hash else None
            self.setup["start"] += time.monotonic() - t
        return self._hashers[device]

    def _hash_streams(self, device):
        """HASH_STREAMS streams of `device` for the kernels of _gpu_ids, made at first use."""
        if device not in self._hash_stream_sets:
            cu = drv.driver()
            use_device(device)
            flags = cu.CUstream_flags.CU_STREAM_NON_BLOCKING
            self._hash_stream_sets[device] = [drv.check(cu.cuStreamCreate(flags), "create a hash stream")
                                              for _ in range(HASH_STREAMS)]
        return self._hash_stream_sets[device]

    def _gpu_ids(self, regions):
        """Per (device, pointer, size) of `regions`: its chunks' GPU ids, or None without a
        usable hasher (then every chunk is copied and hashed by put). The regions of each GPU are
        hashed at once, on HASH_STREAMS streams (GpuHasher.start_ids: one region's kernel alone
        leaves most SMs idle)."""
        out = [None] * len(regions)
        for device in sorted({d for d, _, _ in regions}):
            hasher = self.hasher(device)
            mine = [k for k, (d, ptr, _) in enumerate(regions)
                    if d == device and hasher is not None and hasher.supports(ptr, self.chunk_size)]
            if not mine:
                continue
            counts = [len(self._chunks(regions[k][2])) for k in mine]  # each region's slots of ids
            try:
                hasher.reserve(sum(counts))
                streams, first, pending = self._hash_streams(device), 0, []
                for n, (k, count) in enumerate(zip(mine, counts)):
                    _, ptr, size = regions[k]
                    pending.append((k, hasher.start_ids(ptr, size, self.chunk_size,
                                                        streams[n % len(streams)], first)))
                    first += count
                for k, ids in pending:
                    out[k] = ids.result()
            except DriverError as e:  # e.g. no GPU memory left for a larger id buffer: copy it all
                log.warning("GPU chunk hashing failed on GPU %s, copying every chunk: %s", device, e)
                for stream in self._hash_stream_sets.get(device, []):
                    drv.driver().cuStreamSynchronize(stream)  # nothing may still write its buffer
                self._hashers[device] = None
                hasher.close()
                for k in mine:
                    out[k] = None
        return out

    def _known(self, gpu_ids, size):
        """Per chunk of a region with these GPU ids (None: none), a PutResult when it needs no
        copy (all zero, or present in the store: mtime refreshed, as Store.put does for a
        PRESENT chunk), else None: ([id or None]*n, [PutResult or None]*n)."""
        chunks = self._chunks(size)
        if gpu_ids is None:
            return [None] * len(chunks), [None] * len(chunks)
        known = []
        for cid, (_, length) in zip(gpu_ids, chunks):
            if cid == zero_chunk_id(length):
                known.append(PutResult(None, length, PutStatus.ZERO))
            else:  # present in the store (refreshed as a PRESENT put), or None: to be copied
                known.append(self.store.claim_present(cid, length))
        return gpu_ids, known

    def save(self, key, ptr, size, device, meta=None):
        """Copy `size` bytes at device pointer `ptr` into the store; (manifest Allocation, CopyStats)."""
        return self.save_all([SaveItem(key, size, device, lambda: contextlib.nullcontext(ptr), meta)])[0]

    def save_all(self, items):
        """Save many allocations through one pipeline: [(manifest Allocation, CopyStats)] in order.

        Items are opened (item.open()) HASH_GROUP at a time: their GPU ids are computed at once,
        their device-to-host copies queued one item after the other, and once the copies are done
        their ids computed again at once (nothing may have changed), then they are closed; hashing
        and writing their chunks go on while the next groups are opened and copied, so many small
        allocations move at the rate of few large ones. The ring's slots are shared by all items:
        a slot is reused once its previous chunk, of whichever item, is stored."""
        cu = drv.driver()
        slot_futures = [None] * self.ring_slots
        next_slot = 0
        saves = []  # (item, gpu ids, results, [(chunk index, future)], unchanged bytes, start time,
        #            seconds to open it, seconds to close it)
        opened = []  # [item, its ExitStack, pointer, start time, seconds to open it] not yet closed
        items = list(items)
        try:
            for g in range(0, len(items), HASH_GROUP):
                for item in items[g:g + HASH_GROUP]:
                    self.prepare(item.device, ring=False)
                    t0 = time.monotonic()
                    stack = contextlib.ExitStack()
                    ptr = stack.enter_context(item.open())
                    opened.append((item, stack, ptr, t0, time.monotonic() - t0))
                group_ids = self._gpu_ids([(item.device, ptr, item.size) for item, _, ptr, _, _ in opened])
                queued = []  # per item of the group: (gpu ids, known, [(chunk index, future)], unchanged)
                for (item, _, ptr, _, _), ids in zip(opened, group_ids):
                    stream, events = self.prepare(item.device, ring=False)
                    gpu_ids, known = self._known(ids, item.size)
                    unchanged = sum(r.length for r in known if r is not None)
                    if unchanged:
                        self.progress(unchanged)
                    todo = [(i, off, n) for i, (off, n) in enumerate(self._chunks(item.size))
                            if known[i] is None]
                    if todo:
                        self.prepare(item.device)  # the pinned ring, only when something crosses the link
                    futures = []
                    for i, off, length in todo:
                        slot, next_slot = next_slot, (next_slot + 1) % self.ring_slots
                        _raise_failed(slot_futures)  # a failed put stops the save at once
                        if slot_futures[slot] is not None:
                            concurrent.futures.wait([slot_futures[slot]])  # its chunk is stored
                        drv.check(cu.cuMemcpyDtoHAsync(self._ring[slot].ptr, int(ptr) + off, length, stream),
                                  f"copy {item.key} to host")
                        drv.check(cu.cuEventRecord(events[slot], stream), "record a copy event")
                        cid = self._trusted_id(item.device, gpu_ids[i], length)
                        slot_futures[slot] = self.pool.submit(self._store_slot, item.device, events[slot],
                                                              slot, length, cid)
                        futures.append((i, slot_futures[slot]))
                    queued.append((gpu_ids, known, futures, unchanged))
                # The copies have read the group's memory: it may close while the puts go on.
                for device in sorted({item.device for item, *_ in opened}):
                    drv.check(cu.cuStreamSynchronize(self._streams[device]), "finish copying to host")
                self._check_unchanged([(item, ptr, gpu_ids) for (item, _, ptr, _, _), (gpu_ids, _, futures, _)
                                       in zip(opened, queued) if futures and gpu_ids[0] is not None])
                for gpu_ids, known, futures, unchanged in queued:
                    item, stack, _, t0, opening = opened.pop(0)
                    t1 = time.monotonic()
                    stack.close()
                    saves.append((item, gpu_ids, list(known), futures, unchanged, t0, opening,
                                  time.monotonic() - t1))
            return [self._finish_save(*save) for save in saves]
        except BaseException:
            _close_after_failure([(item.key, stack) for item, stack, *_ in opened], sys.exc_info(), "save")
            _settle([f for save in saves for _, f in save[3]] + [f for f in slot_futures if f])
            raise

    def _trusted_id(self, device, gpu_id, length):
        """The GPU id put may take without hashing the copied bytes; None (put hashes them, and
        _finish_save compares) for the sampled chunks and where there is no GPU id."""
        n, lengths = self._copied.setdefault(device, (0, set()))
        self._copied[device] = (n + 1, lengths)
        if gpu_id is None or n % HOST_CHECK_EVERY == 0 or length not in lengths:
            lengths.add(length)
            return None
        return gpu_id

    def _check_unchanged(self, copied):
        """The GPU ids of what was copied ([(item, pointer, ids before)]) computed again, at once,
        now that the copies are done: a chunk whose bytes changed since they were hashed would be
        stored under a name that is not its hash."""
        again = self._gpu_ids([(item.device, ptr, item.size) for item, ptr, _ in copied])
        for (item, _, before), after in zip(copied, again):
            if after is None:
                raise DriverError(f"{item.key}: its GPU ids could not be computed again once it was "
                                  "copied, so whether it changed meanwhile is unknown: the save fails")
            for (off, _), was, now in zip(self._chunks(item.size), before, after):
                if was != now:
                    raise DriverError(f"{item.key}: the GPU memory at offset {off} changed while it "
                                      "was saved (written after the processes were quiesced): the save "
                                      "fails rather than store bytes under a name that is not their hash")

    def _store_slot(self, device, event, slot, length, cid):
        use_device(device)
        drv.check(drv.driver().cuEventSynchronize(event), "wait for a device-to-host copy")
        result = self.store.put(self._ring[slot].view[:length], cid=cid)
        self.progress(length)
        return result

    def _finish_save(self, item, gpu_ids, results, futures, unchanged, t0, opening, closing):
        chunks = self._chunks(item.size)
        for i, f in futures:
            results[i] = f.result()
            if gpu_ids[i] is not None:
                _check_same_id(item.key, chunks[i][0], gpu_ids[i], results[i])
        stats = CopyStats(copied=item.size - unchanged, unchanged=unchanged, seconds=time.monotonic() - t0,
                          opening=opening, closing=closing)
        for r in results:
            if r.status is PutStatus.NEW:
                stats.written += r.length
            elif r.status is PutStatus.PRESENT:
                stats.deduplicated += r.length
            else:
                stats.zero += r.length
        return Allocation.from_puts(item.key, results, item.meta), stats

    def _gpu_checkable(self, allocation, ptr, device):
        """Whether the loaded bytes can be checked on the GPU: a usable hasher, and chunks cut as
        chunk_ids cuts them (every chunk chunk_size long but the last)."""
        if not self.verify_loads or not allocation.chunks:
            return False
        hasher = self.hasher(device)
        lengths = [c.length for c in allocation.chunks]
        return (hasher is not None and hasher.supports(ptr, self.chunk_size)
                and all(n == self.chunk_size for n in lengths[:-1]) and lengths[-1] <= self.chunk_size)

    def _check_on_gpu(self, loaded):
        """Every chunk of what was loaded ([(allocation, pointer, device)]) checked against its
        name (the zero id for a zero chunk) by ids computed on the GPU from the bytes now there,
        at once. A mismatch is reloaded with the check on the host, which finds a damaged cached
        copy (and reads the store instead) or a damaged chunk (ChunkDamaged)."""
        cu = drv.driver()
        ids = self._gpu_ids([(device, ptr, allocation.size) for allocation, ptr, device in loaded])
        for (allocation, ptr, device), got_ids in zip(loaded, ids):
            if got_ids is None:
                raise DriverError(f"{allocation.key}: its GPU ids could not be computed to check "
                                  "what was loaded: the load fails")
            off = 0
            for chunk, got in zip(allocation.chunks, got_ids):
                dst, off = int(ptr) + off, off + chunk.length
                want = chunk.id if not chunk.is_zero else zero_chunk_id(chunk.length)
                if got == want:
                    continue
                if chunk.is_zero:  # nothing stored: zero it again
                    drv.check(cu.cuMemsetD8(dst, 0, chunk.length), f"zero a chunk of {allocation.key}")
                else:  # a buffer of its own: the ring's slots may be in use by reads ahead
                    buf = (ctypes.c_char * chunk.length)()
                    self.store.get(chunk.id, memoryview(buf).cast("B"), verify=True)  # raises if damaged
                    drv.check(cu.cuMemcpyHtoD(dst, buf, chunk.length), f"reload a chunk of {allocation.key}")
                if self.hasher(device).hash_region(dst, chunk.length) != want:
                    raise DriverError(f"{allocation.key}: chunk {want} reads back wrong from GPU "
                                      "memory after a reload")

    def load(self, allocation, ptr, device):
        """Copy a manifest Allocation's bytes from the store to device pointer `ptr`; CopyStats."""
        return self.load_all([LoadItem(allocation, device, lambda: contextlib.nullcontext(ptr))])[0]

    def load_all(self, items):
        """Load many allocations through one pipeline: [CopyStats] in order.

        The store is read ahead across items, a ring's worth of chunks at most, so reading the
        next items' chunks overlaps copying this one's; a chunk whose file's pages were registered
        ahead (self.registered) is copied from them and takes no slot. Items are opened
        (item.open()) as their turn comes and closed HASH_GROUP at a time, once their host-to-device
        copies are done and, with verify_loads, checked. With verify_loads every chunk is checked
        against its name: on the GPU after the copies when it can (the group's allocations hashed
        at once, at TB/s), else on the host as each chunk is read. An item loaded ahead (its
        `staged` bytes, gpu/staging.py, checked there) is copied device to device instead of read."""
        cu = drv.driver()
        items = list(items)
        order = [(k, i) for k, item in enumerate(items) if item.staged is None
                 for i, c in enumerate(item.allocation.chunks) if not c.is_zero]

        def pages_of(chunk):  # its file's registered pages, or None: read into the ring
            pages = self.registered.get(chunk.id)
            return pages if pages is not None and pages.size == chunk.length else None
        need_ring = any(pages_of(items[k].allocation.chunks[i]) is None for k, i in order)
        for item in items:
            self.prepare(item.device, ring=need_ring)
            total = sum(c.length for c in item.allocation.chunks)
            if total != item.allocation.size:
                raise ValueError(f"allocation {item.allocation.key}: chunks add up to {total}, "
                                 f"not {item.allocation.size}")
        # Imported and re-created memory is mapped at the granularity, so every pointer suits the
        # GPU check; one that does not is caught when open and its chunks checked on the host.
        on_gpu = [item.staged is None and self._gpu_checkable(item.allocation, 0, item.device)
                  for item in items]
        reads = {}  # (item, chunk) -> (slot or None, future) for reads started and not yet copied
        slot_copy = [None] * self.ring_slots  # the event of the copy last started from the slot
        state = {"next": 0, "copied": 0, "ring": 0}

        def read(slot, chunk, verify):
            self.store.get(chunk.id, self._ring[slot].view[:chunk.length], verify=verify)
            return self._ring[slot]

        def registered(pages, chunk, verify):
            if verify:
                self.store.check_chunk(chunk.id, pages.view)
            return pages

        def read_ahead():
            # Ring read r uses slot r % ring_slots, free once read r - ring_slots was copied.
            while state["next"] < len(order) and state["next"] - state["copied"] < self.ring_slots:
                k, i = order[state["next"]]
                chunk = items[k].allocation.chunks[i]
                verify = self.verify_loads and not on_gpu[k]
                pages = pages_of(chunk)
                if pages is not None:
                    reads[(k, i)] = (None, self.pool.submit(registered, pages, chunk, verify))
                else:
                    slot = state["ring"] % self.ring_slots
                    state["ring"] += 1
                    if slot_copy[slot] is not None:
                        drv.check(cu.cuEventSynchronize(slot_copy[slot]), "wait for a host-to-device copy")
                        slot_copy[slot] = None
                    reads[(k, i)] = (slot, self.pool.submit(read, slot, chunk, verify))
                state["next"] += 1

        def from_store(k, item, ptr, stream, events, stats):
            """Queue item k's copies; -> whether its bytes are to be checked on the GPU."""
            host_check = on_gpu[k] and not self._gpu_checkable(item.allocation, ptr, item.device)
            off = 0
            for i, chunk in enumerate(item.allocation.chunks):
                dst, off = int(ptr) + off, off + chunk.length
                if chunk.is_zero:
                    drv.check(cu.cuMemsetD8Async(dst, 0, chunk.length, stream), "zero a chunk")
                    stats.zero += chunk.length
                    continue
                read_ahead()
                slot, future = reads.pop((k, i))
                source = future.result()  # a ring buffer, or a chunk file's registered pages
                if host_check:  # read unchecked for the GPU check this pointer cannot have
                    if slot is None:
                        self.store.check_chunk(chunk.id, source.view)
                    else:
                        self.store.get(chunk.id, source.view[:chunk.length], verify=True)
                drv.check(cu.cuMemcpyHtoDAsync(dst, source.ptr, chunk.length, stream),
                          f"copy {item.allocation.key} to the GPU")
                if slot is None:
                    stats.in_place += chunk.length
                else:
                    drv.check(cu.cuEventRecord(events[slot], stream), "record a copy event")
                    slot_copy[slot] = events[slot]
                state["copied"] += 1
                self.progress(chunk.length)
            read_ahead()  # the next items' reads run while this copy ends
            return on_gpu[k] and not host_check

        results = []
        opened = []  # [item, its ExitStack, pointer, start time, CopyStats, checked on the GPU]
        #              not yet closed; an item's CopyStats.seconds leave out its group's end (the
        #              wait for the copies, the check): shared, it would count once per item
        try:
            for k, item in enumerate(items):
                stream, events = self.prepare(item.device, ring=need_ring)
                t0 = time.monotonic()
                stats = CopyStats(copied=item.allocation.size)
                stack = contextlib.ExitStack()
                ptr = stack.enter_context(item.open())
                stats.opening = time.monotonic() - t0
                opened.append([item, stack, ptr, t0, stats, False])
                if item.staged is not None:
                    self._copy_staged(item, ptr, stream, stats)
                else:
                    opened[-1][5] = from_store(k, item, ptr, stream, events, stats)
                stats.seconds = time.monotonic() - t0  # its own part: the group's end is shared
                if len(opened) == HASH_GROUP or k == len(items) - 1:
                    self._end_load_group(opened, results)
            return results
        except BaseException:
            exc = sys.exc_info()
            _settle([f for _, f in reads.values()])
            for stream in self._streams.values():
                cu.cuStreamSynchronize(stream)
            _close_after_failure([(item.allocation.key, stack) for item, stack, *_ in opened], exc, "load")
            raise

    def _end_load_group(self, opened, results):
        """The group's copies waited for, its bytes checked on the GPU at once, then each item
        closed in order (taken from `opened`, its CopyStats added to `results`)."""
        cu = drv.driver()
        for device in sorted({item.device for item, *_ in opened}):
            drv.check(cu.cuStreamSynchronize(self._streams[device]), "finish loading to the GPU")
        self._check_on_gpu([(item.allocation, ptr, item.device)
                            for item, _, ptr, _, _, checked in opened if checked])
        while opened:
            item, stack, _, _, stats, _ = opened.pop(0)
            t1 = time.monotonic()
            stack.close()
            stats.closing = time.monotonic() - t1
            stats.seconds += stats.closing
            results.append(stats)

    def _copy_staged(self, item, ptr, stream, stats):
        """An item loaded ahead (gpu/staging.py, which checked its bytes as this engine checks
        what it reads): copied device to device, and trusted as the driver's copies are. Not
        checked a second time: on the H200 that check took 0.16 s for 40 GiB here (0.02 s for the
        same kernel on a GPU kept busy), about a tenth of a restore's GPU side."""
        cu = drv.driver()
        size = item.allocation.size
        drv.check(cu.cuMemcpyDtoDAsync(int(ptr), int(item.staged), size, stream),
                  f"copy {item.allocation.key} from what was loaded ahead")
        drv.check(cu.cuStreamSynchronize(stream), f"finish copying {item.allocation.key}")
        stats.ahead = size
        stats.zero = sum(c.length for c in item.allocation.chunks if c.is_zero)
        self.progress(size)


@dataclasses.dataclass
class SaveItem:
    """One allocation for save_all: open() is a context manager giving its device pointer."""
    key: str
    size: int
    device: int
    open: object
    meta: dict = None


@dataclasses.dataclass
class LoadItem:
    """One manifest Allocation for load_all: open() is a context manager giving the pointer
    to load it to. staged: a device pointer (same GPU) already holding its bytes, loaded ahead
    and checked (gpu/staging.py): copied from there instead of read from the store."""
    allocation: object
    device: int
    open: object
    staged: object = None


def _raise_failed(futures):
    """The first exception of a finished future, raised now rather than after the whole save."""
    for f in futures:
        if f is not None and f.done() and not f.cancelled() and f.exception() is not None:
            raise f.exception()


def _check_same_id(key, off, gpu_id, result):
    """A copied chunk's id as put computed it (CPU; for the sampled chunks, put takes the others'
    GPU ids) must be the GPU's: else the GPU hash cannot be trusted, nor the chunks it called
    unchanged, and the save fails."""
    cpu_id = result.chunk_id if result.chunk_id is not None else zero_chunk_id(result.length)
    if cpu_id != gpu_id:
        raise DriverError(f"{key}: the chunk at offset {off} hashed to {gpu_id} on the GPU but "
                          f"{cpu_id} on the CPU; save with CRIU_GPUSHARE_GPU_HASH=0 and report this")
