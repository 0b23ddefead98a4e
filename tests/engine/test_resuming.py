"""criu_gpushare/engine/resuming.py: `resume` goes to the group's holder when one lives, importing
nothing of the engine (the resumed group waits for the command's start), and is refused, the
group untouched, while another process works on it. Recovery where no holder lives:
test_suspension.py and test_recovery.py."""
import os
import subprocess
import sys

import pytest

from criu_gpushare.engine import holder, journal as jn, resuming, statedir
from criu_gpushare.engine.settings import load_settings
from criu_gpushare.errors import ProcessError

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "bench"))
from startup_bench import AnswersResume  # noqa: E402  (the holder bench/startup_bench.py times against)

pytestmark = pytest.mark.usefixtures("run_dir")  # tests/engine/conftest.py

NO_CONFIG = {"CRIU_GPUSHARE_CONFIG": os.devnull}


def test_a_live_worker_without_a_holder_is_waited_for_not_overtaken(sleeper):
    member = subprocess.Popen(["sleep", "60"])
    try:
        journal = jn.Journal.create("suspend", [member.pid], jn.SUSPENDED, store="s", ref="r")
        journal.set(worker={"pid": sleeper.pid, "started": statedir.start_time(sleeper.pid)})
        with pytest.raises(ProcessError, match=f"criu-gpushare process {sleeper.pid} is working on "
                                               r"its group now \(suspend, suspended\); wait for it"):
            resuming.resume([member.pid], load_settings({}, NO_CONFIG))
        assert jn.owner_of(member.pid).state == jn.SUSPENDED  # untouched
    finally:
        member.kill()
        member.wait()


def test_the_holder_resumes_with_this_commands_gpu_map_and_verify(sleeper):
    journal = jn.Journal.create("suspend", [sleeper.pid], jn.SUSPENDED, store="s", ref="r")
    assert holder.start(AnswersResume(journal), on_progress=lambda m: None)["ok"]
    gpu_map = {"GPU-00000000-0000-0000-0000-00000000000a": "GPU-00000000-0000-0000-0000-00000000000b"}
    marks = []
    final = resuming.resume([sleeper.pid], load_settings({"gpu_map": gpu_map, "verify": False}, NO_CONFIG),
                            mark=marks.append)
    assert final["ok"] and final["result"]["asked"] == {"gpu_map": gpu_map, "verify": False}
    assert marks == ["check (pids, journal)"]
    assert jn.owner_of(sleeper.pid) is None


def test_a_resume_its_holder_does_imports_nothing_of_the_engine(sleeper, run_dir):
    """The command, start to end, as a user runs it: its summary and phases printed, and of the
    package only the command line, the journal, the holder's protocol and the settings imported
    (not the engine's steps, the store, CRIU's or the driver's bindings: most of a start)."""
    journal = jn.Journal.create("suspend", [sleeper.pid], jn.SUSPENDED, store="s", ref="r")
    assert holder.start(AnswersResume(journal), on_progress=lambda m: None)["ok"]
    probe = f"""
import sys
from criu_gpushare.cli import main
try:
    main(["resume", "{sleeper.pid}"])
except SystemExit as e:
    assert not e.code, e.code
print(sorted(m for m in sys.modules if m.startswith(("criu_gpushare", "cuda", "psutil", "xxhash"))))
"""
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, CRIU_GPUSHARE_RUN_DIR=str(run_dir), **NO_CONFIG))
    assert r.returncode == 0, r.stderr
    out = r.stdout.splitlines()
    assert out[0].startswith("resumed 1 process(es): ; 0 B loaded"), out
    assert out[1].startswith("phases: tool start ") and "check (pids, journal) " in out[1], out
    imported = set(eval(out[-1]))  # noqa: S307 - the probe's own repr of a list of names
    assert imported == {
        "criu_gpushare", "criu_gpushare.errors", "criu_gpushare.config", "criu_gpushare.procfs",
        "criu_gpushare.cli", "criu_gpushare.cli.suspend", "criu_gpushare.cli.phases",
        "criu_gpushare.engine", "criu_gpushare.engine.cancel", "criu_gpushare.engine.holder",
        "criu_gpushare.engine.journal", "criu_gpushare.engine.resuming", "criu_gpushare.engine.results",
        "criu_gpushare.engine.settings", "criu_gpushare.engine.statedir", "criu_gpushare.gpu",
        "criu_gpushare.gpu.devices", "criu_gpushare.waits"}, sorted(imported)
    assert jn.owner_of(sleeper.pid) is None


class DiesWithTheRequest(AnswersResume):
    """A holder killed while it resumes: before any step (the journal as it was), or after closing
    the group's journal (its resume done) but before its reply."""

    def __init__(self, journal, closed_first):
        super().__init__(journal)
        self.closed_first = closed_first

    def handle(self, cmd, fields, report):
        if self.closed_first:
            self.journal.close()
        os._exit(9)


@pytest.mark.parametrize("closed_first", [False, True])
def test_a_holder_that_dies_with_the_request_leaves_the_resume_to_this_command(sleeper, closed_first):
    journal = jn.Journal.create("suspend", [sleeper.pid], jn.SUSPENDED, store="s", ref="r")
    assert holder.start(DiesWithTheRequest(journal, closed_first), on_progress=lambda m: None)["ok"]
    seen = []
    final = resuming.resume([sleeper.pid], load_settings({}, NO_CONFIG), report=seen.append)
    assert final["ok"], final
    assert seen[0].startswith(f"the holder of group {journal.key} ended without an answer"), seen
    if closed_first:  # nothing left to do: the group runs
        assert final["result"]["note"].startswith("its holder ended before it replied, once the group ran")
    else:  # finished here from the journal (made before any plan: nothing had been changed)
        assert final["result"]["note"] == "nothing had been changed"
    assert jn.owner_of(sleeper.pid) is None


class DiesWithItsOwnKey(DiesWithTheRequest):
    """A holder whose socket is not keyed by its group (the hook's restore holder is keyed by
    CRIU's pid): it dies with any request, having closed the journal first or not."""

    def __init__(self, journal, closed_first):
        super().__init__(journal, closed_first)
        self.key = "restore-999999"


@pytest.mark.parametrize("closed_first", [False, True])
def test_take_over_finishes_the_journal_of_a_holder_that_died_with_a_request(sleeper, closed_first):
    """The hook's post-resume when the restore's holder died with its request: take_over waits for
    it to be gone, then finishes its work from the journal, or finds it done."""
    journal = jn.Journal.create("restore", [sleeper.pid], jn.SUSPENDED, store="s", ref="r")
    assert holder.start(DiesWithItsOwnKey(journal, closed_first), on_progress=lambda m: None)["ok"]
    with pytest.raises(ProcessError, match="without an answer"):
        holder.ask("restore-999999", "post-resume")
    final = resuming.take_over(journal, load_settings({}, NO_CONFIG), holder_key="restore-999999")
    assert final["ok"], final
    if closed_first:
        assert final["result"]["note"].startswith("its holder ended before it replied, once the group ran")
        assert "holder-restore-999999.log" in final["result"]["note"]
    else:
        assert final["result"]["note"] == "nothing had been changed"
    assert jn.owner_of(sleeper.pid) is None


def test_take_over_leaves_a_journal_whose_worker_lives_on(sleeper, monkeypatch):
    member = subprocess.Popen(["sleep", "60"])
    try:
        journal = jn.Journal.create("restore", [member.pid], jn.SUSPENDED, store="s", ref="r")
        journal.set(worker={"pid": sleeper.pid, "started": statedir.start_time(sleeper.pid)})
        monkeypatch.setattr(resuming, "HOLDER_EXIT_S", 0.1)
        with pytest.raises(ProcessError, match=f"criu-gpushare process {sleeper.pid} is working on "
                                               r"its group now \(restore, suspended\); wait for it"):
            resuming.take_over(journal, load_settings({}, NO_CONFIG))
        assert jn.owner_of(member.pid).state == jn.SUSPENDED  # untouched
    finally:
        member.kill()
        member.wait()
