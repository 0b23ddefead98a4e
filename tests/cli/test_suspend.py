"""criu_gpushare/cli/suspend.py: `criu-gpushare suspend` and `resume` refuse what they cannot do
before anything changes, with the README's exit code and a message saying what to do. (Suspend and
resume of workloads are tests/engine/; bad --timeout values, test_recovery.py.)"""
import os
import subprocess

import pytest

from criu_gpushare.engine import journal as jn


@pytest.fixture
def sleepers():
    procs = [subprocess.Popen(["sleep", "60"]) for _ in range(2)]
    yield [p.pid for p in procs]
    for p in procs:
        p.kill()
        p.wait()


def test_suspend_of_a_pid_that_does_not_exist(cli, env):
    r = cli(env, "suspend", 2**22 + 1)
    assert r.returncode == 5 and f"process {2**22 + 1}: no such process" in r.stderr


def test_suspend_of_processes_without_cuda_changes_nothing(cli, env, sleepers, tmp_path):
    r = cli(dict(env, CRIU_GPUSHARE_STORE=str(tmp_path / "store")), "suspend", *sleepers)
    assert r.returncode == 5 and "does not use CUDA: nothing to suspend" in r.stderr
    assert os.listdir(tmp_path / "run") == [] and not (tmp_path / "store").exists()


def test_resume_of_a_pid_that_is_not_suspended(cli, env, sleepers):
    r = cli(env, "resume", sleepers[0])
    assert r.returncode == 5 and f"process {sleepers[0]}: is not suspended by criu-gpushare" in r.stderr


def test_resume_of_pids_from_two_groups_asks_for_one_group_at_a_time(cli, env, sleepers, monkeypatch):
    monkeypatch.setenv("CRIU_GPUSHARE_RUN_DIR", env["CRIU_GPUSHARE_RUN_DIR"])
    for pid in sleepers:
        jn.Journal.create("suspend", [pid], jn.SUSPENDED, store="s", ref=f"r{pid}")
    r = cli(env, "resume", *sleepers)
    assert r.returncode == 5 and "belong to different suspended groups: resume each group" in r.stderr
    assert all(jn.owner_of(pid).state == jn.SUSPENDED for pid in sleepers)  # untouched


def test_resume_of_a_group_whose_holder_died_before_its_plan_says_nothing_changed(cli, env, sleepers,
                                                                                   monkeypatch):
    """The holder gone before it made the group's plan: nothing of the group was changed; `resume`
    says so, frees the pids and exits 0 (it printed a traceback before)."""
    monkeypatch.setenv("CRIU_GPUSHARE_RUN_DIR", env["CRIU_GPUSHARE_RUN_DIR"])
    journal = jn.Journal.create("suspend", [sleepers[0]], jn.SUSPENDING, store="s", ref="r")
    journal.set(worker={"pid": sleepers[1], "started": 1})  # not that process: gone
    r = cli(env, "resume", sleepers[0])
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("resumed 1 process(es): nothing had been changed"), r.stdout
    assert jn.owner_of(sleepers[0]) is None


@pytest.mark.parametrize("bad", ["GPU-a", "=GPU-b", "GPU-a=GPU-b,GPU-c"])
def test_resume_refuses_a_malformed_gpu_map(cli, env, sleepers, bad):
    r = cli(env, "resume", sleepers[0], "--gpu-map", bad)
    assert r.returncode == 2 and "--gpu-map" in r.stderr, r.stderr


def test_suspend_and_resume_need_a_pid(cli, env):
    for verb in ("suspend", "resume"):
        r = cli(env, verb)
        assert r.returncode == 2 and "Missing argument 'PIDS...'" in r.stderr
