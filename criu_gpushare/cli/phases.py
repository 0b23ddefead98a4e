"""The wall time of one command cut into phases that add up to the whole (`--json` "phases").

A phase ends at each mark(); time between marks that belongs to no named phase is still counted,
under the name the mark gives it, so the sum is always the command's wall time from the clock's
start. CRIU's own account of its part (stats-dump / stats-restore) comes beside it ("criu_stats").
Work done in another process (the holder's steps) is absorbed: its own timings become phases, and
what is left of that stretch (starting or asking it, its reply) one more.
"""
import time

from ..procfs import seconds_since_start


class PhaseClock:
    def __init__(self):
        self.start = self._last = time.monotonic()
        # The interpreter's start and the imports, before this clock existed, are the first phase
        # (timing only: never fail a command over it).
        started = seconds_since_start() or 0.0
        self.start -= started
        self.phases = {"tool start": started}

    def mark(self, name):
        """The time since the last mark is phase `name` (added to it if it ran before)."""
        now = time.monotonic()
        self.phases[name] = self.phases.get(name, 0.0) + now - self._last
        self._last = now

    def absorb(self, inner, rest):
        """The time since the last mark, cut into `inner` ({name: seconds}, timed by another process
        within that stretch; "total" ignored) and `rest`, what is left of it."""
        now = time.monotonic()
        inner = {k: v for k, v in inner.items() if k != "total"}
        for name, secs in inner.items():
            self.phases[name] = self.phases.get(name, 0.0) + secs
        self.phases[rest] = self.phases.get(rest, 0.0) + max(0.0, now - self._last - sum(inner.values()))
        self._last = now

    def result(self):
        out = {k: round(v, 3) for k, v in self.phases.items()}
        out["total"] = round(time.monotonic() - self.start, 3)
        return out


def format_phases(phases):
    parts = [f"{k} {v:.2f}s" for k, v in phases.items() if k != "total"]
    return f"phases: {', '.join(parts)} (total {phases.get('total', 0):.2f}s)"
