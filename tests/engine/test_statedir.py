"""The private state directory: refuses a shared or linked directory, never follows a link."""
import os

import pytest

from criu_gpushare.engine import statedir
from criu_gpushare.errors import Error


pytestmark = pytest.mark.usefixtures("run_dir")  # tests/engine/conftest.py


def test_the_state_dir_must_be_private(run_dir):
    run_dir.mkdir(mode=0o755)
    os.chmod(run_dir, 0o755)
    with pytest.raises(Error, match="mode 0700"):
        statedir.state_dir()


def test_a_linked_state_dir_is_refused(tmp_path, run_dir):
    real = tmp_path / "elsewhere"
    real.mkdir(mode=0o700)
    run_dir.symlink_to(real)
    with pytest.raises(Error, match="not a link"):
        statedir.state_dir()


def test_a_state_file_that_is_a_link_is_refused_not_followed(tmp_path, run_dir):
    target = tmp_path / "planted.json"
    target.write_text('{"key": 1}')
    statedir.state_dir()
    (run_dir / "pid-123").symlink_to(target)
    with pytest.raises(Error, match="not a link"):
        statedir.read_json("pid-123")


def test_writes_are_atomic_and_exclusive_creation_has_one_winner(run_dir):
    statedir.write_json("journal-1.json", {"a": 1})
    assert statedir.read_json("journal-1.json") == {"a": 1}
    assert statedir.create_exclusive("pid-9", {"key": 9})
    assert not statedir.create_exclusive("pid-9", {"key": 10})
    assert statedir.read_json("pid-9") == {"key": 9}
    assert not [n for n in os.listdir(run_dir) if ".tmp-" in n]


def test_start_time_names_one_process():
    me = statedir.start_time(os.getpid())
    assert me is not None and statedir.same_process(os.getpid(), me)
    assert not statedir.same_process(os.getpid(), me + 1)
    assert statedir.start_time(2 ** 22 + 17) is None


def test_logs_of_what_ended_a_week_ago_are_removed_and_the_rest_kept(run_dir):
    """prune_logs (each holder start): a log untouched for a week with no socket beside it goes; a
    recent one, one whose holder still serves (its socket), and anything not a regular .log file
    stay."""
    d = statedir.state_dir()
    week = statedir.LOG_KEEP_S
    now = 10 * week

    def made(name, age, link_to=None):
        path = os.path.join(d, name)
        if link_to:
            os.symlink(link_to, path)
        else:
            with open(path, "w") as f:
                f.write("x\n")
        os.utime(path, (now - age, now - age), follow_symlinks=link_to is None)
        return path

    gone = [made("holder-restore-41.log", week), made("dumpwatch-7.log", 3 * week)]
    kept = [made("holder-restore-42.log", week - 60), made("holder-9.log", 5 * week),
            made("holder-9.sock", 5 * week), made("restore-43.json", 5 * week),
            made("holder-8.log", 5 * week, link_to="/nonexistent")]
    statedir.prune_logs(now=now)
    assert [p for p in gone if os.path.lexists(p)] == []
    assert [p for p in kept if not os.path.lexists(p)] == []


def test_opening_a_log_appends_to_it_and_first_removes_those_long_ended(run_dir):
    """open_log, where every holder and dump watch opens its log."""
    d = statedir.state_dir()
    old = os.path.join(d, "dumpwatch-5.log")
    with open(old, "w") as f:
        f.write("x\n")
    os.utime(old, (1, 1))
    path = os.path.join(d, "holder-6.log")
    for line in (b"one\n", b"two\n"):
        fd = statedir.open_log(path)
        os.write(fd, line)
        os.close(fd)
    assert open(path, "rb").read() == b"one\ntwo\n" and not os.path.exists(old)
