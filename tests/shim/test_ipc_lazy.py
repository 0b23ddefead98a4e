"""Legacy CUDA IPC of memory the shim does not back (a small cuMemAlloc): the shim hands out a lazy
handle, and only when someone opens it does the exporter's shim take the driver's handle
(`ipcget`). A handle nobody opened survives the exporter's driver checkpoints; an opened one is a
driver IPC import like any other."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from shimtest import ROOT, fake_only
from criu_gpushare.shimctl import client as control
from criu_gpushare.errors import ShimError

CUDA_WORKER = os.path.join(ROOT, "tests", "fake", "cuda_worker.py")


class Tool:
    """A CUDA process without the shim that makes checkpoint API calls (tests/fake/cuda_worker.py)."""

    def __init__(self, env):
        env = {k: v for k, v in env.items() if k != "LD_PRELOAD"}
        self.proc = subprocess.Popen([sys.executable, CUDA_WORKER], env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().split()[:2] == ["ok", "ready"]

    def ok(self, command):
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        words = self.proc.stdout.readline().split()
        assert words[0] == "ok", f"{command!r} -> {words}"
        return words[1:]

    def checkpoint_cycle(self, pid):
        for op in ("lock", "checkpoint", "restore", "unlock"):
            assert self.ok(f"ck {op} {pid}") == ["CUDA_SUCCESS"], op

    def close(self):
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def tool(cuda_env):
    t = Tool(cuda_env)
    yield t
    t.close()


def test_an_unopened_handle_opens_after_two_driver_checkpoints_of_its_exporter(workload, tool):
    exporter = workload()
    exporter.do("malloc small 4096")  # below CRIU_GPUSHARE_MALLOC_MIN: the driver's own memory
    exporter.do("fill small 77")
    exporter.do("sync")
    handle = exporter.do("ipcget small")["handle"]
    st = exporter.status()
    assert st["allocations"] == []
    assert [(h["size"], h["opened"]) for h in st["lazy_ipc_handles"]] == [(4096, 0)]
    assert st["notes"] == [], "no driver handle is out yet"
    for _ in range(2):
        tool.checkpoint_cycle(exporter.pid)
    assert exporter.do("read small")["values"] == [77] * 4

    importer = workload()
    importer.do(f"ipcopen small {handle} 4096")
    assert importer.do("read small")["values"] == [77] * 4
    importer.do("add small 1")  # the same memory, both ways
    importer.do("sync")
    assert exporter.do("read small")["values"] == [78] * 4
    st = exporter.status()
    assert st["lazy_ipc_handles"][0]["opened"] == 1
    assert any("CUDA IPC handle(s)" in n for n in st["notes"])
    # An opened one is a driver IPC import: its importer cannot be checkpointed, as before.
    with pytest.raises(ShimError, match="refused.*CUDA IPC import"):
        control.quiesce(importer.pid)
    importer.do("ipcclose small")
    assert importer.status()["untracked"] == []


def test_a_lazy_handle_of_an_inner_pointer_opens_like_the_drivers(workload):
    exporter, importer = workload(), workload()
    base = exporter.do("malloc small 65536")["ptr"]
    exporter.do("fill small 5")
    exporter.do("sync")
    handle = bytes.fromhex(exporter.do("ipcget small 4096")["handle"])
    assert handle[:8] == b"CRIUGSL1"
    assert [int.from_bytes(handle[i:i + 8], "little") for i in (16, 24, 32)] == [base, 65536, 4096]
    assert [h["va"] for h in exporter.status()["lazy_ipc_handles"]] == [base]
    # The driver opens the allocation the pointer lies in, at its start.
    importer.do(f"ipcopen small {handle.hex()} 65536")
    assert importer.do("read small")["values"] == [5] * 4


def test_a_lazy_handle_of_freed_memory_does_not_open(workload):
    exporter, importer = workload(), workload()
    exporter.do("malloc small 4096")
    handle = exporter.do("ipcget small")["handle"]
    exporter.do("free small")
    assert exporter.status()["lazy_ipc_handles"] == []
    exporter.do("malloc again 4096")  # may reuse the address: still not what the handle named
    importer.send(f"ipcopen small {handle} 4096")
    r = importer.reply()
    assert r == {"ok": False, "error": "CUDA_ERROR_INVALID_HANDLE"}
    # The importer's log says which pid refused and why.
    assert importer.wait_log(f"pid {exporter.pid} did not give a handle"), importer.log()
    assert "gone: no CUDA IPC handle" in importer.log()


@fake_only  # the driver's refusal is injected into the fake
def test_a_refused_lazy_handle_fails_with_the_drivers_answer_and_says_why(workload):
    """Driver 580 refused a legacy IPC handle of memory it had restored (LAZY_IPC_FACTS_DRIVER_580,
    CUDA_ERROR_NOT_PERMITTED); modelled here by the fake failing the importer's open. The importer
    gets the driver's answer, and its log names the memory and that it is the driver's own."""
    exporter = workload()
    exporter.do("malloc small 4096")
    handle = exporter.do("ipcget small")["handle"]
    importer = workload({"FAKECUDA_FAIL": "cuIpcOpenMemHandle=1:800"})
    importer.send(f"ipcopen small {handle} 4096")
    assert importer.reply() == {"ok": False, "error": "CUDA_ERROR_NOT_PERMITTED"}
    assert importer.wait_log(f"the driver refuses pid {exporter.pid}'s handle"), importer.log()
    assert ("below the backing threshold" in importer.log()
            and "CUDA_ERROR_NOT_PERMITTED" in importer.log()), importer.log()
    assert importer.status()["untracked"] == []  # nothing was opened


def test_ipcget_only_serves_memory_it_gave_a_handle_for(workload):
    w = workload()
    ptr = w.do("malloc small 4096")["ptr"]
    with pytest.raises(ShimError, match="ipcget gone"):
        control.request(w.pid, "ipcget", va=ptr)
    with pytest.raises(ShimError, match="ipcget bad-request"):
        control.request(w.pid, "ipcget")
    w.do("ipcget small")
    reply, _ = control.request(w.pid, "ipcget", va=ptr)
    assert len(bytes.fromhex(reply["handle"])) == 64


def test_a_process_cannot_open_its_own_lazy_handle(workload):
    w = workload()
    w.do("malloc small 4096")
    handle = w.do("ipcget small")["handle"]
    w.send(f"ipcopen mine {handle}")
    assert w.reply() == {"ok": False, "error": "CUDA_ERROR_INVALID_CONTEXT"}
