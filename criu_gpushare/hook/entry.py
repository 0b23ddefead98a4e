"""`criu-gpushare-hook-actions`, the Python side of CRIU's action script: `criu-gpushare-hook`
(hooks/criu-gpushare-hook, a shell launcher) answers the actions we do not use and runs this for
the others. Run directly, any other action still returns at once, before the engine, the store and
CRIU's bindings are imported (hook/main.py); the others run there."""
import os
import sys

# hook/main.py's ACTIONS, by name, as the launcher's list (tests/hook/test_dispatch.py keeps
# the three equal).
USED = frozenset({"pre-dump", "post-dump", "pre-restore", "post-restore", "post-resume"})


def main():
    if os.environ.get("CRTOOLS_SCRIPT_ACTION", "") not in USED:
        return 0
    from .main import main as run
    return run()


if __name__ == "__main__":
    sys.exit(main())
