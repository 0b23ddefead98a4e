"""Starting, talking to and cleaning up the probe programs, for the fake-driver and GPU tests alike.

A ProbeSession owns one rendezvous directory and every process it started there. Each probe runs in
its own session (process group), carries GPUSHARE_PROBE_TAG=$GPUSHARE_PROBE_RUN in its
environment so that scripts/gpu-tests.sh can find leftovers, and is SIGKILLed (group and all) when the session closes:
a process the driver left stuck CHECKPOINTED ignores everything else. Driver checkpoint calls are
made only by checkpointer.py, one checkpointer at a time (the real driver hangs when two processes
call at once; only the fake-driver test starts two, on purpose).

This module never imports cuda-python: pytest itself stays out of the CUDA driver.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

PROBES_DIR = Path(__file__).resolve().parent
NO_MULTICAST_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
TAG_VAR = "GPUSHARE_PROBE_TAG"
DEFAULT_WAIT_S = 120.0


class ProbeRunError(AssertionError):
    """A probe program failed, said `<role>.error`, or did not answer in time."""


class CheckpointRun:
    """The calls one checkpointer.py run made: parsed from its PROBE lines."""

    def __init__(self, steps, returncode, output):
        self.steps = steps
        self.returncode = returncode
        self.output = output
        self.calls = []       # dicts: step, op, pid, result, secs [, state, tid]
        self.step_secs = {}   # step index -> wall seconds of the step
        for fields in parse_probe_lines(output):
            if fields["probe"] == "ckpt_call":
                self.calls.append(fields)
            elif fields["probe"] == "ckpt_step":
                self.step_secs[int(fields["step"])] = float(fields["secs"])

    def complete(self):
        """Every step made its call on every one of its pids (nothing lost or cut short)."""
        expected = {(index, int(pid)) for index, step in enumerate(self.steps)
                    for pid in step.partition(":")[2].split(",")}
        return {(int(c["step"]), int(c["pid"])) for c in self.calls} == expected and \
            len(self.calls) == len(expected)

    def call(self, step):
        """The one call of step `step` (a single-pid step)."""
        matching = [c for c in self.calls if int(c["step"]) == step]
        assert len(matching) == 1, f"step {step}: {matching}\n{self.output}"
        return matching[0]

    def results(self, step):
        """{pid: result name} of step `step`."""
        return {int(c["pid"]): c["result"] for c in self.calls if int(c["step"]) == step}

    def sequence(self):
        """[(op, pid, result)] in step order, for readable assertion messages."""
        return [(c["op"], int(c["pid"]), c["result"]) for c in
                sorted(self.calls, key=lambda c: int(c["step"]))]

    def __repr__(self):
        return f"CheckpointRun(rc={self.returncode}, {self.sequence()})"


def parse_probe_lines(text):
    """Every `PROBE name k=v ...` line of `text` as a dict with key 'probe' = name."""
    found = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] == "PROBE":
            fields = {"probe": parts[1]}
            for part in parts[2:]:
                key, _, value = part.partition("=")
                fields[key] = value
            found.append(fields)
    return found


def record(name, **figures):
    """Report measured figures: printed, and appended to $PROBE_RECORD (the GPU summary reads it)."""
    test = os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0].rpartition("::")[2]
    fields = {"test": test or "-", **figures}
    line = " ".join(["PROBE", name] + [f"{k}={str(v).replace(' ', '_')}" for k, v in fields.items()])
    print(line, flush=True)
    target = os.environ.get("PROBE_RECORD")
    if target:
        with open(target, "a") as f:
            f.write(line + "\n")


def nvidia_fds(pid):
    """The /dev/nvidia* paths among the open fds of `pid` (one entry per fd)."""
    found = []
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except FileNotFoundError:
        return found  # the process is gone
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("/dev/nvidia"):
            found.append(target)
    return found


def _sigkill_group(pid):
    """SIGKILL the process group led by `pid` (probes start their own) and `pid` itself."""
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def fd_target(pid, fd):
    try:
        return os.readlink(f"/proc/{pid}/fd/{fd}")
    except OSError:
        return None


class ProbeSession:
    """Probe processes sharing the rendezvous directory `directory`; use as a context manager."""

    def __init__(self, directory, env, python=sys.executable):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.env = dict(env)
        self.env.update(NO_MULTICAST_ENV)
        # The tag names this run (scripts/gpu-tests.sh sets GPUSHARE_PROBE_RUN and kills leftovers)
        self.env[TAG_VAR] = os.environ.get("GPUSHARE_PROBE_RUN", "probe")
        self.python = python
        self.procs = {}        # name -> Popen, every process started
        self.roles = set()     # names of the long-lived ones, watched while waiting
        self.adopted = set()   # pids not our children (restored by CRIU) to kill at the end

    # ------------------------------------------------------------ processes
    def start(self, name, script, *args, python=True, role=True):
        """Start a probe program (PROBES_DIR/script) in its own session; output to NAME.log.

        A role (role=True) is expected to live until `stop`: while waiting, its death fails the wait.
        python=False runs `script` itself (a path) instead of a Python probe.
        """
        assert name not in self.procs, f"{name} started twice"
        argv = ([self.python, str(PROBES_DIR / script)] if python else [str(script)]) + [
            str(a) for a in args]
        log = open(self.dir / f"{name}.log", "wb")
        try:
            proc = subprocess.Popen(argv, cwd=self.dir, env=self.env, stdin=subprocess.DEVNULL,
                                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            log.close()
        self.procs[name] = proc
        if role:
            self.roles.add(name)
        return proc

    def log(self, name):
        try:
            return (self.dir / f"{name}.log").read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def describe(self):
        """Exit codes and the log tails of every process: the context a failed assertion needs."""
        lines = []
        for name, proc in self.procs.items():
            lines.append(f"--- {name} (pid {proc.pid}, rc {proc.poll()}):")
            lines.extend(self.log(name).splitlines()[-15:])
        return "\n".join(lines)

    def reap_role(self, name, timeout=30):
        """Role `name` was dumped and killed by CRIU: reap it, so that its pid is free for
        `criu restore`, and stop watching it (adopt the restored pid instead)."""
        self.procs[name].wait(timeout)
        self.roles.discard(name)

    def adopt(self, pid):
        """Kill `pid` too at close (a process CRIU restored is not our child)."""
        self.adopted.add(pid)

    def close(self, grace_s=3.0):
        """Ask every role to stop, then SIGKILL whatever is left, process groups included."""
        self.announce("stop")
        deadline = time.monotonic() + grace_s
        for proc in self.procs.values():
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        # Only pids that cannot have been reused: our unreaped children, and adopted processes
        # that still carry this session's tag.
        alive = [proc.pid for proc in self.procs.values() if proc.poll() is None]
        tagged = [pid for pid in sorted(self.adopted) if self._is_ours(pid)]
        for pid in alive + tagged:
            _sigkill_group(pid)
        for proc in self.procs.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                pass  # stuck in the driver (D state): nothing more a test can do

    def _is_ours(self, pid):
        entry = f"{TAG_VAR}={self.env[TAG_VAR]}".encode()
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                return entry in f.read().split(b"\0")
        except OSError:
            return False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ------------------------------------------------------------ rendezvous files
    def announce(self, name, payload=None):
        tmp = self.dir / f".{name}.harness.tmp"
        tmp.write_text(json.dumps(payload if payload is not None else {}))
        os.rename(tmp, self.dir / name)

    def wait_for(self, name, timeout=DEFAULT_WAIT_S):
        """Wait for a role's file; fail early when any role died or wrote an error."""
        deadline = time.monotonic() + timeout
        path = self.dir / name
        while True:
            try:
                return json.loads(path.read_text())
            except FileNotFoundError:
                pass
            errors = sorted(self.dir.glob("*.error"))
            if errors:
                raise ProbeRunError(f"waiting for {name}: {errors[0].read_text()}\n{self.describe()}")
            for proc_name in self.roles:
                proc = self.procs[proc_name]
                if proc.poll() is not None:
                    raise ProbeRunError(f"waiting for {name}: {proc_name} exited {proc.returncode}"
                                        f"\n{self.describe()}")
            if time.monotonic() > deadline:
                raise ProbeRunError(f"no {path} after {timeout:.0f} s\n{self.describe()}")
            time.sleep(0.02)

    def request(self, role, name, payload=None, timeout=DEFAULT_WAIT_S):
        """Ask role `role` for action `name` and return its answer."""
        done = self.dir / f"{role}.{name}.done"
        if done.exists():
            done.unlink()
        self.announce(f"{role}.{name}", payload)
        return self.wait_for(done.name, timeout)

    # ------------------------------------------------------------ roles
    def start_exporter(self, kind, mib, seed=1):
        self.start("exporter", "share.py", "exporter", "--kind", kind, "--dir", self.dir,
                   "--size-mib", mib, "--seed", seed)
        return self.wait_for("exporter.ready")

    def start_importer(self, kind, mib, seed=1):
        self.start("importer", "share.py", "importer", "--kind", kind, "--dir", self.dir,
                   "--size-mib", mib, "--seed", seed)
        return self.wait_for("importer.ready")

    def start_holder(self, name, mib, seed=1):
        self.start(name, "holder.py", "--dir", self.dir, "--name", name, "--size-mib", mib,
                   "--seed", seed)
        return self.wait_for(f"{name}.ready")

    def run_program(self, name, script, *args, timeout):
        """Run a one-shot probe program to its end; returns (returncode, output)."""
        proc = self.start(name, script, *args, role=False)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
            raise ProbeRunError(f"{name} still running after {timeout} s; killed\n{self.log(name)}")
        return proc.returncode, self.log(name)

    # ------------------------------------------------------------ driver checkpoint calls
    def checkpoint(self, *steps, timeout=180.0, name=None, lock_timeout_ms=10000):
        """Run checkpointer.py with STEPs ("op:pid[,pid]") and wait for it; a CheckpointRun."""
        name = name or f"checkpointer-{sum(n.startswith('checkpointer') for n in self.procs)}"
        args = ["--lock-timeout-ms", lock_timeout_ms, "--call-timeout-s", timeout - 5, *steps]
        returncode, output = self.run_program(name, "checkpointer.py", *args, timeout=timeout)
        return CheckpointRun(steps, returncode, output)
