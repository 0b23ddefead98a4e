"""The copy engine's pinned buffers on the fake driver: this process's own memory, registered with
the driver (so copies run at link speed), made on many threads, and given back whole."""
import json
import subprocess
import sys

SCRIPT = r"""
import json, threading
from criu_gpushare.gpu import driver as drv, memory
cu = drv.driver()
memory.use_device(0)
MIB = 1 << 20

def registered(b):
    return cu.cuMemHostGetFlags(b.ptr)[0] == cu.CUresult.CUDA_SUCCESS

out = {}
threads = set()
real = memory.PinnedBuffer
def traced(size):
    threads.add(threading.current_thread().name)
    return real(size)
memory.PinnedBuffer = traced
bufs = memory.pin_buffers(MIB, 5)
memory.PinnedBuffer = real
out["count"], out["threads"] = len(bufs), len(threads)
out["registered"] = all(registered(b) for b in bufs)
# one ring serves every GPU of a group: pinned for each context, not the registering one alone
out["portable"] = all(cu.cuMemHostGetFlags(b.ptr)[1] & 0x01 for b in bufs)  # ..._PORTABLE
spans = sorted((b.ptr, b.ptr + b.size) for b in bufs)
out["apart"] = all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
dev = drv.check(cu.cuMemAlloc(MIB), "alloc")
drv.check(cu.cuMemsetD8(dev, 0x5A, MIB), "memset")
drv.check(cu.cuMemcpyDtoH(bufs[2].ptr, dev, MIB), "copy out")
out["copied"] = bytes(bufs[2].view[:4]) == b"\x5a" * 4 and bufs[2].view[MIB - 1] == 0x5A
bufs[0].free()
out["unregistered_after_free"] = not registered(bufs[0])

calls = {"n": 0}
made = []
def third_fails(size):
    calls["n"] += 1
    if calls["n"] == 3:
        raise drv.DriverError("no pinned memory left")
    b = real(size)
    made.append(b)
    return b
memory.PinnedBuffer = third_fails
try:
    memory.pin_buffers(MIB, 4)
    out["failure"] = "none raised"
except drv.DriverError as e:
    out["failure"] = str(e)
out["freed_on_failure"] = len(made) == 3 and not any(registered(b) for b in made)
print(json.dumps(out))
"""


def test_pinned_buffers_are_registered_apart_and_freed(fake_env):
    r = subprocess.run([sys.executable, "-c", SCRIPT], env=fake_env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["count"] == 5 and out["threads"] > 1, out  # made on a pool of threads
    assert out["registered"] and out["apart"] and out["copied"], out
    assert out["portable"], out  # a group's GPUs other than the first copy through them at link speed
    assert out["unregistered_after_free"], out
    # one buffer that cannot be pinned: the error, and every buffer already made given back
    assert out["failure"].endswith("no pinned memory left") and out["freed_on_failure"], out


RING = r"""
import json, threading
from criu_gpushare.gpu import driver as drv, memory
cu = drv.driver()
memory.use_device(0)
MIB = 1 << 20
real = memory.PinnedBuffer
memory.PIN_THREADS = 1  # the buffers in slot order, one at a time
gate = threading.Event()
made = []
def gated(size):  # the first buffer at once, the others once the gate opens; the third fails
    if made:
        gate.wait()
    if len(made) == 2:
        made.append(None)
        raise drv.DriverError("no pinned memory left")
    b = real(size)
    made.append(b)
    return b
memory.PinnedBuffer = gated
waits = []
ring = memory.PinnedRing(MIB, 4, on_wait=waits.append)
out = {"first_before_the_rest": ring[0].ptr == made[0].ptr and len(made) == 1}
before = len(waits)
real_wait = memory.concurrent.futures.wait
def opens_the_gate(fs, *a, **kw):  # the gate opens once ring[1] waits: the wait is certain
    gate.set()
    return real_wait(fs, *a, **kw)
memory.concurrent.futures.wait = opens_the_gate
out["second"] = ring[1].ptr == made[1].ptr
memory.concurrent.futures.wait = real_wait
out["waited_once"] = len(waits) == before + 1 and waits[-1] > 0
try:
    ring[2]
    out["failed_slot"] = "no error"
except drv.DriverError as e:
    out["failed_slot"] = str(e)
out["fourth"] = ring[3] is not None
kept = ring.release()
out["kept"] = len(kept)
out["kept_registered"] = all(cu.cuMemHostGetFlags(b.ptr)[0] == cu.CUresult.CUDA_SUCCESS for b in kept)
memory.keep_pinned(kept)
memory.PinnedBuffer = real
again = memory.PinnedRing(MIB, 4)
out["reused"] = sorted(b.ptr for b in list(again)[:3]) == sorted(b.ptr for b in kept)
again.release()
print(json.dumps(out))
"""


def test_a_ring_gives_its_first_buffers_while_the_rest_are_pinned_and_keeps_what_it_made(fake_env):
    """memory.PinnedRing: a buffer is usable once pinned, before the others; the making thread's
    wait is counted; a buffer that cannot be pinned raises where it is asked for; the buffers
    made go back whole, and a later ring takes them instead of pinning anew."""
    r = subprocess.run([sys.executable, "-c", RING], env=fake_env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["first_before_the_rest"] and out["second"] and out["waited_once"], out
    assert out["failed_slot"].endswith("no pinned memory left") and out["fourth"], out
    assert out["kept"] == 3 and out["kept_registered"] and out["reused"], out


AHEAD = r"""
import json, threading
from criu_gpushare.gpu import driver as drv, memory
cu = drv.driver()
memory.use_device(0)
MIB = 1 << 20
real = memory.PinnedBuffer
memory.PIN_THREADS = 1  # in slot order, one at a time
gate = threading.Event()
made, where = [], set()
def gated(size):  # the first buffer at once, the others once the gate opens
    if made:
        gate.wait()
    where.add(threading.current_thread().name)
    b = real(size)
    made.append(b)
    return b
memory.PinnedBuffer = gated
memory.keep_pinned([real(MIB)])  # one kept from an earlier engine
memory.pin_ahead(MIB, 4, 0)  # lacks three
memory.pin_ahead(MIB, 4, 0)  # nothing more: kept and pinned ahead count
ring = memory.PinnedRing(MIB, 4)
out = {"taken_while_pinning": len(made) <= 1}
first = ring[1]  # the first buffer pinned ahead, before the others exist
out["first_alone"] = first.ptr == made[0].ptr and len(made) == 1
gate.set()
buffers = list(ring)
out["all_from_ahead"] = [b.ptr for b in buffers[1:]] == [b.ptr for b in made]
out["pinned_by_ahead_only"] = len(made) == 3 and all(n.startswith("pin-ahead") for n in where)
memory.keep_pinned(ring.release())

memory.PinnedBuffer = lambda size: (_ for _ in ()).throw(drv.DriverError("no pinned memory left"))
memory.pin_ahead(MIB, 6, 0)  # two more than kept: both fail ahead
failing = memory.PinnedRing(MIB, 6)
try:
    failing[5]  # pinned again when asked for: fails again
    out["failed"] = "no error"
except drv.DriverError as e:
    out["failed"] = str(e)
out["kept_still_given"] = failing[0] is not None
memory.PinnedBuffer = real
out["pinned_again"] = failing[4].size == MIB and cu.cuMemHostGetFlags(failing[4].ptr)[0] == cu.CUresult.CUDA_SUCCESS
print(json.dumps(out))
"""


def test_a_ring_takes_what_is_pinned_ahead_buffer_by_buffer(fake_env):
    """memory.pin_ahead: pins what the next ring lacks (kept buffers and buffers already being
    pinned ahead count), and that ring takes each buffer as it is pinned: its first is usable
    while the others are still pinned, and it pins none itself; a buffer that failed ahead is
    pinned by the ring when asked for (raising where that fails too), the others are given."""
    r = subprocess.run([sys.executable, "-c", AHEAD], env=fake_env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.splitlines()[-1])
    assert out["taken_while_pinning"] and out["first_alone"], out
    assert out["all_from_ahead"] and out["pinned_by_ahead_only"], out
    assert out["failed"].endswith("no pinned memory left") and out["kept_still_given"], out
    assert out["pinned_again"], out  # a buffer that failed ahead, pinned by the ring when asked


FAULTED = r"""
import json
from criu_gpushare.gpu import driver as drv, memory
cu = drv.driver()
memory.use_device(0)
MIB = 1 << 20

def mapped(addr):
    with open("/proc/self/maps") as f:
        return any(int(line.split("-")[0], 16) <= addr < int(line.split("-")[1].split()[0], 16) for line in f)

memory.keep_pinned([memory.PinnedBuffer(MIB)])  # one kept from an earlier engine
memory.fault_in_ahead(MIB, 3)  # lacks two
memory.fault_in_ahead(MIB, 3)  # nothing more: kept and faulted in ahead count
ahead = [f.result() for _, f in memory._faulted]
out = {"faulted": len(ahead), "mapped": all(mapped(a) for a in ahead)}
taken = memory.PinnedBuffer(MIB)
out["took_one"] = taken.ptr == ahead[0] and len(memory._faulted) == 1
out["registered"] = cu.cuMemHostGetFlags(taken.ptr)[0] == cu.CUresult.CUDA_SUCCESS
memory.drop_faulted()  # a suspend that ended before its save took the rest
out["dropped"] = not memory._faulted and not mapped(ahead[1]) and mapped(taken.ptr)
print(json.dumps(out))
"""


def test_a_ring_s_pages_faulted_in_ahead_are_taken_or_given_back(fake_env):
    """memory.fault_in_ahead: the pages the next ring lacks (kept buffers count) faulted in before
    any is pinned; a buffer pinned later takes them (registering only); drop_faulted unmaps the
    rest, so a suspend that never saved keeps no memory for a ring."""
    r = subprocess.run([sys.executable, "-c", FAULTED], env=fake_env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["faulted"] == 2 and out["mapped"], out
    assert out["took_one"] and out["registered"], out
    assert out["dropped"], out
