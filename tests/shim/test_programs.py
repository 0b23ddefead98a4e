"""Programs behave the same with the shim preloaded: a cuda-python workload (fake driver or GPU) and
PyTorch programs (GPU only: CRIU_GPUSHARE_TEST_DRIVER=real with torch installed)."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from shimtest import REAL_DRIVER, Workload
from criu_gpushare.shimctl import client as control

SCRIPT = [
    "malloc a 4194304", "fill a 3", "add a 4", "sync", "read a 4",
    "malloc small 4096", "fill small 11", "sync", "read small 2",
    "cumem b 2097152", "fill b 5", "memset b 8", "add b 1", "sync", "read b 3",
    "allochost h 65536", "hostalloc g 65536 0", "hostreg r 65536",
    "free a", "freehost h", "freehost g", "hostunreg r",
    "malloc c 8388608", "memset c 2", "sleep 1000", "add c 40", "sync", "read c 2",
]
ADDRESS_FIELDS = {"ptr", "handle"}  # differ from run to run anyway


def run_script(env):
    w = Workload(env)
    try:
        return [{k: v for k, v in w.do(cmd).items() if k not in ADDRESS_FIELDS} for cmd in SCRIPT]
    finally:
        w.close()


def test_cuda_python_workload_gives_identical_results_with_and_without_the_shim(cuda_env, shim_env):
    plain = run_script(cuda_env)
    shimmed = run_script(shim_env)
    assert shimmed == plain
    assert {"values": [42, 42], "ok": True} in shimmed


needs_torch = pytest.mark.skipif(not REAL_DRIVER, reason="PyTorch needs a real GPU "
                                 "(CRIU_GPUSHARE_TEST_DRIVER=real)")

TORCH_PROGRAM = textwrap.dedent("""
    import hashlib, os, sys
    import torch
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(0)
    a = torch.randn(2048, 2048, device="cuda")
    b = (a @ a).relu().sum(dim=0)
    pinned = torch.arange(1 << 20, dtype=torch.int32).pin_memory()
    c = pinned.to("cuda", non_blocking=True) * 3
    torch.cuda.synchronize()
    print(hashlib.sha256(b.cpu().numpy().tobytes()).hexdigest(), int(c.sum().item()), flush=True)
    if len(sys.argv) > 1:
        sys.stdin.readline()  # hold, so the test can look at the process
""")


@needs_torch
def test_torch_program_gives_identical_results_and_status_shows_its_memory(cuda_env, shim_env):
    pytest.importorskip("torch")
    env = dict(cuda_env, CUBLAS_WORKSPACE_CONFIG=":4096:8")
    plain = subprocess.run([sys.executable, "-c", TORCH_PROGRAM], env=env, capture_output=True,
                           text=True, timeout=300)
    assert plain.returncode == 0, plain.stderr
    p = subprocess.Popen([sys.executable, "-c", TORCH_PROGRAM, "hold"],
                         env=dict(shim_env, CUBLAS_WORKSPACE_CONFIG=":4096:8"),
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        line = p.stdout.readline()
        assert line == plain.stdout, "results differ with the shim"
        st = control.status(p.pid)
        backed = [a for a in st["allocations"] if a["origin"] == "cuMemAlloc"]
        assert sum(a["size"] for a in backed) >= 16 << 20, st["allocations"]
        assert st["host_buffers"], "pin_memory() goes through the shim"
        assert st["untracked"] == []
        control.quiesce(p.pid)
        control.resume(p.pid)
    finally:
        p.stdin.close()
        p.wait(60)


TORCH_IPC_PROGRAM = textwrap.dedent("""
    import os, sys
    import torch
    import torch.multiprocessing as mp

    def consumer(q, done):
        t = q.get()                    # opens the producer's CUDA IPC handle
        print(os.getpid(), int(t[:4].sum().item()), flush=True)
        done.wait()

    if __name__ == "__main__":
        ctx = mp.get_context("spawn")
        q, done = ctx.Queue(), ctx.Event()
        t = torch.full((1 << 22,), 7, dtype=torch.int32, device="cuda")
        p = ctx.Process(target=consumer, args=(q, done))
        p.start()
        q.put(t)
        sys.stdin.readline()
        done.set()
        p.join()
""")


@needs_torch
def test_torch_cuda_ipc_import_is_linked_to_the_producer(shim_env, tmp_path):
    pytest.importorskip("torch")
    script = tmp_path / "ipc.py"
    script.write_text(TORCH_IPC_PROGRAM)
    p = subprocess.Popen([sys.executable, str(script)], env=shim_env, stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    try:
        consumer, total = map(int, p.stdout.readline().split())
        assert total == 28
        st = control.status(consumer)
        ipc = [i for i in st["imports"] if i["kind"] == "cuda-ipc"]
        assert ipc and all(i["exporter"] and i["exporter"]["pid"] == p.pid for i in ipc), st["imports"]
        exported = {a["id"] for a in control.status(p.pid)["allocations"]}
        assert {i["exporter"]["id"] for i in ipc} <= exported
    finally:
        p.stdin.close()
        p.wait(60)
