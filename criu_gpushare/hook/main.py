"""`criu-gpushare-hook`: the program CRIU runs as its action script.

CRIU runs it with no arguments, stdin closed, stdout/stderr in CRIU's log, and the action in
CRTOOLS_SCRIPT_ACTION (see hooks/README.md for the contract). Actions it does not handle exit 0 so
that CRIU proceeds.

This version guards only: a `pre-dump` of a process tree in which some process has the CUDA driver
loaded is refused (non-zero exit, so CRIU aborts the dump and leaves the tasks running), because
dumping live GPU state without the GPU steps would produce an image that cannot be restored.
The GPU steps themselves (quiesce, copy-out, driver checkpoint; restore) come with the dump/restore
work and replace this refusal.
"""
import os
import sys

from ..errors import Error
from ..shimctl.processes import process_tree, uses_cuda

EXIT_REFUSED = 1


def pre_dump(init_pid):
    gpu = []
    for pid in process_tree(init_pid):
        try:
            if uses_cuda(pid):
                gpu.append(pid)
        except Error:
            continue  # exited meanwhile: CRIU will notice on its own
    if gpu:
        print(f"criu-gpushare-hook: pre-dump: process(es) {', '.join(map(str, gpu))} of tree "
              f"{init_pid} use CUDA; this version of criu-gpushare cannot dump GPU state through "
              "the hook yet. Refusing, so CRIU aborts and the tasks keep running.", file=sys.stderr)
        return EXIT_REFUSED
    return 0


def main():
    action = os.environ.get("CRTOOLS_SCRIPT_ACTION", "")
    try:
        if action == "pre-dump":
            return pre_dump(int(os.environ["CRTOOLS_INIT_PID"]))
    except (KeyError, ValueError):
        print(f"criu-gpushare-hook: {action}: CRTOOLS_INIT_PID is missing or not a pid", file=sys.stderr)
        return EXIT_REFUSED
    except Error as e:
        print(f"criu-gpushare-hook: {action}: {e}", file=sys.stderr)
        return EXIT_REFUSED
    return 0


if __name__ == "__main__":
    sys.exit(main())
