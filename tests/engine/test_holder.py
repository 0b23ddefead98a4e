"""The holder process: started by suspend, found by pid, answers resume and status, then goes away."""
import os
import time

import pytest

from criu_gpushare.engine import holder
from criu_gpushare.errors import Error, ProcessError


class FakeWork(holder.Work):
    def __init__(self, pids, fail_suspend=False, fail_resume_times=0):
        self.key, self.pids = min(pids), pids
        self.fail_suspend, self.fail_resume_left = fail_suspend, fail_resume_times

    def suspend(self, report):
        report("step one")
        if self.fail_suspend:
            raise Error("step two failed; rolled back")
        return {"suspended": list(self.pids)}

    def handle(self, cmd, fields, report):
        if cmd == "status":
            return {"state": "suspended", "holder": os.getpid()}, True
        if cmd == "resume":
            report("resuming")
            if self.fail_resume_left:
                self.fail_resume_left -= 1
                raise Error("restore failed; retry")
            return {"resumed": True}, False
        raise Error(f"unknown command {cmd}")


@pytest.fixture(autouse=True)
def run_dir(tmp_path, monkeypatch):
    d = tmp_path / "run"
    monkeypatch.setenv("CRIU_GPUSHARE_RUN_DIR", str(d))
    return d


def test_suspend_then_status_then_resume_ends_the_holder():
    seen = []
    final = holder.start(FakeWork([4242, 4243]), on_progress=seen.append)
    assert final["ok"] and final["result"] == {"suspended": [4242, 4243]}
    assert seen == ["step one"]
    status = holder.ask(4243, "status", on_progress=seen.append)
    assert status["ok"] and status["result"]["state"] == "suspended"
    holder_pid = status["result"]["holder"]
    final = holder.ask(4242, "resume", on_progress=seen.append)
    assert final["ok"] and seen[-1] == "resuming"
    assert holder.holder_key(4242) is None and holder.holder_key(4243) is None
    for _ in range(100):
        if not os.path.exists(f"/proc/{holder_pid}") or open(f"/proc/{holder_pid}/stat").read().split()[2] == "Z":
            break
        time.sleep(0.05)
    else:
        pytest.fail("holder still running after resume")


def test_a_failed_suspend_leaves_no_holder(run_dir):
    final = holder.start(FakeWork([5000], fail_suspend=True), on_progress=lambda m: None)
    assert not final["ok"] and "rolled back" in final["message"] and final["exit_code"] == 3
    assert holder.holder_key(5000) is None
    assert not [n for n in os.listdir(run_dir) if n.endswith(".sock")]


def test_a_failed_resume_can_be_retried():
    assert holder.start(FakeWork([6000], fail_resume_times=1), on_progress=lambda m: None)["ok"]
    first = holder.ask(6000, "resume", on_progress=lambda m: None)
    assert not first["ok"] and "retry" in first["message"]
    assert holder.holder_key(6000) == 6000  # still held
    assert holder.ask(6000, "resume", on_progress=lambda m: None)["ok"]


def test_asking_about_a_pid_nobody_holds_is_a_clear_error():
    with pytest.raises(ProcessError, match="not suspended by criu-gpushare"):
        holder.ask(7777, "resume")


def test_the_state_dir_must_be_private(run_dir):
    run_dir.mkdir(mode=0o755)
    os.chmod(run_dir, 0o755)
    with pytest.raises(Error, match="mode 0700"):
        holder.state_dir()
