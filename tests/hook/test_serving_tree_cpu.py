"""examples/serving's tree with its pure-Python model (no GPU): the API, the engine, two workers,
multiprocessing queues and a TCP listener, dumped under traffic and restored through the wrapper
and through the hook; every request gets the answer it got before the dump, and ending the restored
tree leaves none of its named semaphores in /dev/shm. The GPU version of the same test is
tests/gpu/test_serving_tree.py."""
import os
import shutil
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "serving"))
import demo  # noqa: E402
from procs import named_semaphores  # noqa: E402


@pytest.mark.parametrize("door", ["wrapper", "hook"])
def test_the_serving_tree_comes_back_with_the_same_answers(env, tmp_path, criu, door):
    if door == "hook" and shutil.which("criu-gpushare-hook") is None:
        pytest.skip("criu-gpushare-hook is not on PATH (package not installed)")
    tree = demo.ServingTree(str(tmp_path), env["tool"], model="cpu")
    try:
        before = tree.answers()
        assert all("error" not in a for a in before), before
        images = str(tmp_path / "images")
        os.makedirs(images)
        _, _, traffic = demo.dump_and_restore(tree, images, door, env["tool"])
        assert traffic.ok > 0
        assert tree.answers() == before
        semaphores = named_semaphores(tree.pids)  # its queues', as the restored tree maps them
        assert semaphores, "the tree maps no named semaphore: nothing below would be checked"
        tree.kill()
        assert not [s for s in semaphores if os.path.exists(s)], "ending the tree left its semaphores"
    finally:
        tree.kill()
