"""`criu-gpushare-hook`'s entry point: CRIU starts a new interpreter for every action of a dump or a
restore, and most actions are none of ours. Those return at once, before the engine, the store and
CRIU's bindings are imported (hook/main.py); the others run there."""
import os
import sys

# hook/main.py's ACTIONS, by name (tests/hook/test_dispatch.py keeps the two equal).
USED = frozenset({"pre-dump", "post-dump", "pre-restore", "post-restore", "post-resume"})


def main():
    if os.environ.get("CRTOOLS_SCRIPT_ACTION", "") not in USED:
        return 0
    from .main import main as run
    return run()


if __name__ == "__main__":
    sys.exit(main())
