"""The checkpoint API wrapper's pure parts: GPU maps, the node-wide driver lock, per-pid results."""
import subprocess
import sys
import time

import pytest

from criu_gpushare.gpu import checkpoint_api as ck
from criu_gpushare.errors import BusyError, DriverError

A, B, C = "GPU-aaaaaaaa-0000-0000-0000-000000000000", "GPU-bbbbbbbb-0000-0000-0000-000000000000", \
    "GPU-cccccccc-0000-0000-0000-000000000000"


def test_same_gpus_need_no_map():
    assert ck.gpu_map([A, B], [B, A, C]) == []


def test_a_missing_gpu_goes_to_a_free_one_and_present_ones_stay():
    assert ck.gpu_map([A, B], [B, C]) == [(A, C), (B, B)]


def test_explicit_map_wins_and_lists_every_checkpointed_gpu():
    assert ck.gpu_map([A, B], [A, B], {A: B, B: A}) == [(A, B), (B, A)]


def test_too_few_gpus_is_an_error():
    with pytest.raises(DriverError, match="2 GPU\\(s\\) were checkpointed but only 1"):
        ck.gpu_map([A, B], [C])


def test_map_to_an_invisible_gpu_is_an_error():
    with pytest.raises(DriverError, match="not visible here"):
        ck.gpu_map([A], [B], {A: C})


def test_for_each_reports_every_pid_and_times_out_a_hung_call():
    def op(pid):
        if pid == 2:
            raise DriverError("boom")
        if pid == 3:
            time.sleep(5)

    t0 = time.monotonic()
    results = ck.for_each([1, 2, 3], op, timeout_s=0.5, what="lock")
    assert time.monotonic() - t0 < 3
    assert results[1] is None
    assert str(results[2]) == "CUDA driver: boom"
    assert "lock of pid 3 did not return within" in str(results[3])
    with pytest.raises(DriverError, match="boom.*did not return"):
        ck.raise_first(results)


def test_driver_lock_excludes_a_second_process(tmp_path):
    path = str(tmp_path / "driver.lock")
    holder = subprocess.Popen([sys.executable, "-c", f"""
import time
from criu_gpushare.gpu.checkpoint_api import DriverLock
with DriverLock({path!r}):
    print('held', flush=True); time.sleep(30)
"""], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(BusyError, match=f"pid {holder.pid}"):
            with ck.DriverLock(path, timeout_s=0.3):
                pass
    finally:
        holder.kill()
        holder.wait()
    with ck.DriverLock(path, timeout_s=5):  # free again once the holder is gone
        pass
