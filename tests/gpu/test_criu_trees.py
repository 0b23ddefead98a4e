"""Real process trees through CRIU on the GPU, through the wrapper and through the hook:

  - a JAX process (XLA's allocator, its runtime threads running): no thread of it may run between
    the driver checkpoint and the driver restore, or it dies inside libcuda (hooks/README.md, "No
    thread runs while a process is checkpointed"); 3 dump/restore cycles through each door;
  - a torch.multiprocessing pair that shares a CUDA tensor and talks over queues (deleted
    /dev/shm/sem.* files: CRIU's link-remap); 5 cycles through each door;
  - 20 consecutive hook cycles of that pair with its fds, RSS, threads, /dev/shm files and the
    store's size recorded each cycle, and flat;
  - a CuPy process on each of its pools (cudaMalloc underneath, and cudaMallocAsync's stream-ordered
    pool), a torch process with three CUDA graphs (one in a private pool), and a process running a
    Triton kernel: each check after a restore launches kernels, and allocates and frees from the
    pool, replays the graphs, or runs the kernel compiled before the dump; after each restore
    Triton also compiles and loads a kernel it had not run before.
Workloads come from bench/workloads (one library for the bench and the tests). Every cycle checks
the GPU contents against those before the first dump.
"""
from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import benchlib as bl
import pytest
from criu_runner import run_criu
from probe_harness import record

HOOK = shutil.which("criu-gpushare-hook")
CALL_TIMEOUT_S = 120
JAX_POOL_GIB = 11  # what XLA preallocates for the JAX tree: its 2 GiB array and the work on it


def jax_env():
    """XLA's share of GPU 0 that makes JAX_POOL_GIB on this GPU (0.08 of an H200, 0.14 of an H100):
    a fixed share leaves the workload short on a smaller GPU."""
    import subprocess
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits",
                              "--id=0"], capture_output=True, text=True, timeout=30).stdout
        total_gib = float(out.strip().splitlines()[0]) / 1024
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        total_gib = 140.0  # the H200 this was sized on
    return {"XLA_PYTHON_CLIENT_MEM_FRACTION": f"{min(0.5, JAX_POOL_GIB / total_gib):.3f}"}


class Tree:
    """A bench workload, dumped and restored through one door; the contents checked each cycle."""

    def __init__(self, tmp_path, name, script, args, env_extra=None):
        bl.become_subreaper()  # the dumped trees' orphans are reaped here
        self.tmp = tmp_path
        self.run_dir = str(tmp_path / "run")
        os.makedirs(self.run_dir, mode=0o700, exist_ok=True)
        self.store = str(Path("/dev/shm" if os.path.isdir("/dev/shm") else tmp_path) / f"store-{os.getpid()}-{name}")
        self.env = bl.tool_env(self.run_dir)
        self.env["CRIU_GPUSHARE_STORE"] = self.store
        self.wl = bl.Workload(name, script, args, str(tmp_path), self.run_dir, env_extra).start(600)
        self.cycle = 0

    def images(self):
        self.cycle += 1
        d = Path(self.store + f"-images-{self.cycle}")
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
        return d

    def wrapper_cycle(self):
        images = self.images()
        t0 = time.monotonic()
        out = bl.run_tool(["dump", self.wl.pids[0], images], self.env, CALL_TIMEOUT_S)
        assert out.ok, f"dump: {out.why()}\n{out.stderr[-3000:]}"
        dump_s = time.monotonic() - t0
        self.wl.reap(30)
        t0 = time.monotonic()
        back = bl.run_tool(["restore", images], self.env, CALL_TIMEOUT_S)
        assert back.ok, f"restore: {back.why()}\n{back.stderr[-3000:]}"
        self._after(images, dump_s, time.monotonic() - t0, "wrapper",
                    out_parts=_parts(out.phases()), back_parts=_parts(back.phases()))

    def dump_and_restore(self, door, criu):
        if door == "wrapper":
            self.wrapper_cycle()
        else:
            self.hook_cycle(criu)

    def hook_cycle(self, criu):
        images = self.images()
        root = self.wl.pids[0]
        dump = run_criu(criu, "dump", images, ["-t", root, "--action-script", HOOK, "--link-remap"],
                        self.env, CALL_TIMEOUT_S)
        assert dump.returncode == 0, dump.tail(40)
        self.wl.reap(30)
        back = run_criu(criu, "restore", images, ["-d", "--action-script", HOOK, "--link-remap"],
                        self.env, CALL_TIMEOUT_S)
        assert back.returncode == 0, back.tail(40)
        assert "GPU state NOT restored" not in back.log, back.tail(40)
        self._after(images, dump.secs, back.secs, "hook",
                    out_parts=_parts(bl.hook_phases(dump.log, dump.secs, dump.began)),
                    back_parts=_parts(bl.hook_phases(back.log, back.secs, back.began)))

    def _after(self, images, out_s, back_s, door, **parts):
        check = self.wl.verify()
        assert check == "ok", f"{door} cycle {self.cycle}: contents {check}"
        record(f"criu_tree_{self.wl.name}", door=door, cycle=self.cycle, out_s=round(out_s, 2),
               back_s=round(back_s, 2), **self.resources(), **parts)
        shutil.rmtree(images, ignore_errors=True)

    def resources(self):
        """What must stay flat across cycles: per process fds, RSS, threads; /dev/shm; the store."""
        fds = rss = threads = 0
        for pid in self.wl.pids:
            fds += len(os.listdir(f"/proc/{pid}/fd"))
            threads += len(os.listdir(f"/proc/{pid}/task"))
            with open(f"/proc/{pid}/status") as f:
                rss += next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) // 1024
        own = os.path.basename(self.store)  # the test's store and images live there too
        shm = len([n for n in os.listdir("/dev/shm") if not n.startswith(own)]) \
            if os.path.isdir("/dev/shm") else 0
        store = _tree_bytes(self.store) >> 20
        return {"fds": fds, "rss_mib": rss, "threads": threads, "shm_files": shm, "store_mib": store}

    def close(self):
        self.wl.kill()
        shutil.rmtree(self.store, ignore_errors=True)


def _parts(phases):
    """A cycle's phases of 0.05 s and more, for its PROBE line: where each door spends its time
    (the wrapper's own account; the hook's actions and CRIU's rest)."""
    return "/".join(f"{k}:{v:.2f}" for k, v in phases.items() if k != "total" and v >= 0.05) or "-"


def _tree_bytes(path):
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.stat(os.path.join(root, name)).st_size
            except OSError:
                pass  # removed meanwhile
    return total


@pytest.fixture
def jax_tree(tmp_path):
    pytest.importorskip("jax", reason="jax is not installed")
    tree = Tree(tmp_path, "jax", "jax_array.py", ["--gib", "2"], jax_env())
    assert tree.wl.info.get("backend") == "gpu", tree.wl.info
    yield tree
    tree.close()


@pytest.fixture
def torch_pair(tmp_path):
    pytest.importorskip("torch", reason="torch is not installed")
    tree = Tree(tmp_path, "pair", "pair.py", ["--gib", "0.5", "--shared-gib", "0.25"])
    yield tree
    tree.close()


@pytest.fixture(params=["default", "async"])
def cupy_tree(request, tmp_path):
    pytest.importorskip("cupy", reason="cupy is not installed")
    tree = Tree(tmp_path, f"cupy-{request.param}", "cupy_blocks.py", ["--gib", "2", "--pool", request.param])
    yield tree
    tree.close()


@pytest.fixture
def graphs_tree(tmp_path):
    pytest.importorskip("torch", reason="torch is not installed")
    tree = Tree(tmp_path, "graphs", "graphs.py", [])
    yield tree
    tree.close()


@pytest.fixture
def triton_tree(tmp_path):
    pytest.importorskip("torch", reason="torch is not installed")
    pytest.importorskip("triton", reason="triton is not installed")
    tree = Tree(tmp_path, "triton", "triton_kernel.py", ["--gib", "1"])
    yield tree
    tree.close()


def _busy(tree):
    """XLA launches just before the dump: its threads have work in flight."""
    for _ in range(5):
        tree.wl.ask("step")


def test_jax_through_the_wrapper_three_cycles(jax_tree, criu_bin):
    for _ in range(3):
        _busy(jax_tree)
        jax_tree.wrapper_cycle()
        _busy(jax_tree)


@pytest.mark.skipif(HOOK is None, reason="criu-gpushare-hook is not on PATH (package not installed)")
def test_jax_through_the_hook_three_cycles(jax_tree, criu_bin):
    for _ in range(3):
        _busy(jax_tree)
        jax_tree.hook_cycle(criu_bin)
        _busy(jax_tree)


def test_torch_multiprocessing_pair_through_the_wrapper_five_cycles(torch_pair, criu_bin):
    for _ in range(5):
        torch_pair.wrapper_cycle()


@pytest.mark.skipif(HOOK is None, reason="criu-gpushare-hook is not on PATH (package not installed)")
def test_torch_multiprocessing_pair_through_the_hook_five_cycles(torch_pair, criu_bin):
    for _ in range(5):
        torch_pair.hook_cycle(criu_bin)


@pytest.mark.skipif(HOOK is None, reason="criu-gpushare-hook is not on PATH (package not installed)")
def test_twenty_hook_cycles_leave_resources_flat(torch_pair, criu_bin):
    seen = []
    for cycle in range(20):
        torch_pair.hook_cycle(criu_bin)
        seen.append(torch_pair.resources())
        if cycle % 5 == 4:
            print(f"cycle {cycle + 1}: {seen[-1]}", flush=True)
    first, last = seen[1], seen[-1]  # the first cycle settles caches
    assert last["fds"] <= first["fds"] and last["threads"] <= first["threads"], (first, last)
    assert last["shm_files"] <= first["shm_files"], (first, last)
    assert last["rss_mib"] <= first["rss_mib"] * 1.10 + 64, (first, last)
    assert last["store_mib"] <= first["store_mib"] * 1.05 + 64, (first, last)


DOORS = ["wrapper", pytest.param("hook", marks=pytest.mark.skipif(
    HOOK is None, reason="criu-gpushare-hook is not on PATH (package not installed)"))]


@pytest.mark.parametrize("door", DOORS)
def test_cupy_on_each_pool(cupy_tree, door, criu_bin):
    for _ in range(2):
        cupy_tree.dump_and_restore(door, criu_bin)


@pytest.mark.parametrize("door", DOORS)
def test_cuda_graphs_replay_the_same(graphs_tree, door, criu_bin):
    for _ in range(2):
        graphs_tree.dump_and_restore(door, criu_bin)


@pytest.mark.parametrize("door", DOORS)
def test_triton_kernels_run_and_compile_after_each_restore(triton_tree, door, criu_bin):
    for block in (128, 256) if door == "wrapper" else (512, 2048):  # each one new to the process
        triton_tree.dump_and_restore(door, criu_bin)
        reply = triton_tree.wl.ask(f"compile {block}")
        assert reply["ok"], f"cycle {triton_tree.cycle}: a kernel compiled after the restore (block {block}): {reply}"
