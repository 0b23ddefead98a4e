"""A runc container the tests checkpoint and restore: the host's /usr and /etc read-only (each
mount below them bound on its own, as CRIU can dump it), a tmpfs /tmp, the host's network
namespace, its own pid and mount namespaces; runc's state and log in the test's directory.
tests/criu/test_runc.py, tests/hook/test_runc_hook.py and tests/gpu/test_runc_gpu.py use it."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import time

RUNC = shutil.which("runc")


def cgroup2_view() -> list[str]:
    """A prefix that runs a command with the host's cgroup v2 hierarchy at /sys/fs/cgroup, on a
    hybrid host (v1 controllers there, cgroup2 at /sys/fs/cgroup/unified): runc then puts the
    container in a v2 cgroup and CRIU freezes it through cgroup.freeze, as on a v2 host (CI's). []
    on a v2 host, None where there is no v2 hierarchy."""
    if _fs_type("/sys/fs/cgroup") == "cgroup2":
        return []
    if _fs_type("/sys/fs/cgroup/unified") != "cgroup2":
        return None
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c",
            'mount --bind /sys/fs/cgroup/unified /sys/fs/cgroup && exec "$0" "$@"']


def _fs_type(path):
    found = None
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            if fields[4] == path:
                found = fields[fields.index("-") + 1]  # the last mount there wins
    return found


def host_binds(path, ro=True):
    """Config mounts that show the host's PATH in a container as CRIU can dump it: PATH bound
    without recursion, then each mount below it bound on its own. runc declares the mounts of
    its configuration to CRIU as external; a mount that only comes along with an "rbind" is not,
    and CRIU refuses one of a file system it cannot mount itself ("FS mnt ./usr/local/... unsupported":
    a block device's, as the GPU machine's driver directory is)."""
    below = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = line.split()[4].replace("\\040", " ")
            if point.startswith(path.rstrip("/") + "/") and point not in below:
                below.append(point)  # mountinfo lists parents before children
    opts = ["ro"] if ro else ["rw"]
    return [{"destination": p, "type": "bind", "source": p, "options": ["bind", *opts]}
            for p in [path, *below]]


class Container:
    """One runc container whose rootfs is the host's /usr and /etc, read-only, and a tmpfs /tmp,
    running a shell loop that appends to /tmp/ticks; runc's state lives in the test's directory."""

    def __init__(self, tmp_path, criu_config: str, env: dict | None = None, prefix=()):
        """env: the environment of every runc call, which runc passes on to CRIU and CRIU to its
        action scripts (None: this process's); prefix: what runs runc (cgroup2_view())."""
        self.env, self.prefix = env, list(prefix)
        self.bundle = tmp_path / "bundle"
        self.state = tmp_path / "runc-state"
        self.id = f"criu-gpushare-test-{os.getpid()}"
        rootfs = self.bundle / "rootfs"
        for d in ("usr", "etc", "tmp", "proc", "dev", "sys"):
            (rootfs / d).mkdir(parents=True)
        mounts = host_binds("/usr") + host_binds("/etc")
        for d in ("bin", "lib", "lib64", "sbin"):
            host = f"/{d}"
            if os.path.islink(host):  # merged /usr: the same link in the rootfs
                os.symlink(os.readlink(host), rootfs / d)
            elif os.path.isdir(host):
                (rootfs / d).mkdir()
                mounts += host_binds(host)
        mounts.append({"destination": "/tmp", "type": "tmpfs", "source": "tmpfs",
                       "options": ["nosuid", "nodev", "mode=1777"]})
        subprocess.run([RUNC, "spec"], cwd=self.bundle, check=True)
        config = json.loads((self.bundle / "config.json").read_text())
        config["root"] = {"path": "rootfs", "readonly": True}
        config["process"]["terminal"] = False
        config["process"]["args"] = ["sh", "-c", "while :; do echo . >> /tmp/ticks; sleep 0.02; done"]
        config["mounts"] += mounts
        config["linux"]["namespaces"] = [ns for ns in config["linux"]["namespaces"]
                                         if ns["type"] != "network"]
        config["annotations"] = {"org.criu.config": criu_config}
        (self.bundle / "config.json").write_text(json.dumps(config))

    def configure(self, args: list[str], env: list[str], binds=(), rw_binds=()):
        """The container's process (args, env as "K=V" strings), and host directories shown at
        the same paths inside it (host_binds), read-only or read-write."""
        config = json.loads((self.bundle / "config.json").read_text())
        for path, ro in [(p, True) for p in binds] + [(p, False) for p in rw_binds]:
            path = str(path)
            (self.bundle / "rootfs" / path.lstrip("/")).mkdir(parents=True, exist_ok=True)
            config["mounts"] += host_binds(path, ro=ro)
        config["process"]["args"] = [str(a) for a in args]
        config["process"]["env"] = env
        (self.bundle / "config.json").write_text(json.dumps(config))
        return config

    def runc(self, *args, check=True) -> subprocess.CompletedProcess:
        """runc with stdio on /dev/null: a detached container inherits it, and CRIU cannot dump
        stdio that is a host file outside the container's mount namespace. runc's messages go to
        a log file instead; those of this call are in .stderr."""
        log = self.state.parent / "runc.log"
        log.unlink(missing_ok=True)
        result = subprocess.run([*self.prefix, RUNC, "--root", str(self.state), "--log", str(log), *args],
                                cwd=self.bundle, stdin=subprocess.DEVNULL, env=self.env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120)
        result.stderr = log.read_text() if log.exists() else ""
        if check and result.returncode != 0:
            raise AssertionError(f"runc {' '.join(args)} failed: {result.stderr}")
        return result

    def pid(self) -> int | None:
        result = subprocess.run([*self.prefix, RUNC, "--root", str(self.state), "state", self.id],
                                capture_output=True, text=True)
        if result.returncode != 0:
            return None
        state = json.loads(result.stdout)
        return state["pid"] if state["status"] == "running" else None

    def tasks(self) -> dict[int, str]:
        """Each thread of each process in the container (host tids) and its state letter (R, S,
        T: stopped, t: traced, Z, ...)."""
        result = subprocess.run([*self.prefix, RUNC, "--root", str(self.state), "ps", "--format", "json", self.id],
                                capture_output=True, text=True, env=self.env)
        states = {}
        for pid in (json.loads(result.stdout or "null") or []) if result.returncode == 0 else []:
            try:
                tids = os.listdir(f"/proc/{pid}/task")
            except FileNotFoundError:
                continue
            for tid in map(int, tids):
                try:
                    with open(f"/proc/{pid}/task/{tid}/stat") as f:
                        states[tid] = f.read().rsplit(")", 1)[1].split()[0]
                except FileNotFoundError:
                    pass
        return states

    def explain(self, images=None) -> str:
        """What a failing test prints: the container's threads and their states, and the
        criu-gpushare-hook lines of CRIU's logs in images."""
        lines = [f"container {self.id} pid {self.pid()}; threads (tid: state): {self.tasks()}"]
        for name in ("dump.log", "restore.log"):
            try:
                with open(os.path.join(str(images), name), errors="replace") as f:
                    hook = [line.rstrip() for line in f if "criu-gpushare-hook" in line]
            except (OSError, TypeError):
                continue
            lines += [f"{name}, the hook's lines:"] + (hook or ["(none)"])
        return "\n".join(lines)

    def ticks(self, pid: int) -> int:
        """The size of the container's /tmp/ticks, seen through its root."""
        try:
            return os.path.getsize(f"/proc/{pid}/root/tmp/ticks")
        except FileNotFoundError:
            return 0

    def runs(self, pid: int) -> bool:
        before = self.ticks(pid)
        for _ in range(100):
            time.sleep(0.05)
            if self.ticks(pid) > before:
                return True
        return False

    def remove(self):
        self.runc("kill", self.id, "KILL", check=False)
        self.runc("delete", "--force", self.id, check=False)
