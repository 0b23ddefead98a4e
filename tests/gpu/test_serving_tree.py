"""The serving-shaped tree of examples/serving (an API without CUDA, an engine, two torch workers
sharing weights by CUDA IPC, each with a KV block pool and a CUDA graph, multiprocessing queues
between them) dumped under traffic and restored, through the wrapper and through the hook: every
request gets the answer it got before the dump, and ending the restored tree leaves none of its
named semaphores in /dev/shm."""
import os
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "examples" / "serving"))

import demo  # noqa: E402
from probe_harness import record  # noqa: E402
from procs import named_semaphores  # noqa: E402


def _maps_libcuda(pid):
    with open(f"/proc/{pid}/maps") as f:
        return any("libcuda.so" in line for line in f)


@pytest.mark.parametrize("door", ["wrapper", "hook"])
def test_serving_tree_under_traffic(door, tmp_path, criu_bin, torch_available):
    if door == "hook" and shutil.which("criu-gpushare-hook") is None:
        pytest.skip("criu-gpushare-hook is not on PATH (package not installed)")
    env = dict(os.environ, CRIU_GPUSHARE_RUN_DIR=str(tmp_path / "run"),
               CRIU_GPUSHARE_STORE=f"/dev/shm/serving-store-{os.getpid()}-{door}")
    os.makedirs(env["CRIU_GPUSHARE_RUN_DIR"], mode=0o700)
    tree = demo.ServingTree(str(tmp_path), env)
    try:
        api, engine, *workers = tree.pids
        assert not _maps_libcuda(api) and not _maps_libcuda(engine), "the API or the engine loaded CUDA"
        assert all(_maps_libcuda(w) for w in workers)
        before = tree.answers()
        assert all("error" not in a for a in before), before
        images = str(tmp_path / "images")
        os.makedirs(images)
        dump_s, restore_s, traffic = demo.dump_and_restore(tree, images, door, env)
        assert traffic.ok > 0, "no request was answered while the dump was prepared"
        after = tree.answers()
        assert after == before
        assert not _maps_libcuda(tree.pids[0]), "the restored API loaded CUDA"
        record("serving_tree", door=door, dump_s=round(dump_s, 2), restore_s=round(restore_s, 2),
               answered_during=traffic.ok, cut=traffic.failed)
        semaphores = named_semaphores(tree.pids)
        assert semaphores, "the tree maps no named semaphore: nothing below would be checked"
        tree.kill()
        assert not [s for s in semaphores if os.path.exists(s)], "ending the tree left its semaphores"
    finally:
        tree.kill()
        shutil.rmtree(env["CRIU_GPUSHARE_STORE"], ignore_errors=True)
