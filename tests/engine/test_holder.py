"""The holder process: started before CUDA, does its work, answers requests by key, then goes away;
nothing its starter does (going away, a closed pipe) interrupts it."""
import os
import signal
import time

import pytest

from criu_gpushare.engine import holder
from criu_gpushare.errors import Error, GroupHeld, ProcessError


class FakeWork(holder.Work):
    def __init__(self, key, fail_begin=None, fail_resume_times=0, slow_s=0.0, mark=None):
        self.key, self.pids = key, [key]
        self.fail_begin, self.fail_resume_left = fail_begin, fail_resume_times
        self.slow_s, self.mark = slow_s, mark

    def begin(self, report):
        report("step one")
        time.sleep(self.slow_s)
        if self.fail_begin:
            raise self.fail_begin
        if self.mark:
            self.mark.write_text("finished")
        return {"begun": self.key}, True

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


pytestmark = pytest.mark.usefixtures("run_dir")  # tests/engine/conftest.py


def _gone(pid):
    for _ in range(100):
        if not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z":
            return True
        time.sleep(0.05)
    return False


def test_begin_then_status_then_resume_ends_the_holder(run_dir):
    seen = []
    final = holder.start(FakeWork(4242), on_progress=seen.append)
    assert final["ok"] and final["result"] == {"begun": 4242}
    assert seen == ["step one"]
    status = holder.ask(4242, "status", on_progress=seen.append)
    assert status["ok"] and status["result"]["state"] == "suspended"
    holder_pid = status["result"]["holder"]
    final = holder.ask(4242, "resume", on_progress=seen.append)
    assert final["ok"] and seen[-1] == "resuming"
    assert _gone(holder_pid), "holder still running after resume"
    assert not (run_dir / "holder-4242.sock").exists()


def test_a_failed_begin_leaves_no_holder_and_keeps_the_error_code(run_dir):
    final = holder.start(FakeWork(5000, fail_begin=ProcessError(5000, "nope")), on_progress=lambda m: None)
    assert not final["ok"] and "nope" in final["message"] and final["exit_code"] == ProcessError.exit_code
    with pytest.raises(ProcessError, match="holder is gone|without an answer"):
        holder.ask(5000, "status")


def test_a_held_group_keeps_its_holder_for_resume():
    final = holder.start(FakeWork(5100, fail_begin=GroupHeld("rollback failed")), on_progress=lambda m: None)
    assert not final["ok"] and final["exit_code"] == GroupHeld.exit_code
    assert holder.ask(5100, "resume", on_progress=lambda m: None)["ok"]


def test_a_failed_request_keeps_the_holder_and_can_be_retried():
    assert holder.start(FakeWork(6000, fail_resume_times=1), on_progress=lambda m: None)["ok"]
    first = holder.ask(6000, "resume", on_progress=lambda m: None)
    assert not first["ok"] and "retry" in first["message"]
    assert holder.ask(6000, "bogus", on_progress=lambda m: None)["ok"] is False
    assert holder.ask(6000, "resume", on_progress=lambda m: None)["ok"]


class OneShotWork(FakeWork):
    def stays_after_failure(self, error):
        return False


def test_a_work_that_does_not_stay_after_a_failure_ends_its_holder_with_it():
    """The hook's restore holder: its failure is in the journal, for `resume`; it does not keep
    its context and ring for as long as CRIU runs."""
    assert holder.start(OneShotWork(6001, fail_resume_times=1), on_progress=lambda m: None)["ok"]
    first = holder.ask(6001, "resume", on_progress=lambda m: None)
    assert not first["ok"] and first["exit_code"] == Error.exit_code and "retry" in first["message"]
    for _ in range(100):  # it ends right after its answer
        try:
            holder.ask(6001, "status", on_progress=lambda m: None)
        except ProcessError:  # none listens, or it closed as this asked
            break
        time.sleep(0.05)
    else:
        pytest.fail("the holder stayed after its failed request")


def test_asking_a_group_nobody_holds_is_a_clear_error():
    with pytest.raises(ProcessError, match="holder is gone"):
        holder.ask(7777, "resume")


def test_the_starter_dying_mid_step_does_not_interrupt_the_holder(tmp_path):
    """A suspend killed by Ctrl-C or SIGKILL while the holder copies: the holder finishes its step
    (its writes to the dead starter's pipe are dropped) and stays to be resumed."""
    mark = tmp_path / "mark"
    r, w = os.pipe()
    starter = os.fork()
    if starter == 0:
        os.close(r)
        holder.start(FakeWork(8000, slow_s=1.0, mark=mark), on_progress=lambda m: os.write(w, b"."))
        os._exit(0)
    os.close(w)
    os.read(r, 1)  # the holder reported "step one": it is inside begin
    os.kill(starter, signal.SIGKILL)
    os.waitpid(starter, 0)
    os.close(r)
    for _ in range(100):
        if mark.exists():
            break
        time.sleep(0.05)
    assert mark.read_text() == "finished"
    assert holder.ask(8000, "resume", on_progress=lambda m: None)["ok"]
