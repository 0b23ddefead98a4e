"""Every error the tool reports, and its exit code, in one place.

The docstring of each class is its message template. Exit codes:
  0 success
  1 an unexpected error (a bug: please report it with the traceback)
  2 usage error (bad command line)
  3..63 the specific errors below; a script may rely on them (documented in the README)

A step list that fails and is rolled back exits with the code of the error that made it fail (the
workload runs as before); one whose rollback failed too exits GroupHeld's code (the group is held,
`criu-gpushare resume` finishes the rollback); a restore that could not finish exits
RestoreIncomplete's code (their GPU work stays waiting at the gates and the restore can be retried).
An interrupt (Ctrl-C) exits Cancelled's code when it undid the work, Interrupted's when it did not
(engine/cancel.py says which command does what). A process of the group that is stopped, or does
not answer within the wait's bound (criu_gpushare/waits.py), exits NoAnswer's code.

Every entry point (the command line in cli/__init__.py, the hook's main) catches these once and
exits with their code; nothing below them exits the process.
"""

EXIT_OK = 0
EXIT_BUG = 1
EXIT_USAGE = 2


class Error(Exception):
    """{}"""

    exit_code = 13

    def __init__(self, *args):
        super().__init__(*args)
        self.args = args

    def __str__(self):
        return self.__doc__.format(*self.args)


class NoGpuError(Error):
    """no usable NVIDIA GPU: {}"""

    exit_code = 3


class DriverError(Error):
    """CUDA driver: {}"""

    exit_code = 4
    result = None  # the CUresult's name, when the error is a driver call's (gpu/driver.check)


class ProcessError(Error):
    """process {}: {}"""

    exit_code = 5


class StoreError(Error):
    """chunk store: {}"""

    exit_code = 6


class BusyError(Error):
    """busy: {}"""

    exit_code = 7


class ShimError(Error):
    """shim: {}"""

    exit_code = 8


class ShimNotServing(ShimError):
    """shim: {}"""
    # No control socket: the shim is not loaded, or the process has not called cuInit yet.


class ConfigError(Error):
    """configuration: {}"""

    exit_code = 9


class CheckFailed(Error):
    """{} check(s) failed"""

    exit_code = 10


class CriuError(Error):
    """CRIU: {}"""

    exit_code = 11

    def __init__(self, message, log_path=None, log_errors=()):
        """log_path: CRIU's log of the failed request (``<images_dir>/<log_file>``), named in the
        message with its last error lines (log_errors), since that is where CRIU explains itself."""
        super().__init__(message)
        self.log_path = log_path
        self.log_errors = list(log_errors)

    def __str__(self):
        text = super().__str__()
        if self.log_path:
            text += f" (log: {self.log_path})"
        return "\n  ".join([text, *self.log_errors])


class ImageError(Error):
    """CRIU image {}: {}"""

    exit_code = 12


class GroupHeld(Error):
    """{}"""
    # Failed, and undoing it failed too: the group is held (journal in the state directory).

    exit_code = 14


class RestoreIncomplete(Error):
    """{}"""
    # A restore (after CRIU, or from a journal) stopped part-way; it can be retried.

    exit_code = 15


class StateFileError(Error):
    """{}"""
    # A state file (journal, pid claim: engine/journal.py) that is not the tool's own and whole.

    exit_code = 16


class Cancelled(Error):
    """{}"""
    # Interrupted (Ctrl-C) and undone: what was begun is rolled back, or nothing had changed yet.

    exit_code = 17


class Interrupted(Error):
    """{}"""
    # Interrupted (Ctrl-C) but not undone: the work goes on, or had completed, or stopped where it
    # was; the message says which and how to follow it.

    exit_code = 18


class Failed(Error):
    """{}"""
    # An error another process of the tool reported (a holder's final answer): its message as it
    # was said there, and its exit code.

    def __init__(self, message, exit_code):
        super().__init__(message)
        self.exit_code = exit_code or EXIT_BUG


class NoAnswer(Error):
    """{}"""
    # A process of the group cannot answer (stopped with SIGSTOP) or did not answer within the
    # bound of the wait (--timeout, or the rollback's): named, with what was waited for.

    exit_code = 19


class ShimNoAnswer(NoAnswer, ShimError):
    """shim: {}"""


class DriverNoAnswer(NoAnswer, DriverError):
    """CUDA driver: {}"""


class ProcessNoAnswer(NoAnswer, ProcessError):
    """process {}: {}"""
