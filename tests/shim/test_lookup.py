"""Every way a program reaches the driver lands on the shim: direct linking, dlsym on a libcuda
handle, cuGetProcAddress v1 and _v2 (with the per-thread default stream), for every versioned name
the shim interposes."""
from __future__ import annotations

import os
import queue
import re
import subprocess
import threading

import pytest

from shimtest import REAL_DRIVER, cuda_include
from criu_gpushare.shimctl import client as control

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
HOOKS_DEF = os.path.join(ROOT, "shim", "include", "hooks.def")


def build(tmp_path, source, out, *extra):
    cmd = ["gcc", "-std=gnu11", "-O1", "-Wall", "-Werror", "-I", cuda_include(),
           os.path.join(HERE, "progs", source), "-o", str(tmp_path / out), *extra, "-ldl"]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    return str(tmp_path / out)


@pytest.fixture(scope="module")
def progs(tmp_path_factory, request):
    d = tmp_path_factory.mktemp("progs")
    # Direct linking needs the library at link time: the fake's build dir, or the system's.
    link = ["-l:libcuda.so.1"]
    if not REAL_DRIVER:
        fake_dir = request.getfixturevalue("fake_driver_dir")
        link = [f"-L{fake_dir}", "-l:libcuda.so.1", f"-Wl,-rpath,{fake_dir}"]
    return {
        "paths": build(d, "paths.c", "paths"),
        "paths-direct": build(d, "paths.c", "paths-direct", "-DDIRECT", *link),
        "lookup": build(d, "lookup.c", "lookup"),
    }


def hook_names():
    """(symbol, is_gated) for every entry of shim/include/hooks.def."""
    text = open(HOOKS_DEF).read()
    tracked = re.findall(r"^\s+X\((\w+)\)", text, re.M)
    gated = re.findall(r"G\(GS_GATE_\w+, (\w+), (\w+),", text)
    return [(n, False) for n in tracked] + [(n, True) for pair in gated for n in pair]


def lookup_name(symbol):
    """The unversioned name cuGetProcAddress is asked for, and the CUDA version to ask with."""
    base = re.sub(r"(_v\d+)?(_ptds|_ptsz)?$", "", symbol)
    return base, 11030 if symbol == "cuGetProcAddress" else 13000


def test_every_versioned_name_is_wrapped_by_dlsym_and_both_cugetprocaddress(progs, shim_env, shim_lib):
    args = [f"{lookup_name(s)[0]}:{s}:{lookup_name(s)[1]}" for s, _ in hook_names()]
    res = subprocess.run([progs["lookup"], shim_lib, *args], env=shim_env, capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    rows = [line.split() for line in res.stdout.splitlines()]
    assert len(rows) == len(args)
    absent = [r[0] for r in rows if r[1] == "absent"]
    wrong = [r for r in rows if r[1] != "absent" and r[1:] != ["shim"] * 3]
    assert wrong == [], f"lookups that miss the shim: {wrong}"
    # Names the driver does not have cannot be looked up; say which, so a gap is visible.
    print(f"not in the fake driver ({len(absent)}): {' '.join(absent)}")
    assert len(absent) < len(rows) // 2


def test_without_the_shim_lookups_land_in_the_driver(progs, cuda_env, shim_lib):
    res = subprocess.run([progs["lookup"], shim_lib, "cuMemAlloc:cuMemAlloc_v2:13000"],
                         env=cuda_env, capture_output=True, text=True, timeout=60)
    assert res.stdout.split() == ["cuMemAlloc_v2", "driver", "driver", "driver"]


class Prog:
    def __init__(self, argv, env):
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=env)
        self.lines = queue.Queue()
        threading.Thread(target=lambda: [self.lines.put(x) for x in self.proc.stdout],
                         daemon=True).start()

    def line(self, timeout):
        return self.lines.get(timeout=timeout).strip()

    def send(self, text):
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()


@pytest.mark.parametrize("mode", ["direct", "dlsym", "gpa1", "gpa2", "gpa2-ptds"])
def test_each_path_is_tracked_and_gated(progs, shim_env, kernel_image, mode):
    argv = [progs["paths-direct" if mode == "direct" else "paths"], mode, kernel_image]
    p = Prog(argv, shim_env)
    try:
        ready = p.line(30)
        assert ready.startswith("READY"), ready + p.proc.stderr.read()
        ptr = int(ready.split()[1])
        st = control.status(p.proc.pid)
        assert [a["va"] for a in st["allocations"] if a["origin"] == "cuMemAlloc"] == [ptr]

        for op, done in (("memset", "MEMSET"), ("launch", "LAUNCHED")):
            control.quiesce(p.proc.pid)
            p.send(op)
            with pytest.raises(queue.Empty):
                p.line(0.4)  # held at the gate
            control.resume(p.proc.pid)
            assert p.line(10) == done
        p.send("read")
        assert p.line(10) == "VALUE 3"  # memset 1, then +2
    finally:
        p.proc.kill()
        p.proc.wait()
