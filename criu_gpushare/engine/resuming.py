"""`resume` of a suspended group, from any of its pids: the group's holder does it when one lives;
else, or when the holder dies with the request, this process finishes the work from the group's
journal (engine/suspension.py's recover). take_over does the same for the hook's post-resume
when the restore's holder is gone.

Apart from the engine on purpose. A resume through its holder needs the journal, the holder's
socket and the settings, nothing more: the engine, the store and the GPU bindings are most of a
command's start (bench/startup_bench.py, case resume), and the resumed group waits for it. They are
imported only where no holder lives, as the hook's post-resume does (hook/main.py).
"""
import time

from .. import waits
from ..errors import Interrupted, ProcessError
from . import cancel, holder, journal as jn, results

# How long a holder that closed the connection without an answer may take to be gone: it was
# dying (killed, crashed) and its socket closed first.
HOLDER_EXIT_S = 5.0


def _no_mark(phase):
    pass


def group_of(pids):
    """The journal of the one suspended group that holds pids (any of its pids will do)."""
    journals = {}
    for pid in pids:
        j = jn.owner_of(pid)
        if j is None:
            raise ProcessError(pid, "is not suspended by criu-gpushare")
        journals[j.key] = j
    if len(journals) > 1:
        raise ProcessError(pids[0], "the pids belong to different suspended groups: resume each group")
    (journal,) = journals.values()
    return journal


def resume(pids, settings, report=print, mark=_no_mark):
    """Resume the suspended group of pids; -> the final object (engine/holder.py). The GPU map and
    verify are this command's settings; the store and cache those of the suspend. A holder killed
    at any phase loses nothing: the plan and the steps begun are in the journal, the memory in the
    store; one that dies with this request (killed, crashed) leaves the rest to this command.
    mark(phase): called as each phase of this process ends (the command's phase clock)."""
    journal = group_of(pids)
    mark("check (pids, journal)")
    if not journal.worker_alive():
        return _recover(journal, settings, report)
    final = _ask_holder(journal, settings, report)
    return final if final is not None else _after_holder(journal, settings, report)


def take_over(journal, settings, report=print, holder_key=None):
    """Finish the work of a journal whose worker ended without an answer, or is ending (the hook's
    post-resume, where the restore's holder died; holder_key: its key, where not the group's): once
    that worker is gone (HOLDER_EXIT_S at most), here, from the journal; -> the final object."""
    if not _gone_within(journal, HOLDER_EXIT_S):
        raise _worked_on(journal)
    return _after_holder(journal, settings, report, holder_key)


def _after_holder(asked, settings, report, holder_key=None):
    """The holder that worked on the journal `asked` is gone without an answer: the journal as it
    left it is finished here, or, where it closed it, its work was done; -> the final object."""
    journal = jn.owner_of(asked.pids[0])
    if journal is None:
        return closed_without_reply(holder_key or asked.key, asked.pids)
    return _recover(journal, settings, report)


def _recover(journal, settings, report):
    """The journal's work finished in this process (its worker is gone)."""
    from . import dump, suspension  # no holder: the work is this process's
    # a dump's journal: the ref of a dump CRIU did not finish is dropped (engine/dump.py)
    on_recovered = dump.forget_if_failed if journal.kind == "dump" else None
    with cancel.on_interrupt(lambda: report(cancel.GOES_ON.format("resume"))):
        return {"event": "done", "ok": True,
                "result": suspension.recover(journal, settings.gpu_map, report, settings.verify,
                                             on_recovered)}


def _ask_holder(journal, settings, report):
    """The holder's final object; None when the holder is gone, the request unanswered (it died
    with it, or just before): this process then finishes the work from the journal."""
    try:
        return holder.ask(journal.key, "resume", on_progress=report, gpu_map=settings.gpu_map or {},
                          verify=settings.verify)
    except holder.NoHolder:
        gone = not journal.worker_alive()  # else the worker is a command recovering the group
    except ProcessError:  # the connection closed without an answer: the holder was dying
        gone = _gone_within(journal, HOLDER_EXIT_S)
    except KeyboardInterrupt:  # the holder ignores it and goes on
        raise Interrupted(f"interrupted: the resume goes on in the holder of group {journal.key} "
                          f"(its log: {holder.log_path(journal.key)}); `criu-gpushare status "
                          f"{journal.key}` shows when it is done") from None
    if gone:
        report(f"the holder of group {journal.key} ended without an answer (its log: "
               f"{holder.log_path(journal.key)})")
        return None
    raise _worked_on(journal)


def _worked_on(journal):
    """The refusal for a journal another live process works on (a command recovering the group)."""
    return ProcessError(journal.key, f"criu-gpushare process {journal.data['worker']['pid']} is "
                        f"working on its group now ({journal.kind}, {journal.state}); wait for it")


def _gone_within(journal, seconds):
    deadline = waits.Deadline(seconds)
    while journal.worker_alive():
        if deadline.passed():
            return False
        time.sleep(0.02)
    return True


def closed_without_reply(key, pids):
    """The holder of `key` closed the group's journal, its work done (it closes it on success
    only), and ended before its reply; -> the final object."""
    return {"event": "done", "ok": True, "result": results.nothing_moved(
        "resumed", pids, f"its holder ended before it replied, once the group ran again (its "
                         f"log: {holder.log_path(key)})")}
