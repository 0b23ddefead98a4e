"""A function run in a thread of its own, its value or its exception handed to whoever waits."""
import concurrent.futures
import threading


class InThread:
    """fn() in a thread started now; result() waits for it, then returns its value or raises what
    it raised."""

    def __init__(self, fn, name):
        self._future = concurrent.futures.Future()
        self.delivered = False  # whether result() has returned fn's value or raised its exception

        def run():
            try:
                self._future.set_result(fn())
            except BaseException as e:  # noqa: BLE001 - handed to whoever waits
                self._future.set_exception(e)

        threading.Thread(target=run, name=name, daemon=True).start()

    def done(self):
        return self._future.done()

    def result(self):
        try:
            return self._future.result()
        finally:
            self.delivered = self._future.done()  # not when a Ctrl-C broke off the wait

    def outcome(self, report):
        """result(), or None once what it raised is reported: for a caller already failing for a
        reason of its own, which comes first."""
        try:
            return self.result()
        except BaseException as e:  # noqa: BLE001 - reported; the caller's own failure propagates
            report(f"warning: {e}")
            return None
