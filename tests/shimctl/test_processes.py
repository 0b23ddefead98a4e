"""Process discovery: trees, libcuda and shim mappings, GPU device files; clear errors."""
import os
import subprocess
import sys

import pytest

from criu_gpushare.errors import ProcessError
from criu_gpushare.shimctl import processes


def test_a_tree_lists_the_root_and_its_descendants():
    child = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                              "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']); "
                              "time.sleep(30)"])
    try:
        for _ in range(100):
            tree = processes.process_tree(child.pid)
            if len(tree) == 2:
                break
            import time
            time.sleep(0.05)
        assert tree[0] == child.pid and len(tree) == 2
    finally:
        subprocess.run(["pkill", "-P", str(child.pid)])
        child.kill()
        child.wait()


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
