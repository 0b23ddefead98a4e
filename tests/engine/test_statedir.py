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
