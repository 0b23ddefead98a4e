"""`criu-gpushare-hook` as CRIU runs it: no arguments, the action in CRTOOLS_SCRIPT_ACTION; the
actions it does not use, and the ones it uses on a tree without CUDA, let CRIU proceed."""
import json
import os
import subprocess
import sys
import time

import pytest

from imports import modules_after

# What a hook action leaves to the holder that serves it (each is most of a start).
HOLDER_SERVED = ["criu_gpushare.engine.jobs", "criu_gpushare.store", "criu_gpushare.criu", "criu_gpushare.gpu",
                 "criu_gpushare.shimctl", "cuda", "psutil"]

HOOK = [sys.executable, "-m", "criu_gpushare.hook.entry"]  # what the installed command runs


def run_hook(action, **env):
    full = {"PATH": os.environ["PATH"], "CRTOOLS_SCRIPT_ACTION": action, **env}
    return subprocess.run(HOOK, env=full, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60)


@pytest.mark.parametrize("action", ["network-lock", "network-unlock", "setup-namespaces",
                                    "post-setup-namespaces", "pre-resume", "status-ready",
                                    "query-ext-files", "orphan-pts-master", "some-future-action", ""])
def test_actions_it_does_not_use_let_criu_proceed(action):
    r = run_hook(action)
    assert r.returncode == 0, r.stderr


def test_an_action_it_does_not_use_imports_nothing_of_the_engine():
    """CRIU starts the hook for every action: those it ignores pay for the interpreter only, not
    for the engine, the store or CRIU's bindings (bench/startup_bench.py measures it)."""
    imported, _ = modules_after("import os; os.environ['CRTOOLS_SCRIPT_ACTION'] = 'network-lock'; "
                                "from criu_gpushare.hook.entry import main; assert main() == 0",
                                ["criu_gpushare."])
    assert imported == ["criu_gpushare.hook", "criu_gpushare.hook.entry"]


@pytest.mark.parametrize("action", ["post-dump", "post-restore", "post-resume"])
def test_actions_with_nothing_of_ours_to_do_let_criu_proceed(action, tmp_path):
    """No dump of ours for this tree, no restore of ours by this CRIU: nothing to do."""
    run = tmp_path / "run"
    with subprocess.Popen(["sleep", "30"]) as p:
        try:
            r = run_hook(action, CRTOOLS_INIT_PID=str(p.pid), CRIU_GPUSHARE_RUN_DIR=str(run),
                         CRTOOLS_IMAGE_DIR=str(tmp_path))  # an image without our record
        finally:
            p.kill()
    assert r.returncode == 0, r.stderr


def test_pre_dump_of_a_tree_without_cuda_proceeds():
    with subprocess.Popen(["sleep", "30"]) as p:
        try:
            r = run_hook("pre-dump", CRTOOLS_INIT_PID=str(p.pid))
        finally:
            p.kill()
    assert r.returncode == 0, r.stderr


def test_pre_dump_of_an_unknown_pid_fails_clearly():
    gone = subprocess.Popen(["true"])
    gone.wait()
    time.sleep(0.1)
    r = run_hook("pre-dump", CRTOOLS_INIT_PID=str(gone.pid))
    assert r.returncode != 0 and "no such process" in r.stderr


def test_pre_dump_without_init_pid_fails_clearly():
    r = run_hook("pre-dump")
    assert r.returncode != 0 and "CRTOOLS_INIT_PID" in r.stderr


def test_the_contract_lists_the_actions_in_criu_order():
    """hooks/README.md has one row per action the hook uses, in CRIU's order (as CRIU 4.2.1 runs
    them: tests/criu/test_rpc.py pins that order), and the dispatch table is the same list."""
    from criu_gpushare.hook.entry import USED
    from criu_gpushare.hook.main import ACTIONS
    criu_order = ["pre-dump", "post-dump", "pre-restore", "post-restore", "post-resume"]
    assert list(ACTIONS) == criu_order
    assert USED == set(ACTIONS), "the entry point would skip an action the hook uses"
    readme = open(os.path.join(os.path.dirname(__file__), "..", "..", "hooks", "README.md")).read()
    rows = [line.split("|")[1].strip().strip("`") for line in readme.splitlines()
            if line.startswith("| `")]
    assert [r for r in rows if r in criu_order] == criu_order


LAUNCHER = os.path.join(os.path.dirname(__file__), "..", "..", "hooks", "criu-gpushare-hook")


def launcher_actions():
    """The actions hooks/criu-gpushare-hook hands to Python: the first pattern of its case."""
    with open(LAUNCHER) as f:
        for line in f:
            if line.rstrip().endswith(") ;;") and not line.lstrip().startswith("*"):
                return {a.strip() for a in line.rstrip()[:-len(") ;;")].split("|")}
    raise AssertionError("no action pattern in the launcher")


def test_the_launcher_hands_python_exactly_the_actions_the_hook_uses():
    from criu_gpushare.hook.main import ACTIONS
    assert launcher_actions() == set(ACTIONS)


def launcher_in(tmp_path, actions_program):
    """A copy of the launcher in a bin directory of its own, beside a stand-in for
    criu-gpushare-hook-actions (None: none there), and a link to it from elsewhere (a node's
    /usr/local/bin/criu-gpushare-hook may be one)."""
    bin_dir, elsewhere = tmp_path / "bin", tmp_path / "elsewhere"
    bin_dir.mkdir()
    elsewhere.mkdir()
    launcher = bin_dir / "criu-gpushare-hook"
    launcher.write_text(open(LAUNCHER).read())
    launcher.chmod(0o755)
    if actions_program is not None:
        actions = bin_dir / "criu-gpushare-hook-actions"
        actions.write_text(actions_program)
        actions.chmod(0o755)
    (elsewhere / "criu-gpushare-hook").symlink_to(launcher)
    return launcher, elsewhere / "criu-gpushare-hook"


@pytest.mark.parametrize("action", ["network-lock", "setup-namespaces", "pre-resume", "status-ready",
                                    "some-future-action", ""])
def test_the_launcher_lets_criu_proceed_at_the_actions_it_ignores_without_starting_python(
        action, tmp_path):
    """CRIU waits for its action script at every action: those of none of ours end in the shell.
    No Python is on its PATH here, and the program it would run fails: neither is reached."""
    launcher, _ = launcher_in(tmp_path, "#!/bin/sh\nexit 97\n")
    r = subprocess.run([str(launcher)], env={"PATH": "/nonexistent", "CRTOOLS_SCRIPT_ACTION": action},
                       capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=30)
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "")


@pytest.mark.parametrize("through_link", [False, True])
def test_the_launcher_runs_the_actions_program_beside_it_with_criu_s_environment(tmp_path, through_link):
    """An action of ours runs criu-gpushare-hook-actions from the launcher's own directory (through
    a link to the launcher too), with CRIU's environment, its output and its exit code."""
    program = "#!/bin/sh\necho \"ran $CRTOOLS_SCRIPT_ACTION $CRTOOLS_INIT_PID $#\"; echo err >&2; exit 7\n"
    launcher, link = launcher_in(tmp_path, program)
    r = subprocess.run([str(link if through_link else launcher)], capture_output=True, text=True,
                       env={"PATH": "/usr/bin:/bin", "CRTOOLS_SCRIPT_ACTION": "post-dump",
                            "CRTOOLS_INIT_PID": "4242"}, stdin=subprocess.DEVNULL, timeout=30)
    assert (r.returncode, r.stdout, r.stderr) == (7, "ran post-dump 4242 0\n", "err\n")


def test_the_launcher_without_the_actions_program_beside_it_looks_on_path_and_fails_clearly(tmp_path):
    launcher, _ = launcher_in(tmp_path, None)
    r = subprocess.run([str(launcher)], env={"PATH": str(tmp_path), "CRTOOLS_SCRIPT_ACTION": "pre-dump"},
                       capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=30)
    assert r.returncode != 0 and "criu-gpushare-hook-actions" in r.stderr, r.stderr


def test_the_installed_hook_is_the_launcher_with_its_actions_program_beside_it():
    import shutil
    installed = shutil.which("criu-gpushare-hook")
    if installed is None:
        pytest.skip("criu-gpushare-hook is not on PATH (package not installed)")
    assert open(installed).read() == open(LAUNCHER).read()
    assert os.access(os.path.join(os.path.dirname(os.path.realpath(installed)),
                                  "criu-gpushare-hook-actions"), os.X_OK)


def test_pre_dump_forks_its_holder_before_the_engine_or_cuda_is_imported():
    """CRIU seizes nothing until pre-dump returns: what its process imports before the fork
    (the dump's holder, the settings, the tree's CUDA processes) leaves the engine, the store,
    CRIU's bindings and the driver's to the holder, which imports them while CUDA starts."""
    imported, _ = modules_after("from criu_gpushare.hook import main; "
                                "from criu_gpushare.engine.dump_holder import DumpHolder; "
                                "from criu_gpushare.engine.settings import load_settings; "
                                "from criu_gpushare.shimctl.processes import cuda_pids",
                                ["criu_gpushare.engine.jobs", "criu_gpushare.engine.steps", "criu_gpushare.engine.dump",
                                 "criu_gpushare.store", "criu_gpushare.criu", "cuda"])
    assert imported == ["criu_gpushare.engine.dump_holder"]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")
def test_pre_dump_fails_closed_when_it_cannot_see_a_process():
    """A process whose maps the hook cannot read is not taken as "uses no CUDA": pre-dump's
    discovery raises (the hook exits with its code and CRIU aborts the dump)."""
    from criu_gpushare.shimctl.processes import cuda_pids
    with subprocess.Popen(["sleep", "30"]) as p:
        r, w = os.pipe()
        child = os.fork()
        if child == 0:
            os.close(r)
            try:
                os.setresgid(65534, 65534, 65534)
                os.setresuid(65534, 65534, 65534)
                cuda_pids(p.pid)
                os.write(w, b"no error")
            except Exception as e:  # noqa: BLE001 - reported to the parent
                os.write(w, f"{type(e).__name__}: {e}".encode())
            os._exit(0)
        os.close(w)
        got = os.read(r, 4096).decode()
        os.waitpid(child, 0)
        p.kill()
    assert got.startswith("ProcessError") and "permission denied" in got, got


def test_post_resume_asks_the_restore_holder_or_finishes_the_work_where_none_answers(
        tmp_path, monkeypatch):
    """A CRIU whose pre-restore ran another program, or whose holder died before being asked or
    with the request: post-resume finishes the work itself (engine/jobs.py, from the holder's
    journal or from the image post-restore named), told whether the holder died with it; with a
    holder that answers, the holder does it, and its failure is the action's, saying how to finish."""
    from criu_gpushare.engine import holder, jobs, statedir
    from criu_gpushare.errors import Failed, ProcessError
    from criu_gpushare.hook import main as hook
    monkeypatch.setenv("CRIU_GPUSHARE_RUN_DIR", str(tmp_path))
    monkeypatch.setattr(hook, "_criu_pid", lambda: 999999)
    ran = []
    monkeypatch.setattr(jobs.Restore, "finish_without_holder", staticmethod(
        lambda state, report, dead_holder: ran.append((state, dead_holder))
        or {"pids": [state["root"]], "phases": {}}))
    state = {"images_dir": str(tmp_path / "images"), "root": 4242}
    statedir.write_json("restore-999999.json", state)
    assert hook.post_resume("post-resume") == 0  # no holder listens
    assert ran == [(state, None)] and statedir.read_json("restore-999999.json") is None

    def dies(key, cmd, on_progress, **fields):
        raise ProcessError(key, "the holder closed the connection without an answer")
    monkeypatch.setattr(holder, "ask", dies)
    statedir.write_json("restore-999999.json", state)
    assert hook.post_resume("post-resume") == 0
    assert ran[1:] == [(state, "restore-999999")]

    asked = []
    monkeypatch.setattr(holder, "ask", lambda key, cmd, on_progress, **fields: asked.append(
        (key, cmd, fields)) or {"ok": False, "message": "load failed", "exit_code": 15})
    statedir.write_json("restore-999999.json", state)
    with pytest.raises(Failed) as e:
        hook.post_resume("post-resume")
    assert asked == [("restore-999999", "post-resume", {"root": 4242})] and len(ran) == 2
    assert e.value.exit_code == 15 and "load failed" in str(e.value)
    assert "criu-gpushare resume 4242" in str(e.value)


def test_pre_restore_forks_its_holder_and_imports_none_of_the_jobs(tmp_path, monkeypatch):
    """CRIU restores nothing until pre-restore returns: it reads the record and forks the holder,
    importing none of the jobs; the holder checks the image, the store and the GPUs while CRIU
    restores, and post-restore hears the verdict (here a refusal: the store is not there)."""
    images = tmp_path / "images"
    images.mkdir()
    (images / "criu-gpushare.json").write_text(json.dumps(
        {"format": 1, "gpu_state": True, "store": str(tmp_path / "no-store"), "ref": "r", "gpus": [],
         "processes": [], "group": {}}))
    run = tmp_path / "run"
    criu = subprocess.Popen(["sleep", "60"])  # stands for CRIU: the holder watches it
    try:
        probe = f"""
import os
os.environ.update(CRTOOLS_SCRIPT_ACTION="pre-restore", CRTOOLS_IMAGE_DIR={str(images)!r},
                  CRIU_GPUSHARE_RUN_DIR={str(run)!r}, CRIU_GPUSHARE_CONFIG=os.devnull)
from criu_gpushare.hook import main as hook
hook._criu_pid = lambda: {criu.pid}
assert hook.main() == 0
"""
        imported, _ = modules_after(probe, HOLDER_SERVED)
        assert imported == ["criu_gpushare.gpu", "criu_gpushare.gpu.devices"]  # the settings' GPU map
        from criu_gpushare.engine import holder
        monkeypatch.setenv("CRIU_GPUSHARE_RUN_DIR", str(run))
        final = holder.ask(f"restore-{criu.pid}", "post-restore", on_progress=lambda m: None, root=4242)
        assert not final["ok"] and "no-store" in final["message"], final
    finally:
        criu.kill()
        criu.wait()


def test_post_restore_and_a_post_resume_a_holder_serves_import_none_of_the_jobs(tmp_path):
    """Both run while the restored tree waits: where the holder has the work, they import neither
    the jobs nor the store, CRIU's bindings or the driver's (each is most of a start)."""
    images = tmp_path / "images"
    images.mkdir()
    (images / "criu-gpushare.json").write_text("{}")  # post-restore only looks for it
    probe = f"""
import os
os.environ.update(CRTOOLS_SCRIPT_ACTION="post-restore", CRTOOLS_IMAGE_DIR={str(images)!r},
                  CRTOOLS_INIT_PID="4242", CRIU_GPUSHARE_RUN_DIR={str(tmp_path / "run")!r})
from criu_gpushare.hook.entry import main
assert main() == 0
from criu_gpushare.engine import holder
holder.ask = lambda key, cmd, on_progress, **f: {{"ok": True, "result": {{"pids": [f["root"]], "phases": {{"load": 1.0}}}}}}
os.environ["CRTOOLS_SCRIPT_ACTION"] = "post-resume"
assert main() == 0
"""
    imported, r = modules_after(probe, HOLDER_SERVED)
    assert imported == []
    assert "post-resume: GPU state of 1 process(es) is back: load 1.00" in r.stderr, r.stderr
