"""The CRIU hand-over of a group's processes: handed over they stay stopped, taken back they run;
the driver restore thread is found again by the tid recorded at the freeze, and its loss is named."""
import subprocess

import pytest

from criu_gpushare.engine.freezer import group_stopped
from criu_gpushare.engine.handover import HandOver
from criu_gpushare.errors import ProcessError
from criu_gpushare.waits import Deadline


@pytest.fixture
def proc():
    p = subprocess.Popen(["sleep", "60"])
    yield p
    p.kill()
    p.wait()


def test_a_process_handed_over_stays_stopped_and_taken_back_runs(proc):
    # Its only thread stands in for the driver's restore thread, recorded as at the freeze.
    handover = HandOver({proc.pid: proc.pid})
    handover.hand_over([proc.pid], Deadline(10))
    assert group_stopped(proc.pid)
    handover.take_back([proc.pid], Deadline(10))
    handover.thaw()
    assert not group_stopped(proc.pid)


def test_the_recorded_restore_thread_is_found_again(proc):
    assert HandOver({proc.pid: proc.pid}).restore_tid(proc.pid, Deadline(5)) == proc.pid


def test_a_restore_thread_that_is_gone_is_named(proc):
    with pytest.raises(ProcessError, match="driver restore thread .* is gone"):
        HandOver({proc.pid: 2 ** 22 + 1}).restore_tid(proc.pid, Deadline(5))
