"""The checkpoint API wrapper's pure parts: GPU maps, the node-wide driver lock, per-pid results."""
import os
import signal
import stat
import subprocess
import sys
import time

import pytest

from criu_gpushare.gpu import checkpoint_api as ck
from criu_gpushare.errors import BusyError, DriverError, Error, NoAnswer

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


def test_a_driver_call_on_a_stopped_process_ends_at_once(sleeper):
    """The driver reaches a process through a thread of its own: stopped, it never answers, and
    the call is given up as soon as that is seen, naming the pid (NoAnswer's exit code)."""
    os.kill(sleeper.pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        results = ck.for_each([sleeper.pid], lambda pid: time.sleep(30), timeout_s=60, what="checkpoint")
        assert time.monotonic() - t0 < 10
        assert f"process {sleeper.pid}: is stopped (SIGSTOP)" in str(results[sleeper.pid])
        with pytest.raises(NoAnswer):
            ck.raise_first(results)
    finally:
        os.kill(sleeper.pid, signal.SIGCONT)


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


# -- the node-wide driver lock: private directory, no planted files, says who holds it ----------

def private_dir(tmp_path, name="run"):
    d = tmp_path / name
    d.mkdir(mode=0o700)
    return d


def test_driver_lock_lives_in_the_private_state_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("CRIU_GPUSHARE_RUN_DIR", str(tmp_path / "run"))
    lock = ck.DriverLock()
    assert lock.path == str(tmp_path / "run" / "driver.lock")
    with lock:
        st = os.stat(lock.path)
        assert stat.S_IMODE(st.st_mode) == 0o600
        assert stat.S_IMODE(os.stat(tmp_path / "run").st_mode) == 0o700
        assert open(lock.path).read().startswith(f"{os.getpid()} ")
    monkeypatch.delenv("CRIU_GPUSHARE_RUN_DIR")
    if os.geteuid() == 0:
        assert ck.DriverLock().path == "/run/criu-gpushare/driver.lock" == ck.DEFAULT_LOCK_PATH
    assert ck.DriverLock(state_dir=str(tmp_path)).path == str(tmp_path / "driver.lock")


def test_a_waiter_says_once_who_holds_the_lock_and_the_timeout_names_it(tmp_path):
    path = str(private_dir(tmp_path) / "driver.lock")
    holder = subprocess.Popen([sys.executable, "-c", f"""
import sys, time
sys.argv = ["criu-gpushare", "suspend", "4242"]
from criu_gpushare.gpu.checkpoint_api import DriverLock
with DriverLock({path!r}):
    print('held', flush=True); time.sleep(30)
"""], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        said = []
        with pytest.raises(BusyError, match=f"held by pid {holder.pid} \\(criu-gpushare suspend "
                                            f"4242\\).*waited 0.5s"):
            with ck.DriverLock(path, timeout_s=0.5, on_wait=said.append):
                pass
        assert said == [f"waiting for the driver lock held by pid {holder.pid} (criu-gpushare "
                        f"suspend 4242) ({path}; at most 0.5s)"]
    finally:
        holder.kill()
        holder.wait()
    with ck.DriverLock(path, timeout_s=5, on_wait=pytest.fail):  # free: no waiting message
        pass


def test_default_waiting_message_goes_to_stderr(tmp_path, capfd):
    path = str(private_dir(tmp_path) / "driver.lock")
    holder = subprocess.Popen([sys.executable, "-c", f"""
import time
from criu_gpushare.gpu.checkpoint_api import DriverLock
with DriverLock({path!r}):
    print('held', flush=True); time.sleep(30)
"""], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(BusyError):
            with ck.DriverLock(path, timeout_s=0.3):
                pass
    finally:
        holder.kill()
        holder.wait()
    err = capfd.readouterr().err
    assert err.count("waiting for the driver lock held by pid") == 1 and str(holder.pid) in err


def test_a_planted_symlink_is_refused_and_its_target_untouched(tmp_path):
    d = private_dir(tmp_path)
    target = tmp_path / "victim"
    target.write_text("keep")
    os.symlink(target, d / "driver.lock")
    with pytest.raises(Error, match="driver.lock: is a symlink; refusing it"):
        with ck.DriverLock(str(d / "driver.lock"), timeout_s=1):
            pass
    assert target.read_text() == "keep"


def test_a_planted_fifo_is_refused(tmp_path):
    d = private_dir(tmp_path)
    os.mkfifo(d / "driver.lock")
    with pytest.raises(Error, match="not a regular file"):
        with ck.DriverLock(str(d / "driver.lock"), timeout_s=1):
            pass


@pytest.mark.parametrize("mode", [0o755, 0o777, 0o1777])
def test_a_lock_dir_others_may_use_is_refused(tmp_path, mode):
    d = tmp_path / "run"
    d.mkdir()
    os.chmod(d, mode)
    with pytest.raises(Error, match=f"mode {mode:04o}; the state directory must be owned by uid "
                                    f"{os.geteuid()} with mode 0700"):
        with ck.DriverLock(state_dir=str(d), timeout_s=1):
            pass
    assert not (d / "driver.lock").exists()


def test_a_lock_dir_that_is_a_symlink_or_foreign_is_refused(tmp_path):
    real = private_dir(tmp_path, "real")
    os.symlink(real, tmp_path / "link")
    with pytest.raises(Error, match="link: is a symlink"):
        with ck.DriverLock(state_dir=str(tmp_path / "link"), timeout_s=1):
            pass
    if os.geteuid() == 0:
        os.chown(real, 1001, 1001)
        with pytest.raises(Error, match="owned by uid 1001"):
            with ck.DriverLock(state_dir=str(real), timeout_s=1):
                pass
