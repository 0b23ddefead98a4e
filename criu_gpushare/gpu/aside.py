"""Work done in a thread of its own while the caller goes on (a load ahead, chunk files
registered ahead, and released after a resume): started by start(), timed, asked to stop between
its pieces."""
import threading
import time


class Aside:
    """run() in a daemon thread named `thread_name` from start() on; `seconds` says how long it
    ran, once it ended. run() asks stopping() between its pieces; halt() asks it to stop and
    waits for the thread."""

    thread_name = "aside"

    def __init__(self):
        self.seconds = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._timed, name=self.thread_name, daemon=True)

    def start(self):
        self._thread.start()
        return self

    def run(self):
        raise NotImplementedError

    def _timed(self):
        t0 = time.monotonic()
        try:
            self.run()
        finally:
            self.seconds = time.monotonic() - t0

    def stopping(self):
        return self._stop.is_set()

    def join(self, timeout=None):
        self._thread.join(timeout)

    def halt(self):
        """Ask run() to stop at its next piece, and wait for it (nothing to wait for before start)."""
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join()
