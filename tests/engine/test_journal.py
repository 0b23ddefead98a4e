"""The journal: one claim per process, stale claims cleared, the record any later run resumes from."""
import json
import os
import subprocess
import sys

import pytest

from criu_gpushare.engine import journal as jn
from criu_gpushare.errors import ProcessError, StateFileError


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


def _exited():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p


@pytest.mark.parametrize("live", [None, "worker", "process"])
def test_a_journal_whose_processes_all_exited_with_no_worker_is_removed_when_read(run_dir, sleeper, live):
    """No pid can name such a group again, so nothing else would remove it (status kept listing
    it); one whose worker or one of whose processes lives stays."""
    member, worker = _exited(), _exited()
    pids = [member.pid] + ([sleeper.pid] if live == "process" else [])
    started = {str(p): jn.statedir.start_time(p) for p in pids}
    started[str(member.pid)] = 1  # it had started, and is gone
    j = jn.Journal({"key": min(pids), "kind": "restore", "pids": pids, "started": started,
                    "state": jn.SUSPENDED, "worker": {"pid": worker.pid, "started": 1}})
    if live == "worker":
        j.data["worker"] = {"pid": sleeper.pid, "started": jn.statedir.start_time(sleeper.pid)}
    j.save()
    journals, problems = jn.all_journals()
    assert problems == []
    assert [x.key for x in journals] == ([] if live is None else [j.key])
    assert os.path.exists(os.path.join(run_dir, j.name)) is (live is not None)


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


def _cli(*args):
    from click.testing import CliRunner
    from criu_gpushare.cli import main
    return CliRunner().invoke(main, list(map(str, args)))


@pytest.mark.parametrize("content", [b'{"key": 5, "pids": [5], "kind": "suspend"', b'[1, 2]',
                                     b'{"key": 5, "pids": [5], "kind": "suspend", "state": "held"}'])
def test_a_garbage_journal_is_refused_by_status_and_resume_naming_it(sleeper, run_dir, content):
    """Truncated, not an object, or missing its start times: never a fake group, never a traceback."""
    run_dir.mkdir(mode=0o700)
    pid = sleeper.pid
    (run_dir / f"journal-{pid}.json").write_bytes(content.replace(b"5", str(pid).encode()))
    (run_dir / f"pid-{pid}").write_text(json.dumps({"key": pid, "started": 1}))
    res = _cli("resume", pid)
    assert res.exit_code == 16, res.output
    assert f"state file {run_dir}/journal-{pid}.json" in res.output and "remove it" in res.output
    res = _cli("status")
    assert res.exit_code == 0, res.output
    assert f"journal: state file {run_dir}/journal-{pid}.json" in res.output
    assert f"group {pid}" not in res.output


def test_a_journal_of_another_uid_or_a_link_is_refused(sleeper, run_dir, tmp_path):
    j = jn.Journal.create("suspend", [sleeper.pid], jn.SUSPENDED, store="/s", ref="r")
    path = run_dir / j.name
    os.chown(path, 65534, 65534)
    with pytest.raises(StateFileError, match="is owned by uid 65534"):
        jn.owner_of(sleeper.pid)
    os.chown(path, 0, 0)
    real = tmp_path / "elsewhere.json"
    path.rename(real)
    path.symlink_to(real)
    with pytest.raises(StateFileError, match=f"{path} cannot be opened"):
        jn.owner_of(sleeper.pid)


@pytest.mark.parametrize("claim", [None, {"key": 1, "started": 0}, {"key": "x"}])
def test_status_and_resume_agree_whatever_the_claim(sleeper, run_dir, claim):
    """The journal decides: a missing, stale or garbage claim does not hide a suspended group."""
    j = jn.Journal.create("suspend", [sleeper.pid], jn.SUSPENDED, store="/s", ref="r")
    claim_path = run_dir / f"pid-{sleeper.pid}"
    claim_path.unlink()
    if claim is not None:
        claim_path.write_text(json.dumps(claim))
    listed = _cli("status").output
    assert f"group {j.key}: suspend suspended" in listed
    if claim == {"key": "x"}:
        with pytest.raises(StateFileError, match=f"{claim_path} is not a criu-gpushare pid claim"):
            jn.owner_of(sleeper.pid)
    else:
        assert jn.owner_of(sleeper.pid).key == j.key
