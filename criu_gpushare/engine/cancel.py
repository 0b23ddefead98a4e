"""Ctrl-C: what each command does with an interrupt, and the means to do it.

  suspend   the command passes the interrupt to its holder over a pipe (the holder ignores SIGINT);
            the holder's runner cancels before its next step and rolls back what was begun:
            exit 17 (Cancelled), the workload runs as before. A cancel that arrives once the work
            is done changes nothing: exit 18 (Interrupted), the group stays suspended. A second
            Ctrl-C stops waiting for the rollback, which goes on in the holder (exit 18).
  dump      in this process: the first Ctrl-C cancels before the next step (or at CRIU's post-dump,
            which then fails the dump and the tree gets its GPU state back): exit 17. A second
            one interrupts the step at once; the runner still rolls back.
  resume    through the holder: this command stops following and says so, the holder finishes
            (exit 18). In this process (no holder), and `restore` once CRIU has begun: the work
            goes on, since nothing can take it back (the first Ctrl-C only says so); a second one
            stops it where it is, the processes suspended, and `resume PID` finishes it (exit 15).
The runner (engine/runner.py) never stops a step half-way for a cancel: it asks between steps.
"""
import contextlib
import os
import select
import signal

# What the first Ctrl-C of a resume or restore done in this process says.
GOES_ON = ("interrupt: the {} goes on (nothing can take it back); Ctrl-C again stops it where it "
           "is: the processes then stay held, and `criu-gpushare resume PID` finishes it")


class Cancel:
    """Whether a cancel was asked: set in this process (request()) or by a line "cancel" on a pipe
    from the command that started the holder. Its end of the pipe closing is no cancel: a command
    that went away (terminal closed) leaves the work to finish."""

    def __init__(self, fd=None):
        self.fd, self._asked = fd, False

    def request(self):
        self._asked = True

    def requested(self):
        if not self._asked and self.fd is not None:
            while select.select([self.fd], [], [], 0)[0]:
                data = os.read(self.fd, 64)
                if not data:
                    os.close(self.fd)
                    self.fd = None
                    break
                self._asked = self._asked or b"cancel" in data
        return self._asked


def ask_holder(fd):
    """The starting command's side of Cancel: tell the holder to cancel (it may have ended)."""
    try:
        os.write(fd, b"cancel\n")
    except OSError:
        pass


@contextlib.contextmanager
def on_interrupt(first):
    """Within: the first SIGINT calls first() (no exception); a second raises KeyboardInterrupt
    where the work is, as Ctrl-C does by default."""
    seen = []

    def handler(signum, frame):
        if seen:
            raise KeyboardInterrupt
        seen.append(signum)
        first()

    old = signal.signal(signal.SIGINT, handler)
    try:
        yield seen
    finally:
        signal.signal(signal.SIGINT, old)
