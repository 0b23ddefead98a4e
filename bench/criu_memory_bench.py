#!/usr/bin/env python3
"""CRIU's own part of a dump and a restore: a process's host memory, per transparent huge page mode.

    python3 bench/criu_memory_bench.py                       # 1 GiB, modes madvise and always, 3 runs
    python3 bench/criu_memory_bench.py --gib 2 --runs 5 --json

Through CRIU, the tool leaves the GPU memory out of the image, and what is left in CRIU's hands is
the processes' host memory: about 1 GiB for a torch process (bench/RESULTS.md). CRIU's phases of
a dump and a restore (`criu dump (freeze, memory, images)`, `criu restore (processes, host
memory)`) then bound what the tool cannot move. This bench times that part alone, no GPU needed:
one plain process holding --gib GiB of random bytes in anonymous memory (the anonymous memory of a
real workload: its heap, the driver's host copies), dumped with `criu dump` into a tmpfs image
directory and restored with `criu restore -d`, its memory checked afterwards (a CRC it took
before the dump, against one it takes again). Each transparent huge page mode is set for the whole
cycle (the workload's memory takes the mode in force when it is faulted in, CRIU's restore too)
and put back at the end; setting it needs root. --collapse adds, per mode, cycles whose workload
memory the bench collapses into 2 MiB pages from outside just before the dump (process_madvise
MADV_COLLAPSE, as a tool could), the collapse timed. --cold (images on a disk: --dir) drops the
page cache between the dump and the restore, in two kinds of cycle per mode: CRIU reading its
page images as it restores (MODE+cold), and the page images read ahead in a thread as the restore
starts (MODE+cold+ahead: criu/images.py read_pages_ahead, as a restore of the tool does). With
--beside-store GIB also three kinds where a chunk store in --dir is read beside the restore, as
the tool reads it into GPU memory while CRIU restores (GIB of 64 MiB chunks, 16 threads, O_DIRECT,
through the store's own code): at once with no read ahead (+store), at once with it
(+ahead+store), after the page images were read (+pages-first+store), at once with the read
ahead, the store's readers in the idle I/O class (+ahead+idle-store), and after the page images
with CRIU's own binary and libraries read first (+criu-first+store: what CRIU, started from a cold
cache, would no longer wait for); the column `both s` is when the restore and the reading had both
ended. --durable (--dir on a disk) times what the tool's
post-dump adds to a dump: the image's file system synced after CRIU's dump (MODE+sync), and the
same with the image sent to the disk while CRIU writes it (MODE+writeback+sync: criu/images.py
WriteBack, as the tool's dump does); `durable s` is the dump and its sync.

Per mode, the medians of --runs cycles: the wall time of each command and CRIU's own account
(stats-dump: frozen, memdump, memwrite; stats-restore: restore), in seconds.
"""
import argparse
import ctypes
import json
import os
import shutil
import signal
import statistics
import mmap
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib as bl  # noqa: E402
from criu_gpushare.criu.images import WriteBack, read_pages_ahead, stats  # noqa: E402
from criu_gpushare.store import Store  # noqa: E402
from criu_gpushare.engine.dump import sync_image  # noqa: E402

# The workload: GIB GiB of random bytes in one anonymous mapping (a random 64 MiB, repeated, each
# 4 KiB page stamped with its index: CRIU copies pages as they are, whatever they hold), their
# CRC written to READY; on SIGUSR1 it computes the CRC again into CHECK.
WORKLOAD = r"""
import mmap, os, signal, struct, sys, time, zlib
gib, ready, check = float(sys.argv[1]), sys.argv[2], sys.argv[3]
size = int(gib * 2**30) // 2**26 * 2**26 or 2**26
mem = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # private, as a heap
base = os.urandom(2**26)
for off in range(0, size, 2**26):
    mem[off:off + 2**26] = base
for page in range(0, size, 4096):
    mem[page:page + 8] = struct.pack("<Q", page)
def crc():
    return str(zlib.crc32(mem))
def on_usr1(signum, frame):
    with open(check + ".tmp", "w") as f:
        f.write(crc())
    os.rename(check + ".tmp", check)
signal.signal(signal.SIGUSR1, on_usr1)
with open(ready + ".tmp", "w") as f:
    f.write(crc())
os.rename(ready + ".tmp", ready)
while True:
    time.sleep(3600)
"""


def _wait_for(path, timeout_s, proc=None):
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(path):
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the workload exited ({proc.returncode}) before it was ready")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{path} not written within {timeout_s} s")
        time.sleep(0.05)
    with open(path) as f:
        return f.read()


def _criu(criu, argv, images, timeout_s):
    """One CRIU command, bounded; -> its wall seconds. RuntimeError with the log's last error."""
    log = f"{argv[0]}.log"
    t0 = time.monotonic()
    r = subprocess.run([criu, *argv, "-D", images, "-o", log], stdin=subprocess.DEVNULL,
                       capture_output=True, text=True, timeout=timeout_s)
    wall = time.monotonic() - t0
    if r.returncode != 0:
        try:
            with open(os.path.join(images, log), errors="replace") as f:
                said = [ln for ln in f if "Error" in ln][-1:]
        except OSError:
            said = []
        raise RuntimeError(f"criu {argv[0]} exit {r.returncode}: {''.join(said).strip() or r.stderr.strip()}")
    return wall


def process_state(pid):
    """What a process that does not answer is doing: its state, its signal masks, where it waits."""
    try:
        with open(f"/proc/{pid}/status") as f:
            said = [ln.strip().replace("\t", " ") for ln in f
                    if ln.startswith(("State", "SigPnd", "ShdPnd", "SigBlk", "SigCgt"))]
        for name in ("wchan", "syscall"):
            with open(f"/proc/{pid}/{name}") as f:
                said.append(f"{name}: {f.read().strip()}")
    except OSError as e:
        return f"pid {pid}: {e.strerror}"
    return f"pid {pid}: " + ", ".join(said)


MADV_COLLAPSE = 25             # linux/mman.h; process_madvise takes it since Linux 6.1
SYS_PROCESS_MADVISE = 440      # the same number on x86-64 and arm64


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def anonymous_areas(pid, least=2 << 20):
    """(start, end) of pid's private writable anonymous mappings of at least `least` bytes (its
    heap included): what CRIU copies into the image page by page."""
    out = []
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            fields = line.split()
            span, perms = fields[0], fields[1]
            name = fields[5] if len(fields) > 5 else ""
            start, end = (int(x, 16) for x in span.split("-"))
            if perms.startswith("rw") and perms[3] == "p" and name in ("", "[heap]") and end - start >= least:
                out.append((start, end))
    return out


def collapse(pid):
    """Ask the kernel to put pid's anonymous memory in 2 MiB pages now (process_madvise
    MADV_COLLAPSE, as a tool could from outside before CRIU dumps it); -> (seconds, bytes
    collapsed). An area that cannot be collapsed (pages shared, no huge page free) is skipped."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    pidfd = os.pidfd_open(pid)
    done, t0 = 0, time.monotonic()
    try:
        for start, end in anonymous_areas(pid):
            iov = _IoVec(start, end - start)
            n = libc.syscall(SYS_PROCESS_MADVISE, pidfd, ctypes.byref(iov), 1, MADV_COLLAPSE, 0)
            done += max(0, n)
    finally:
        os.close(pidfd)
    return time.monotonic() - t0, done


class ColdKind(NamedTuple):
    """One kind of --cold restore."""
    suffix: str             # of the row's name
    read_ahead: bool        # the page images read ahead (read_pages_ahead)
    store: str | None       # the BesideStore read beside: None, "at once", "after the pages"
    idle: bool = False      # its readers in the idle I/O class
    criu_first: bool = False  # CRIU's binary and libraries read before anything


COLD_KINDS = {"cold": ColdKind("+cold", False, None), "ahead": ColdKind("+cold+ahead", True, None),
              "store": ColdKind("+cold+store", False, "at once"),
              "ahead+store": ColdKind("+cold+ahead+store", True, "at once"),
              "pages-first+store": ColdKind("+cold+pages-first+store", True, "after the pages"),
              "idle-store": ColdKind("+cold+ahead+idle-store", True, "at once", idle=True),
              "criu-first+store": ColdKind("+cold+criu-first+store", True, "after the pages", criu_first=True)}
CHUNK = 64 << 20
STORE_READERS = 16  # as the tool's load (gpu/copy_engine.py: one per CPU, at most 16)


_SYS_IOPRIO_SET = {"x86_64": 251, "aarch64": 30}
IOPRIO_WHO_PROCESS, IOPRIO_CLASS_IDLE, IOPRIO_CLASS_SHIFT = 1, 3, 13  # the kernel's ioprio values


def set_idle_io_priority():
    """This thread's I/O in the idle class (ioprio_set(2) on its thread id)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    if libc.syscall(_SYS_IOPRIO_SET[os.uname().machine], IOPRIO_WHO_PROCESS, threading.get_native_id(),
                    IOPRIO_CLASS_IDLE << IOPRIO_CLASS_SHIFT) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"ioprio_set: {os.strerror(err)}")


def io_scheduler(path):
    """The I/O scheduler of the disk that holds path (sysfs: the bracketed word), or None."""
    dev = os.stat(path).st_dev
    base = f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}"
    for where in (base, os.path.join(base, "..")):  # a partition's queue is its disk's
        try:
            with open(os.path.join(where, "queue", "scheduler")) as f:
                text = f.read()
        except OSError:
            continue
        return text[text.index("[") + 1:text.index("]")] if "[" in text else text.strip()
    return None


def criu_files(criu):
    """The files CRIU runs from: its binary and the shared libraries it loads (ldd)."""
    binary = os.path.realpath(shutil.which(criu) or criu)
    listed = subprocess.run(["ldd", binary], capture_output=True, text=True, timeout=60).stdout
    return [binary] + sorted({w for w in listed.split() if w.startswith("/")})


def read_whole(paths):
    """Each file read into the page cache."""
    for path in paths:
        with open(path, "rb") as f:
            while f.read(8 << 20):
                pass


class BesideStore:
    """A chunk store of `gib` GiB of distinct 64 MiB chunks in `work`, read whole on demand by
    STORE_READERS threads (O_DIRECT, unverified: as a load reads)."""

    def __init__(self, work, gib):
        self.store = Store.open(os.path.join(work, "store"), create=True)
        self.buffers = [mmap.mmap(-1, CHUNK) for _ in range(STORE_READERS)]  # aligned, as pinned memory
        base = os.urandom(CHUNK)
        self.ids = []
        for i in range(max(1, int(gib * (1 << 30)) // CHUNK)):
            view = memoryview(self.buffers[0])
            view[:] = base
            view[:8] = i.to_bytes(8, "little")
            self.ids.append(self.store.put(view).chunk_id)
        self.store.sync()
        self.bytes = len(self.ids) * CHUNK

    def read_all(self, idle=False):
        """Every chunk read once; idle: each reader in the idle I/O class (the disk serves it only
        when nothing else asks; honoured by the mq-deadline and bfq schedulers, not by none)."""
        order, lock = iter(self.ids), threading.Lock()

        def reader(t):
            if idle:
                set_idle_io_priority()
            view = memoryview(self.buffers[t])
            while True:
                with lock:
                    cid = next(order, None)
                if cid is None:
                    return
                self.store.get(cid, view, verify=False)
        with ThreadPoolExecutor(STORE_READERS) as pool:
            for f in [pool.submit(reader, t) for t in range(STORE_READERS)]:
                f.result()

    def close(self):
        self.store.close()


def cycle(args, work, collapse_first=False, cold=None, beside=None, durable=None):
    """One dump and restore of a fresh workload (with collapse_first, its memory collapsed into
    huge pages just before the dump; with durable, see dump(); with cold and beside, see
    restore()); -> its figures."""
    images = tempfile.mkdtemp(prefix="images.", dir=work)
    ready, check = os.path.join(work, "ready"), os.path.join(work, "check")
    for p in (ready, check):
        if os.path.exists(p):
            os.unlink(p)
    # its own session, stdio on /dev/null: a process CRIU dumps and restores without --shell-job
    proc = subprocess.Popen([sys.executable, "-c", WORKLOAD, str(args.gib), ready, check],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    pid = proc.pid
    try:
        before = _wait_for(ready, args.timeout, proc)
        collapsed = collapse(pid) if collapse_first else None
        out = dump(args, pid, images, durable)
        proc.wait(timeout=10)  # CRIU ended it
        out.update(restore(args, images, cold, beside))
        os.kill(pid, signal.SIGUSR1)  # restored under its own pid
        try:
            out["check"] = "ok" if _wait_for(check, args.timeout) == before else "DIFFERS"
        except RuntimeError as e:
            raise RuntimeError(f"the restored workload did not answer: {e}; {process_state(pid)}") from None
        if collapsed:
            out["collapse_s"], out["collapsed_bytes"] = collapsed
        for action in ("dump", "restore"):
            out.update({f"{action}.{k}": v for k, v in stats(images, action).items()})
        out["image_bytes"] = sum(e.stat().st_size for e in os.scandir(images) if e.is_file())
        return out
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        bl.reap_children()
        shutil.rmtree(images, ignore_errors=True)


def dump(args, pid, images, durable=None):
    """`criu dump` of pid into images; with durable, the image's file system synced after it,
    timed (durable="writeback": WriteBack running during the dump, stopped before the sync);
    -> {"dump_s"[, "sync_s", "durable_s"]}."""
    if durable:
        os.sync()  # what was dirty before: not the image's
    writeback = WriteBack(images)
    if durable == "writeback":
        writeback.start()
    out = {"dump_s": _criu(args.criu, ["dump", "-t", str(pid)], images, args.timeout)}
    if durable:
        t0 = time.monotonic()
        writeback.stop()
        sync_image(images)  # as the tool's post-dump syncs an image apart from its store
        out["sync_s"] = time.monotonic() - t0
        out["durable_s"] = out["dump_s"] + out["sync_s"]
    return out


def restore(args, images, cold=None, beside=None):
    """`criu restore -d` of images; with cold (a COLD_KINDS key), the page cache dropped first,
    then as that kind says: CRIU's files read first, the page images read ahead, the BesideStore
    `beside` read beside it; -> {"restore_s"[, "store_s", "both_s"]}."""
    if cold:
        why = bl.drop_page_cache()
        if why:
            raise RuntimeError(f"--cold: {why}")
    kind = COLD_KINDS[cold] if cold else ColdKind("", False, None)
    t0 = time.monotonic()
    if kind.criu_first:
        read_whole(criu_files(args.criu))  # what CRIU runs from: its binary, its libraries
    ahead = read_pages_ahead(images) if kind.read_ahead else None
    if kind.read_ahead and ahead is None:
        raise RuntimeError(f"--cold: no read ahead in {images} (a tmpfs, or too little memory)")
    store_ended = []

    def read_store():
        if kind.store == "after the pages":
            ahead.join()
        beside.read_all(idle=kind.idle)
        store_ended.append(time.monotonic())
    reading = threading.Thread(target=read_store, daemon=True) if kind.store else None
    if reading:
        reading.start()
    _criu(args.criu, ["restore", "-d"], images, args.timeout)
    out = {"restore_s": time.monotonic() - t0}  # the read ahead's start included
    if reading:
        reading.join(args.timeout)
        if not store_ended:
            raise RuntimeError("the store's reading failed or did not end")
        out["store_s"] = store_ended[0] - t0
        out["both_s"] = max(out["restore_s"], out["store_s"])
    return out


COLUMNS = [("collapse_s", "collapse"), ("dump_s", "dump s"), ("dump.frozen", "frozen"),
           ("dump.memdump", "memdump"), ("dump.memwrite", "memwrite"), ("sync_s", "sync s"),
           ("durable_s", "durable s"), ("restore_s", "restore s"),
           ("restore.restore", "restore"), ("store_s", "store s"), ("both_s", "both s")]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gib", type=float, default=1.0, help="GiB of anonymous memory in the workload")
    ap.add_argument("--runs", type=int, default=3, help="cycles per mode (medians reported)")
    ap.add_argument("--modes", default="madvise,always",
                    help="transparent huge page modes to compare, in order (always, madvise, never)")
    ap.add_argument("--dir", default="/dev/shm", help="where the image directories go (a tmpfs; a disk for --cold and --durable)")
    ap.add_argument("--criu", default=shutil.which("criu") or "criu", help="the criu binary")
    ap.add_argument("--timeout", type=float, default=300, help="seconds for each command")
    ap.add_argument("--collapse", action="store_true",
                    help="also, per mode, cycles whose workload memory is collapsed into huge pages "
                         "(process_madvise MADV_COLLAPSE) just before the dump: rows MODE+collapse")
    ap.add_argument("--cold", action="store_true",
                    help="the page cache dropped before each restore (root; --dir on a disk): rows "
                         "MODE+cold, CRIU reading its images alone, and MODE+cold+ahead, the page "
                         "images read ahead as the tool's restore does")
    ap.add_argument("--durable", action="store_true",
                    help="the image made durable after each dump, as the tool's post-dump does "
                         "(syncfs, timed: rows MODE+sync), and the same with the image sent to the "
                         "disk while CRIU writes it (criu/images.py WriteBack: MODE+writeback+sync); "
                         "--dir on a disk")
    ap.add_argument("--beside-store", type=float, metavar="GIB",
                    help="with --cold: also rows with a chunk store of GIB GiB in --dir read beside "
                         "the restore (at once, at once with the read ahead, after the page images, "
                         "its readers idle)")
    ap.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    args = ap.parse_args(argv)
    if args.beside_store and not args.cold:
        ap.error("--beside-store needs --cold")
    if sum(map(bool, (args.cold, args.collapse, args.durable))) > 1:
        ap.error("--cold, --collapse, --durable: one question at a time")
    modes = [m for m in args.modes.split(",") if m]
    bad = [m for m in modes if m not in ("always", "madvise", "never")]
    if bad:
        ap.error(f"--modes: {', '.join(bad)}: each must be always, madvise or never")
    bl.become_subreaper()  # the restored workload is reaped here
    os.makedirs(args.dir, exist_ok=True)
    work = tempfile.mkdtemp(prefix="criu-memory-bench.", dir=args.dir)
    before = bl.thp_mode()
    try:
        results = measure(args, modes, work)
    except (RuntimeError, subprocess.TimeoutExpired) as e:  # a CRIU that fails, or hangs
        sys.exit(f"criu_memory_bench: {e}")
    finally:
        if before:
            bl.set_thp_mode(before)
        shutil.rmtree(work, ignore_errors=True)
    report(args, results, before)
    return 0 if all(r["check"] == "ok" for r in results.values()) else 1


def measure(args, modes, work):
    """{row name: medians of --runs cycles} per mode, and per mode collapsed with --collapse."""
    beside = BesideStore(work, args.beside_store) if args.beside_store else None
    try:
        return _measure(args, modes, work, beside)
    finally:
        if beside:
            beside.close()


def _measure(args, modes, work, beside):
    results = {}
    for mode in modes:
        bl.set_thp_mode(mode)
        # (row suffix, cycle's keyword arguments)
        kinds = [("", {})] + ([("+collapse", {"collapse_first": True})] if args.collapse else [])
        if args.cold:
            kinds = [(kind.suffix, {"cold": k}) for k, kind in COLD_KINDS.items()
                     if args.beside_store or kind.store is None]
        if args.durable:
            kinds = [("+sync", {"durable": "sync"}), ("+writeback+sync", {"durable": "writeback"})]
        for suffix, kind in kinds:
            runs = [cycle(args, work, beside=beside, **kind) for _ in range(args.runs)]
            row = {k: round(statistics.median(r[k] for r in runs), 3)
                   for k in runs[0] if isinstance(runs[0][k], (int, float))}
            row["check"] = "ok" if all(r["check"] == "ok" for r in runs) else "DIFFERS"
            row["runs"] = args.runs
            results[mode + suffix] = row
    return results


def report(args, results, before):
    if args.json:
        print(json.dumps({"gib": args.gib, "modes": results, "thp_before": before,
                          "io_scheduler": io_scheduler(args.dir) if args.cold else None}, indent=2))
        return
    print(f"CRIU, {args.gib:g} GiB of anonymous memory, images in {args.dir}, median of {args.runs} (s)"
          + (", the page cache dropped before each restore" if args.cold else "")
          + (f", a store of {args.beside_store:g} GiB read beside it (+store rows)" if args.beside_store else "")
          + (f"; I/O scheduler of {args.dir}: {io_scheduler(args.dir)}" if args.cold else ""))
    width = max(17, *(len(m) + 1 for m in results))
    print(f"{'THP mode':<{width}}" + "".join(f"{title:>10}" for _, title in COLUMNS) + f"{'pages':>10}  check")
    for mode, r in results.items():
        print(f"{mode:<{width}}" + "".join(f"{r[k]:>10.2f}" if k in r else f"{'-':>10}" for k, _ in COLUMNS)
              + f"{r.get('dump.pages_written', 0):>10.0f}  {r['check']}")


if __name__ == "__main__":
    sys.exit(main())
