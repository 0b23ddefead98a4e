"""Ctrl-C at a chosen point of a `criu-gpushare` command: the tool waits there
(CRIU_GPUSHARE_FAULT=<point>:pause, criu_gpushare/engine/faults.py) while the test sends SIGINT."""
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


def interrupt(args, env, pause, signals=1, timeout=120):
    """Run `criu-gpushare ARGS` until some tool process waits at the pause file, send the command
    SIGINT `signals` times (each once the command has answered the one before, or exited), let
    the pause go; -> CompletedProcess (stderr as text)."""
    err_path = f"{pause}.stderr"
    with open(err_path, "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "criu_gpushare.cli", *map(str, args)], env=env,
                                stdout=subprocess.PIPE, stderr=err, text=True)
    try:
        wait_until(lambda: os.path.exists(pause) or proc.poll() is not None, f"the pause at {pause}")
        assert proc.poll() is None, f"exited ({proc.returncode}) before its pause: {open(err_path).read()}"
        for n in range(signals):
            proc.send_signal(signal.SIGINT)
            wait_until(lambda: open(err_path).read().count("interrupt") > n or proc.poll() is not None,
                       "the command to answer the interrupt")
        os.unlink(pause)
        out, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if os.path.exists(pause):
            os.unlink(pause)
    return subprocess.CompletedProcess(args, proc.returncode, out, open(err_path).read())
