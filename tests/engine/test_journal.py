"""The journal: one claim per process, stale claims cleared, the record any later run resumes from."""
import os
import subprocess
import sys

import pytest

from criu_gpushare.engine import journal as jn
from criu_gpushare.errors import ProcessError


pytestmark = pytest.mark.usefixtures("run_dir")  # tests/engine/conftest.py


def test_a_second_claim_on_a_process_is_refused(sleeper):
    j = jn.Journal.create("suspend", [sleeper.pid], jn.SUSPENDING, store="/s", ref="r")
    with pytest.raises(ProcessError, match="already being handled"):
        jn.Journal.create("suspend", [sleeper.pid, os.getpid()], jn.SUSPENDING, store="/s", ref="r2")
    # the refused run claimed nothing, not even the pid it could have had
    assert jn.owner_of(os.getpid()) is None
    assert jn.owner_of(sleeper.pid).key == j.key
    j.close()
    assert jn.owner_of(sleeper.pid) is None


def test_a_claim_whose_process_is_gone_is_stale(run_dir):
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    j = jn.Journal.create("suspend", [p.pid], jn.SUSPENDED, store="/s", ref="r")
    p.wait()
    assert jn.owner_of(p.pid) is None
    assert j.processes_alive() == []


def test_the_journal_outlives_its_worker_and_reports_it_dead(sleeper):
    j = jn.Journal.create("suspend", [sleeper.pid], jn.SUSPENDING, store="/s", ref="r")
    j.set(group={"done": ["quiesce", "save"]})
    again = jn.owner_of(sleeper.pid)
    assert again.done == ["quiesce", "save"] and again.data["store"] == "/s"
    assert not again.worker_alive()  # this process is the worker: not "another live one"
    again.data["worker"] = {"pid": sleeper.pid, "started": jn.statedir.start_time(sleeper.pid)}
    assert again.worker_alive()


def test_an_unknown_pid_is_refused_before_any_claim():
    with pytest.raises(ProcessError, match="no such process"):
        jn.Journal.create("suspend", [2 ** 22 + 17], jn.SUSPENDING, store="/s", ref="r")
