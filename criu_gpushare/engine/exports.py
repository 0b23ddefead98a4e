"""The fds of a group's memory, from the owners' shims, many per round trip.

Saving or loading a unit starts with an fd of its memory, exported by its owner's shim. One
request costs about 0.2 ms of the tool's and the shim's time; for 2,000 small allocations that is
0.4 s each way, so allocations are asked for up to MAX_BATCH at a time (`export` with "ids",
shim/protocol.md), in the order the units come. Imports adopted from a freed exporter
(`export-import`) go one at a time, as do all of a shim that does not take "ids".
"""
import os
import time

from ..errors import ShimError
from ..shimctl import client as control

MAX_BATCH = control.MAX_FDS  # the fds one reply carries


class Exports:
    """take(unit) -> an fd of unit's memory, which the caller closes. close() closes the fds
    fetched ahead and not taken. units: the order they will be taken in. timeout_s: the bound of
    each request (the copying between requests is work, not a wait)."""

    def __init__(self, units, timeout_s):
        self._units = list(units)
        self._timeout_s = timeout_s
        self._ahead = {}  # unit key -> fd fetched ahead
        self._single = set()  # owners whose shim answered "ids" with bad-request
        # seconds take() waited for the shims (a phase of its own: with thousands of small
        # allocations the requests, not the driver's mapping, may bound the opening)
        self.seconds = 0.0

    def take(self, unit):
        t = time.monotonic()
        try:
            return self._take(unit)
        finally:
            self.seconds += time.monotonic() - t

    def _take(self, unit):
        fd = self._ahead.pop(unit.key, None)
        if fd is not None:
            return fd
        if unit.kind == "allocation" and unit.owner not in self._single:
            batch = self._batch_from(unit)
            if len(batch) > 1:
                try:
                    self._fetch(batch)
                except ShimError as e:
                    if "bad-request" not in str(e):
                        raise
                    self._single.add(unit.owner)  # an older shim: one at a time
                else:
                    return self._ahead.pop(unit.key)
        return export_one(unit, self._timeout_s)

    def fetch_all(self):
        """An fd of every unit fetched now, for a caller that will take them while the shims may
        not answer (their threads frozen); the fds already fetched are closed on a failure."""
        try:
            for unit in self._units:
                if unit.key not in self._ahead:
                    self._ahead[unit.key] = self._take(unit)
        except BaseException:
            self.close()
            raise

    def close(self):
        for fd in self._ahead.values():
            os.close(fd)
        self._ahead.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _batch_from(self, unit):
        """unit and the allocations of the same owner that follow it, not yet fetched."""
        start = next(i for i, u in enumerate(self._units) if u.key == unit.key)
        batch = []
        for u in self._units[start:]:
            if u.owner != unit.owner or u.kind != "allocation" or len(batch) == MAX_BATCH:
                break
            if u.key not in self._ahead:
                batch.append(u)
        return batch

    def _fetch(self, batch):
        owner = batch[0].owner
        _, fds = control.request(owner, "export", ids=",".join(str(u.id) for u in batch),
                                 timeout=self._timeout_s)
        if len(fds) != len(batch):
            for fd in fds:
                os.close(fd)
            raise ShimError(f"process {owner}: export of {len(batch)} allocations sent {len(fds)} fds")
        for u, fd in zip(batch, fds):
            self._ahead[u.key] = fd



def export_one(unit, timeout_s):
    """An fd of unit's memory, in a request of its own."""
    cmd = "export" if unit.kind == "allocation" else "export-import"
    _, fds = control.request(unit.owner, cmd, id=unit.id, timeout=timeout_s)
    if len(fds) != 1:
        for fd in fds:
            os.close(fd)
        raise ShimError(f"process {unit.owner}: {cmd} {unit.id} sent {len(fds)} fds, not 1")
    return fds[0]
