"""`criu-gpushare-hook`: the program CRIU runs as its action script (hooks/README.md is the contract).

CRIU runs it with no arguments, stdin closed, stdout/stderr in CRIU's log, the action in
CRTOOLS_SCRIPT_ACTION. Each action it uses is one function of ACTIONS; every other action exits 0.
It is meant for a node-wide CRIU configuration: for a tree without CUDA it does nothing and never
fails a dump or a restore.

Between actions, state lives in the tool's private state directory: the dump's journal (and the
holder that pre-dump starts, which watches CRIU and gives running tasks their GPU state back once
CRIU lets go of them), and `restore-<criu pid>.json` from pre-restore to post-resume (CRIU has
closed the image directory by post-resume).
"""
import os
import sys

from ..config import load_settings
from ..criu import images
from ..engine import dump as dump_engine, holder, journal as jn, restore as restore_engine, statedir
from ..errors import EXIT_BUG, Error, ProcessError
from ..gpu.devices import parse_gpu_map
from ..shimctl.processes import v1_freezer_cgroup

PREFIX = "criu-gpushare-hook"


def _say(action, message):
    print(f"{PREFIX}: {action}: {message}", file=sys.stderr, flush=True)


def _init_pid():
    try:
        return int(os.environ["CRTOOLS_INIT_PID"])
    except (KeyError, ValueError):
        raise ProcessError("CRTOOLS_INIT_PID", "is missing or not a pid: is this run by CRIU?") from None


def _images_dir():
    """The image directory as a real path (CRIU gives /proc/<criu>/fd/<n>, gone once it closes)."""
    path = os.environ.get("CRTOOLS_IMAGE_DIR")
    if not path:
        raise ProcessError("CRTOOLS_IMAGE_DIR", "is not set: is this run by CRIU?")
    return os.path.realpath(path)


def _criu_pid():
    return os.getppid()  # CRIU forks and execs its action scripts


# -- dump ------------------------------------------------------------------------------------


class _DumpWork(holder.Work):
    """The holder of one CRIU dump: its GPU steps, then a watch on the CRIU process."""

    def __init__(self, job, criu_pid):
        self.job, self.criu_pid = job, criu_pid
        # the journal's key: `resume PID` of any process of the tree finds this holder
        self.key, self.pids = min(job.pids), job.pids
        self.criu_fd = None

    def begin(self, report):
        self.criu_fd = os.pidfd_open(self.criu_pid)  # before the work: CRIU waits for us anyway
        self.job.set_report(report)
        if not self.job.begin():
            return {"gpu_state": False}, False
        return {"gpu_state": True, "ref": self.job.ref}, True

    def watched_fd(self):
        return self.criu_fd

    def on_event(self, report):
        self.job.set_report(report)
        try:
            self.job.after_criu()
        except Error as e:
            report(f"after the dump: {e}")
        return False

    def handle(self, cmd, fields, report):
        if cmd == "post-dump":
            self.job.set_report(report)
            self.job.complete()
            return {"completed": True}, True
        raise ProcessError(self.key, f"unknown holder command {cmd!r}")


def _refuse_v1_freezer(pids):
    """The dump hands each checkpointed process over stopped; a runtime that lets CRIU freeze the
    container's cgroup v1 freezer (runc's checkpoint does) then hangs for good: the kernel's ptrace
    attach to a stopped task waits for it to run, and a frozen task never does (measured with runc
    1.1.5 and a SIGSTOPped container process, without the hook). Refused before anything changes."""
    for pid in pids:
        cgroup = v1_freezer_cgroup(pid)
        if cgroup is not None:
            raise ProcessError(pid, f"is in the cgroup v1 freezer cgroup {cgroup}: a runtime that lets "
                               "CRIU freeze it (runc checkpoint) would hang on the stopped process; "
                               "checkpoint GPU containers on a cgroup v2 host, or dump the process "
                               "with `criu-gpushare dump` (hooks/README.md, runc)")


def pre_dump(action):
    root = _init_pid()
    pids = dump_engine.cuda_pids(root)
    if not pids:
        return 0  # nothing of ours in this tree
    _refuse_v1_freezer(pids)
    settings = load_settings({})
    job = dump_engine.DumpJob(root, _images_dir(), settings.store, verify=settings.verify,
                              report=lambda m: None)
    final = holder.start(_DumpWork(job, _criu_pid()), on_progress=lambda m: _say(action, m))
    if not final["ok"]:
        _say(action, f"{final['message']} (CRIU aborts the dump; the tasks keep running)")
        return final["exit_code"] or EXIT_BUG
    return 0


def post_dump(action):
    journal = jn.owner_of(_init_pid())
    if journal is None or journal.kind != "dump":
        return 0
    final = holder.ask(journal.key, "post-dump", on_progress=lambda m: _say(action, m))
    if not final["ok"]:
        _say(action, f"{final['message']} (CRIU fails the dump and leaves the tasks running)")
        return final["exit_code"] or EXIT_BUG
    return 0


# -- restore ---------------------------------------------------------------------------------


def _restore_state():
    return f"restore-{_criu_pid()}.json"


def pre_restore(action):
    images_dir = _images_dir()
    settings = load_settings({})
    store = settings.store if settings.origin.get("store") != "default" else None
    gpu_map = _gpu_map_env()
    rec = restore_engine.check(images_dir, store, gpu_map, lambda: images.maps_libcuda(images_dir))
    if rec is None:
        return 0
    statedir.write_json(_restore_state(), {"record": rec, "store": store, "gpu_map": gpu_map,
                                            "verify": settings.verify, "images_dir": images_dir,
                                            "cache": settings.cache, "cache_limit": settings.cache_limit})
    if settings.cache:
        warmed = restore_engine.warm_cache(rec, store, settings.cache, settings.cache_limit)
        _say(action, f"node cache {settings.cache}: {warmed.fetched} chunk(s) fetched")
    _say(action, f"image {images_dir}: GPU state of {len(rec['processes'])} process(es) in "
                 f"{store or rec['store']} ({rec['ref']}), every chunk present")
    return 0


def post_restore(action):
    state = statedir.read_json(_restore_state())
    if state is not None:
        state["root"] = _init_pid()
        statedir.write_json(_restore_state(), state)
    return 0


def post_resume(action):
    state = statedir.read_json(_restore_state())
    if state is None:
        return 0
    statedir.remove(_restore_state())
    root = state.get("root") or _init_pid()
    try:
        summary = restore_engine.run(state["record"], root, state["store"], state["gpu_map"],
                                     state["verify"], report=lambda m: _say(action, m),
                                     cache=state.get("cache"), cache_limit=state.get("cache_limit"))
    except Error as e:
        # CRIU only logs post-resume's exit and reports the restore as a success: say it here.
        _say(action, f"FAILED: GPU state NOT restored (the restore of pid {root}'s tree is not "
                     f"complete, whatever CRIU reports): {e}. `criu-gpushare status {root}` shows "
                     f"it; fix the cause, then `criu-gpushare resume {root}`")
        return e.exit_code
    _say(action, f"GPU state of {len(summary['pids'])} process(es) is back")
    return 0


def _gpu_map_env():
    """CRIU_GPUSHARE_GPU_MAP="OLD=NEW,...": --gpu-map for restores run by CRIU itself."""
    items = list(filter(None, os.environ.get("CRIU_GPUSHARE_GPU_MAP", "").split(",")))
    try:
        return parse_gpu_map(items)
    except ValueError as e:
        raise ProcessError("CRIU_GPUSHARE_GPU_MAP", str(e)) from None


# In CRIU's order of actions (hooks/README.md has one row each).
ACTIONS = {
    "pre-dump": pre_dump,
    "post-dump": post_dump,
    "pre-restore": pre_restore,
    "post-restore": post_restore,
    "post-resume": post_resume,
}


def main():
    action = os.environ.get("CRTOOLS_SCRIPT_ACTION", "")
    run = ACTIONS.get(action)
    if run is None:
        return 0
    try:
        return run(action)
    except Error as e:
        _say(action, str(e))
        return e.exit_code
    except Exception as e:  # a bug: its traceback goes to CRIU's log
        import traceback
        traceback.print_exc()
        _say(action, f"internal error: {e!r}")
        return EXIT_BUG


if __name__ == "__main__":
    sys.exit(main())
