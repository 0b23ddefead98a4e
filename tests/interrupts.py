"""A `criu-gpushare` command (or CRIU running the hook) held at a chosen point
(CRIU_GPUSHARE_FAULT=<point>:pause, criu_gpushare/engine/faults.py) while the test acts on it:
Ctrl-C (interrupt), or a SIGKILL of the command or of CRIU (tests/hook/test_criu_faults.py)."""
import contextlib
import os
import signal
import subprocess
import sys
import time


def paused_env(env, point, pause):
    """env for a tool process that waits at `point` while the file `pause` exists."""
    return dict(env, CRIU_GPUSHARE_FAULT=f"{point}:pause", CRIU_GPUSHARE_FAULT_PAUSE=str(pause))


def wait_until(cond, what, timeout=60):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def tool_argv(args):
    return [sys.executable, "-m", "criu_gpushare.cli", *map(str, args)]


@contextlib.contextmanager
def paused(argv, env, pause, timeout=120):
    """Start argv (env from paused_env) and wait until a process of it waits at the pause file;
    -> (Popen, path of its stderr). On leaving, the pause is let go and the command waited for
    (killed after `timeout`); its stdout is then in Popen.out."""
    err_path = f"{pause}.stderr"
    with open(err_path, "w") as err:
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=err, text=True)
    try:
        wait_until(lambda: os.path.exists(pause) or proc.poll() is not None, f"the pause at {pause}")
        assert proc.poll() is None, f"exited ({proc.returncode}) before its pause: {open(err_path).read()}"
        yield proc, err_path
    finally:
        if os.path.exists(pause):
            os.unlink(pause)
        try:
            proc.out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.out, _ = proc.communicate()


def paused_pid(pause):
    """The pid of the process waiting at the pause file."""
    with open(pause) as f:
        return int(f.read())


def interrupt(args, env, pause, signals=1, timeout=120):
    """Run `criu-gpushare ARGS` until some tool process waits at the pause file, send the command
    SIGINT `signals` times (each once the command has answered the one before, or exited), let
    the pause go; -> CompletedProcess (stderr as text)."""
    with paused(tool_argv(args), env, pause, timeout) as (proc, err_path):
        for n in range(signals):
            proc.send_signal(signal.SIGINT)
            wait_until(lambda: open(err_path).read().count("interrupt") > n or proc.poll() is not None,
                       "the command to answer the interrupt")
    return subprocess.CompletedProcess(args, proc.returncode, proc.out, open(err_path).read())
