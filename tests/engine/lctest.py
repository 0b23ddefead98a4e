"""Helpers of the suspend/resume tests: sharing memory between workloads, checking it is live."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import time

from fakecuda.usage import read_usage

MB = 1 << 20
SIZE = 4 * MB


def share(exporter, importer, tmp_path, name="buf", size=SIZE, close=True):
    """exporter creates `name` and passes a POSIX-fd export to importer, which maps it.
    Returns (exporter's export fd, importer's received fd); with close, the importer closes its fd."""
    exporter.do(f"cumem {name} {size}")
    fd = exporter.do(f"export {name}")["fd"]
    path = str(tmp_path / f"sock-{name}-{importer.pid}")
    importer.do(f"listen {path}")
    exporter.do(f"sendfd {fd} {path}")
    got = importer.do("recvfd")["fd"]
    importer.do(f"import {name} {got} {size}")
    if close:
        importer.do(f"closefd {got}")
    return fd, got


def write(w, name, value):
    w.do(f"fill {name} {value}")
    w.do("sync")


def values(w, name):
    return w.do(f"read {name}")["values"]


def assert_shared(a, b, name="buf", value=None):
    """A write on either side is seen by the other (the sharing is live)."""
    for src, dst in ((a, b), (b, a)):
        v = value if value is not None else 1000 + src.pid % 1000
        write(src, name, v)
        assert values(dst, name) == [v] * 4, f"pid {dst.pid} does not see pid {src.pid}'s write"


def device_usage(lc, pid):
    """Bytes of GPU memory pid holds now: the fake's usage files, or nvidia-smi with the real
    driver (context memory included); None when that cannot be known."""
    if lc.state:
        return sum(read_usage(lc.state).get(pid, {}).values())
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    out = subprocess.run([smi, "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=30).stdout
    used = 0
    for line in out.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) == 2 and fields[0] == str(pid) and fields[1].isdigit():
            used += int(fields[1]) << 20
    return used


def assert_no_gpu_memory(lc, pid):
    used = device_usage(lc, pid)
    assert used in (0, None), f"pid {pid} still holds {used} bytes of GPU memory"


def assert_gpu_memory(lc, pid):
    used = device_usage(lc, pid)
    assert used is None or used > 0, f"pid {pid} holds no GPU memory"


def shim_state(lc, pid):
    r = lc.cli("status", pid, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["state"]


def suspend(lc, *pids, ok=True, env=None, args=()):
    r = lc.cli("suspend", *args, *pids, env=env)
    if ok:
        assert r.returncode == 0, f"suspend failed: {r.stderr}\n{lc.holder_log()}"
    return r


def resume(lc, *pids, ok=True):
    r = lc.cli("resume", *pids)
    if ok:
        assert r.returncode == 0, f"resume failed: {r.stderr}\n{lc.holder_log()}"
    return r


def fd_target(w, fd):
    """What fd of workload w points to (read from /proc: a suspended workload is frozen)."""
    return os.readlink(f"/proc/{w.pid}/fd/{fd}")


def exists(path):
    return os.path.exists(path)


def wait_for(cond, timeout=10.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"{what} not reached within {timeout} s")


def pair(lc, workload, tmp_path, a_env=None, b_env=None):
    """Two workloads sharing "buf" (a exports, b imports), set to 42."""
    a = workload(dict(lc.app, **(a_env or {})))
    b = workload(dict(lc.app, **(b_env or {})))
    share(a, b, tmp_path)
    write(a, "buf", 42)
    return a, b


def assert_runs_as_before(lc, a, b):
    """Same contents, sharing live, gates open, nothing held, and a new suspend/resume works."""
    assert values(b, "buf") == [42] * 4
    assert shim_state(lc, a.pid) == "running" and shim_state(lc, b.pid) == "running"
    assert not [f for f in os.listdir(lc.run_dir) if f.startswith("pid-")]
    assert_shared(a, b)
    write(a, "buf", 43)
    suspend(lc, a.pid, b.pid)
    resume(lc, a.pid)
    assert values(b, "buf") == [43] * 4
