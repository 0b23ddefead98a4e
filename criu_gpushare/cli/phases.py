"""The wall time of one command cut into phases that add up to the whole (`--json` "phases").

A phase ends at each mark(); time between marks that belongs to no named phase is still counted,
under the name the mark gives it, so the sum is always the command's wall time from the clock's
start. CRIU's own account of its part (stats-dump / stats-restore) comes beside it ("criu_stats").
"""
import time


class PhaseClock:
    def __init__(self):
        self.start = self._last = time.monotonic()
        # The interpreter's start and the imports, before this clock existed, are the first phase.
        try:
            import psutil
            started = max(0.0, time.time() - psutil.Process().create_time())
        except Exception:  # noqa: BLE001 - timing only: never fail a command over it
            started = 0.0
        self.start -= started
        self.phases = {"tool start": started}

    def mark(self, name):
        """The time since the last mark is phase `name` (added to it if it ran before)."""
        now = time.monotonic()
        self.phases[name] = self.phases.get(name, 0.0) + now - self._last
        self._last = now

    def result(self):
        out = {k: round(v, 3) for k, v in self.phases.items()}
        out["total"] = round(time.monotonic() - self.start, 3)
        return out


def format_phases(phases):
    parts = [f"{k} {v:.2f}s" for k, v in phases.items() if k != "total"]
    return f"phases: {', '.join(parts)} (total {phases.get('total', 0):.2f}s)"
