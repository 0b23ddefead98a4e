"""The two doors into CRIU as the tests use them: `criu-gpushare dump`/`restore` (cli) and `criu
dump`/`restore --action-script criu-gpushare-hook` (criu_run, hook_dump), and what a tree of
tests/hook/criutree.py (the `tree` fixture of conftest.py) looks like once it is back."""
import json
import os
import shutil
import subprocess
import sys

from criuwork import reap, values, write

HOOK = shutil.which("criu-gpushare-hook")


def _tool_env(env, fault, once=None):
    """The tool's environment with CRIU_GPUSHARE_FAULT=fault; once: a path that makes it fire in
    the first process that reaches it only (engine/faults.py)."""
    return dict(env["tool"], **({"CRIU_GPUSHARE_FAULT": fault} if fault else {}),
                **({"CRIU_GPUSHARE_FAULT_ONCE": str(once)} if once else {}))


def cli(env, *args, timeout=180, fault=None):
    """`criu-gpushare ARGS` in the tool's environment (with CRIU_GPUSHARE_FAULT=fault)."""
    return subprocess.run([sys.executable, "-m", "criu_gpushare.cli", *map(str, args)],
                          env=_tool_env(env, fault), capture_output=True, text=True, timeout=timeout)


def hook_argv(criu, args, images, log):
    return [criu, *map(str, args), "-D", str(images), "--action-script", HOOK, "-o", log]


def criu_run(criu, env, args, images, log, fault=None, once=None):
    return subprocess.run(hook_argv(criu, args, images, log), env=_tool_env(env, fault, once),
                          capture_output=True, text=True, timeout=180)


def hook_dump(criu, env, parent, tmp_path, *extra, fault=None):
    """`criu dump` of parent's tree through the hook into a new image directory: (images, result)."""
    images = tmp_path / "images"
    images.mkdir()
    return images, criu_run(criu, env, ["dump", "-t", str(parent.pid), *extra], images, "dump.log", fault)


def assert_back(env, a, b, value=42):
    assert values(b, "buf") == [value] * 4 and values(a, "buf") == [value] * 4
    assert values(a, "ipc") == [7] * 4, "legacy IPC memory lost"
    write(b, "buf", value + 1)
    assert values(a, "buf") == [value + 1] * 4, "sharing is not live"
    write(a, "ipc", 8)
    assert values(b, "ipc") == [8] * 4, "legacy IPC sharing is not live"
    write(b, "ipc", 7)
    assert not state_files(env)
    wait_no_holder(env)


def wait_no_holder(env, timeout=20):
    """Every holder has ended: a dump's once CRIU let go, a restore's once it answered post-resume
    or CRIU ended without asking. A socket nobody listens on (a holder SIGKILLed) does not count."""
    import socket
    import time

    def listening(name):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            try:
                s.connect(os.path.join(env["run"], name))  # closed at once: the holder reads EOF
                return True
            except OSError:
                return False

    deadline = time.monotonic() + timeout
    while holders := [n for n in os.listdir(env["run"])
                      if n.startswith("holder-") and n.endswith(".sock") and listening(n)]:
        assert time.monotonic() < deadline, f"holders stay: {holders}"
        time.sleep(0.05)


def state_files(env):
    """The tool's state files of a group or a restore still in the state directory."""
    return [n for n in os.listdir(env["run"]) if n.startswith(("pid-", "journal-", "restore-"))]


def wait_gone(env, timeout=20):
    import time
    deadline = time.monotonic() + timeout
    while [n for n in os.listdir(env["run"]) if n.startswith("journal-")]:
        assert time.monotonic() < deadline, "the dump's journal stays"
        time.sleep(0.05)


def dumped(env, tree, tmp_path):
    parent, a, b = tree
    images = tmp_path / "images"
    r = cli(env, "dump", parent.pid, images, "--json")
    assert r.returncode == 0, r.stderr
    parent.wait(10)
    reap([a.pid, b.pid])
    return images, json.loads(r.stdout)


def hook_dumped(criu, env, tree, tmp_path, *extra):
    """The tree dumped through the hook (CRIU ends it) and reaped: its image directory."""
    parent, a, b = tree
    images, r = hook_dump(criu, env, parent, tmp_path, *extra)
    assert r.returncode == 0, (images / "dump.log").read_text()[-4000:]
    parent.wait(10)
    reap([a.pid, b.pid])
    return images


def assert_nothing_restored(a, b):
    """No process of the tree runs: none was restored, or CRIU killed what it had restored (a GPU
    refused at post-restore); their zombies, reparented to this test (a subreaper), are reaped."""
    reap([a.pid, b.pid], timeout=5)
    for pid in (a.pid, b.pid):
        assert not os.path.exists(f"/proc/{pid}"), f"pid {pid} was restored"


def state_of(pid):
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def door_dump(door, criu, env, pid, images, link_remap=True, fault=None):
    """A dump of pid's tree through `door` ("wrapper" or "hook") into images (made here);
    -> CompletedProcess whose .text is what the user reads: the command's stderr, and for the
    hook CRIU's log too."""
    os.makedirs(images, exist_ok=True)
    if door == "wrapper":
        r = cli(env, "dump", pid, images, *([] if link_remap else ["--no-link-remap"]))
        r.text = r.stderr
    else:
        r = criu_run(criu, env, ["dump", "-t", str(pid), *(["--link-remap"] if link_remap else [])],
                     images, "dump.log", fault)
        r.text = r.stderr + _read(os.path.join(images, "dump.log"))
    return r


def door_restore(door, criu, env, images, fault=None):
    """A restore of images through `door`; -> CompletedProcess with .text as for door_dump."""
    if door == "wrapper":
        r = cli(env, "restore", images)
        r.text = r.stderr
    else:
        r = criu_run(criu, env, ["restore", "-d"], images, "restore.log", fault)
        r.text = r.stderr + _read(os.path.join(images, "restore.log"))
    return r


def _read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        return ""
