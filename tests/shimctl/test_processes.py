"""Process discovery: trees, libcuda and shim mappings, GPU device files; clear errors."""
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from criu_gpushare.errors import ProcessError
from criu_gpushare.shimctl import processes


# A process whose child was started by a second thread, still running: the kernel lists that child
# under the thread, not under the process's first thread.
TREE_WORKLOAD = """
import subprocess, sys, threading, time
sleep = [sys.executable, "-c", "import time; time.sleep(30)"]
grandchild = "import subprocess, sys, time; subprocess.Popen(%r); time.sleep(30)" % (sleep,)
subprocess.Popen([sys.executable, "-c", grandchild])
threading.Thread(target=lambda: (subprocess.Popen(sleep), time.sleep(30))).start()
time.sleep(30)
"""


@pytest.fixture(params=["kernel lists", "psutil"])
def walk(request, monkeypatch):
    """process_tree both ways: the kernel's lists of children, and psutil where a kernel has none."""
    if request.param == "psutil":
        monkeypatch.setattr(processes, "_kernel_lists_children", lambda: False)
    elif not processes._kernel_lists_children():
        pytest.skip("this kernel keeps no /proc/PID/task/TID/children: process_tree uses psutil here")
    return processes.process_tree


def parent_of(pid):
    return psutil.Process(pid).ppid()  # read apart from either walk


def test_a_tree_lists_the_root_and_every_descendant_parents_first(walk):
    root = subprocess.Popen([sys.executable, "-c", TREE_WORKLOAD])
    tree = []
    try:
        for _ in range(200):  # the three descendants start within a second or so
            tree = walk(root.pid)
            if len(tree) == 4:
                break
            time.sleep(0.05)
        assert tree[0] == root.pid and len(set(tree)) == len(tree) == 4, tree
        assert sorted(parent_of(p) == root.pid for p in tree[1:]) == [False, True, True], tree
        assert all(tree.index(parent_of(p)) < tree.index(p) for p in tree[1:]), tree
    finally:
        for pid in [root.pid] + tree[1:]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        root.wait()


def test_an_unknown_pid_has_no_tree(walk):
    with pytest.raises(ProcessError, match=f"process {2 ** 22 + 17}: no such process"):
        walk(2 ** 22 + 17)


def test_a_process_without_cuda_has_no_gpu_files():
    assert processes.gpu_device_mappings(os.getpid()) == []
    assert processes.gpu_device_fds(os.getpid()) == {}
    assert processes.cuda_and_shim(os.getpid()) == (False, False)


def test_libcuda_is_seen_in_the_maps(fake_driver_dir):
    code = f"import ctypes, time; ctypes.CDLL({os.path.join(fake_driver_dir, 'libcuda.so.1')!r}); print('ok', flush=True); time.sleep(30)"
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ok"
        assert processes.uses_cuda(p.pid)
    finally:
        p.kill()
        p.wait()


def test_an_unknown_pid_is_a_clear_error():
    with pytest.raises(ProcessError, match="no such process"):
        processes.gpu_device_mappings(2 ** 22 + 17)
