"""`suspend` and `resume` say where their time went: `--json` "phases" (and a `phases:` line) that
add up to the whole command, the holder's steps included (tests/hook/test_gpu_dump.py checks
`dump` and `restore`)."""
import json

from lctest import share, values, write
from phasecheck import assert_phases_cover, timed_cli

SUSPEND = ("tool start", "check (pids, settings, journal)", "discover", "discover: CUDA start (bindings, cuInit)",
           "quiesce", "save",
           "save: fds from the shims", "save: open memory (import, map)",
           "save: close memory (unmap, release)",
           "save: GPU start (context, stream, hasher)", "save: pin the ring",
           "store commit (sync, manifest, ref)", "release", "lock", "freeze", "checkpoint",
           "save: wait for the checkpoint beside it", "unkeep", "holder or journal (start, ask, reply)")
RESUME = ("tool start", "check (pids, journal)", "check (store)", "restore", "unlock", "thaw",
          "recreate", "load", "load: fds from the shims", "load: open memory (import, map)",
          "load: close memory (unmap, release)",
          "load: GPU start (context, stream, hasher)", "load: pin the ring", "attach", "reopen",
          "release holds", "holder or journal (start, ask, reply)")


def test_suspend_and_resume_phases_add_up_to_the_command(lc, workload, tmp_path):
    a, b = workload(), workload()
    share(a, b, tmp_path)
    write(a, "buf", 5)
    suspended, wall = timed_cli(lc.tool, "suspend", a.pid, b.pid, "--json")
    assert_phases_cover(suspended, wall, *SUSPEND)
    # the driver's checkpoint ran beside the save: its seconds apart, not a phase
    assert json.loads(suspended.stdout)["overlapped"]["checkpoint (beside the save)"] >= 0
    assert_phases_cover(*timed_cli(lc.tool, "resume", a.pid, "--json"), *RESUME)
    assert values(b, "buf") == [5] * 4
    r = lc.cli("suspend", a.pid, b.pid)  # the human output says it too
    assert r.returncode == 0 and "\nphases: tool start " in r.stdout and "(total " in r.stdout, r.stdout
    lc.kill_holders()  # resumed from the journal, in the command: the same account
    assert_phases_cover(*timed_cli(lc.tool, "resume", b.pid, "--json"), *RESUME)
    assert values(a, "buf") == [5] * 4
