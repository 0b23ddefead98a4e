"""The actions of `criu-gpushare-hook`, CRIU's action script (hooks/README.md is the contract): its
shell launcher runs this, through hook/entry.py, for the actions it uses.

CRIU runs it with no arguments, stdin closed, stdout/stderr in CRIU's log, the action in
CRTOOLS_SCRIPT_ACTION. Each action it uses is one function of ACTIONS; every other action exits 0.
It is meant for a node-wide CRIU configuration: for a tree without CUDA it does nothing and never
fails a dump or a restore.

Between actions, state lives in the tool's private state directory: the dump's journal (and the
holder that pre-dump starts, which watches CRIU and gives running tasks their GPU state back once
CRIU lets go of them); for a restore, the holder that pre-restore starts (it checks the image and
the store, then the GPUs and pins the load's ring while CRIU restores, gives post-restore that
check's verdict, and does post-resume's GPU side) and `restore-<criu pid>.json` from post-restore
to post-resume (the image's real path and the restored root: CRIU has closed its
own path to the image by post-resume).
"""
import os
import sys
import time

# What post-dump, post-restore and post-resume need, and no more: CRIU runs them while the tree
# waits, so they ask the holder that pre-dump or pre-restore started and import the jobs (the
# engine, the store, CRIU's bindings: most of a start) only where none listens.
from ..engine import holder, journal, record as image_record, statedir
from ..errors import EXIT_BUG, Error, Failed, ProcessError
from ..procfs import seconds_since_start

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


def _phases(phases):
    return " ".join(f"{k} {v:.2f}" for k, v in phases.items())


# -- dump ------------------------------------------------------------------------------------


def _refuse_v1_freezer(pids):
    """The dump hands each checkpointed process over stopped; a runtime that lets CRIU freeze the
    container's cgroup v1 freezer (runc's checkpoint does) then hangs for good: the kernel's ptrace
    attach to a stopped task waits for it to run, and a frozen task never does (measured with runc
    1.1.5 and a SIGSTOPped container process, without the hook). Refused before anything changes."""
    from ..shimctl.processes import v1_freezer_cgroup
    for pid in pids:
        cgroup = v1_freezer_cgroup(pid)
        if cgroup is not None:
            raise ProcessError(pid, f"is in the cgroup v1 freezer cgroup {cgroup}: a runtime that lets "
                               "CRIU freeze it (runc checkpoint) would hang on the stopped process; "
                               "checkpoint GPU containers on a cgroup v2 host, or dump the process "
                               "with `criu-gpushare dump` (hooks/README.md, runc)")


def pre_dump(action):
    """CRIU seizes nothing until this returns: it forks the dump's holder, without the engine
    (engine/dump_holder.py), and waits for the GPU side of the dump."""
    from ..engine.dump_holder import DumpHolder
    from ..engine.settings import load_settings
    from ..shimctl.processes import cuda_pids
    root = _init_pid()
    pids = cuda_pids(root)
    if not pids:
        return 0  # nothing of ours in this tree
    _refuse_v1_freezer(pids)
    work = DumpHolder(root, _images_dir(), load_settings(), _criu_pid())
    result = holder.outcome(holder.start(work, on_progress=lambda m: _say(action, m)),
                            "CRIU aborts the dump; the tasks keep running")
    phases = result.get("phases")
    if phases:
        _say(action, f"GPU state of {len(work.pids)} process(es) out: {_phases(phases)}")
    if result.get("overlapped"):  # not steps: each ran beside them
        _say(action, f"beside those steps: {_phases(result['overlapped'])}")
    return 0


def post_dump(action):
    """The holder of this tree's dump makes the store durable; nothing when no dump of ours holds
    the tree."""
    owner = journal.owner_of(_init_pid())
    if owner is None or owner.kind != "dump":
        return 0
    holder.outcome(holder.ask(owner.key, "post-dump", on_progress=lambda m: _say(action, m)),
                   "CRIU fails the dump and leaves the tasks running")
    return 0


# -- restore ---------------------------------------------------------------------------------


def _restore_state():
    return f"restore-{_criu_pid()}.json"


def pre_restore(action):
    """CRIU restores nothing until this returns: it only forks the restore's holder, which checks
    the image, the store and the GPUs while CRIU restores (engine/restore_holder.py)."""
    from ..engine import restore_holder
    from ..engine.settings import load_settings
    images_dir = _images_dir()
    if not restore_holder.has_gpu_state(images_dir):
        return 0  # nothing of ours in this image: no holder
    work = restore_holder.RestoreHolder(images_dir, load_settings(), _criu_pid())
    holder.outcome(holder.start(work, on_progress=lambda m: _say(action, m)), "CRIU restores nothing")
    return 0


def post_restore(action):
    """The tasks are restored, not yet running: the checks that pre-restore's holder ran
    meanwhile (the image, the store, the GPUs) must have passed, else this fails and CRIU kills
    them; the holder has then made the group's journal. Then where post-resume
    finds the image (CRIU has closed its own path by then) and the root go into the state dir:
    now, not at pre-restore, since CRIU runs no action when it fails in between (a pid taken, a
    damaged image) and a state file written earlier would outlive that restore. Only for an image
    with our record; the record itself is read by the holder, or by post-resume where none
    listens."""
    images_dir = _images_dir()
    if not os.path.exists(image_record.path_in(images_dir)):
        return 0
    try:
        verdict = holder.outcome(holder.ask(holder.criu_restore_key(_criu_pid()), "post-restore",
                                            on_progress=lambda m: _say(action, m), root=_init_pid()),
                                 "CRIU kills the restored tasks: nothing of the tree runs")
    except holder.NoHolder:
        verdict = {}  # pre-restore ran another program: post-resume works from the image
    except Error:
        _drop_journal_of(_init_pid())  # CRIU kills the tree it restored: the journal goes with it
        raise
    if verdict.get("ring_pinned_ahead"):
        _say(action, "the load's ring was pinned while CRIU restored the processes")
    statedir.write_json(_restore_state(), {"images_dir": images_dir, "root": _init_pid()})
    return 0


def _drop_journal_of(root):
    """The journal the holder made for the restored tree at post-restore, removed."""
    from ..engine.restore import journal_of_tree
    made = journal_of_tree(root)
    if made is not None:
        made.close()


def _gpu_state_back(state, report):
    """By the holder that pre-restore started (its context, ring and checked manifest ready), or
    here where none answers (engine/jobs.py Restore.finish_without_holder): from the journal the
    holder made at post-restore, if it died since or with this request; from the image, if no
    holder ran. -> the summary; None when the image holds no GPU state."""
    key = holder.criu_restore_key(_criu_pid())
    try:
        final = holder.ask(key, "post-resume", on_progress=report, root=state["root"])
    except holder.NoHolder:
        dead_holder = None
    except ProcessError:  # it closed the connection without an answer: it died with the request
        dead_holder = key
    else:
        return holder.outcome(final)
    from ..engine import jobs
    return jobs.Restore.finish_without_holder(state, report, dead_holder)


def post_resume(action):
    state = statedir.read_json(_restore_state())
    if state is None:
        return 0
    statedir.remove(_restore_state())
    root = state["root"]
    try:
        summary = _gpu_state_back(state, report=lambda m: _say(action, m))
    except Error as e:
        # CRIU only logs post-resume's exit and reports the restore as a success: say it here.
        raise Failed(f"FAILED: GPU state NOT restored (the restore of pid {root}'s tree is not "
                     f"complete, whatever CRIU reports): {e}. `criu-gpushare status {root}` shows "
                     f"it; fix the cause, then `criu-gpushare resume {root}`", e.exit_code) from e
    if summary is not None:
        _say(action, f"GPU state of {len(summary['pids'])} process(es) is back: "
                     + (_phases(summary["phases"]) if "phases" in summary else summary.get("note", "")))
    return 0


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
    start, t0 = seconds_since_start() or 0.0, time.monotonic()
    began = time.clock_gettime(time.CLOCK_BOOTTIME) - start  # when CRIU started this action
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
    finally:
        # Where a hooked CRIU run's time goes: each action's own share, and when it began on the
        # boot clock, so that CRIU's time between the actions can be told apart from outside.
        _say(action, f"took {start + time.monotonic() - t0:.3f} s (program start {start:.3f} s, "
                     f"began {began:.3f} s after boot)")


if __name__ == "__main__":
    sys.exit(main())
