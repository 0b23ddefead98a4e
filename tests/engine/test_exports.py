"""engine/exports.py: the fds of a group's memory fetched many per round trip, in the order the
units are taken, with a fallback for shims that take one id at a time."""
import os

import pytest

from criu_gpushare.engine import exports as ex
from criu_gpushare.engine.plan import Unit
from criu_gpushare.errors import ShimError


def unit(owner, id_, kind="allocation"):
    return Unit(owner, kind, id_, 1 << 20, 0, (owner, id_), None)


class FakeShims:
    """control.request as the shims would answer: one pipe end per id, named by the id."""

    def __init__(self, take_ids=True):
        self.calls, self.take_ids, self.open = [], take_ids, []

    def request(self, pid, cmd, ids=None, id=None, timeout=None):
        self.calls.append((pid, cmd, ids if ids is not None else id))
        if ids is not None and not self.take_ids:
            raise ShimError(f"process {pid}: export bad-request: export needs \"id\"")
        names = [int(x) for x in ids.split(",")] if ids is not None else [id]
        fds = []
        for n in names:
            r, w = os.pipe()
            os.write(w, str(n).encode())
            os.close(w)
            fds.append(r)
        self.open.extend(fds)
        return {"ok": True}, fds


def named(fd):
    try:
        return int(os.read(fd, 16))
    finally:
        os.close(fd)


@pytest.fixture
def shims(monkeypatch):
    fake = FakeShims()
    monkeypatch.setattr(ex.control, "request", fake.request)
    return fake


def test_allocations_of_one_owner_come_in_batches_in_order(shims):
    units = [unit(10, i) for i in range(1, 71)] + [unit(20, 1), unit(20, 2, "import")]
    with ex.Exports(units, 10) as exports:
        assert [named(exports.take(u)) for u in units] == [u.id for u in units]
    assert [(pid, cmd, len(str(arg).split(","))) for pid, cmd, arg in shims.calls] == [
        (10, "export", 32), (10, "export", 32), (10, "export", 6),
        (20, "export", 1), (20, "export-import", 1)]


def test_fds_fetched_ahead_and_not_taken_are_closed(shims):
    units = [unit(10, i) for i in range(1, 5)]
    with ex.Exports(units, 10) as exports:
        named(exports.take(units[0]))
    for fd in shims.open[1:]:
        with pytest.raises(OSError):
            os.fstat(fd)


def test_a_shim_without_ids_is_asked_one_at_a_time(monkeypatch):
    fake = FakeShims(take_ids=False)
    monkeypatch.setattr(ex.control, "request", fake.request)
    units = [unit(10, i) for i in range(1, 4)]
    with ex.Exports(units, 10) as exports:
        assert [named(exports.take(u)) for u in units] == [1, 2, 3]
    assert [c[1:] for c in fake.calls] == [("export", "1,2,3"), ("export", 1), ("export", 2), ("export", 3)]


def test_a_reply_with_the_wrong_number_of_fds_is_an_error_and_leaks_nothing(monkeypatch):
    fake = FakeShims()

    def short(pid, cmd, ids=None, id=None, timeout=None):
        reply, fds = fake.request(pid, cmd, ids=ids, id=id, timeout=timeout)
        os.close(fds.pop())
        return reply, fds
    monkeypatch.setattr(ex.control, "request", short)
    units = [unit(10, i) for i in range(1, 4)]
    with ex.Exports(units, 10) as exports, pytest.raises(ShimError, match="sent 2 fds"):
        exports.take(units[0])
    for fd in fake.open:
        with pytest.raises(OSError):
            os.fstat(fd)
