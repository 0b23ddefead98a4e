"""`runc checkpoint` / `runc restore` run CRIU's action scripts from the config file that the
container's `org.criu.config` annotation names: the route by which criu-gpushare-hook reaches
containers (hooks/runc.conf). The test writes its own config file, never /etc/criu."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import time

import pytest

from criutest import dies, status_field

RUNC = shutil.which("runc")
# What CRIU 4.2.1 runs for runc: a container has its own namespaces, so a restore sets them up.
# Its network namespace is the host's here (CRIU needs iptables to lock a private one), so there is
# no network-lock/-unlock.
DUMP_ACTIONS = ["pre-dump", "post-dump"]
RESTORE_ACTIONS = ["pre-restore", "setup-namespaces", "post-setup-namespaces", "post-restore",
                   "pre-resume", "post-resume"]


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

    def __init__(self, tmp_path, criu_config: str):
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

    def runc(self, *args, check=True) -> subprocess.CompletedProcess:
        """runc with stdio on /dev/null: a detached container inherits it, and CRIU cannot dump
        stdio that is a host file outside the container's mount namespace. runc's messages go to
        a log file instead; those of this call are in .stderr."""
        log = self.state.parent / "runc.log"
        log.unlink(missing_ok=True)
        result = subprocess.run([RUNC, "--root", str(self.state), "--log", str(log), *args],
                                cwd=self.bundle, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120)
        result.stderr = log.read_text() if log.exists() else ""
        if check and result.returncode != 0:
            raise AssertionError(f"runc {' '.join(args)} failed: {result.stderr}")
        return result

    def pid(self) -> int | None:
        result = subprocess.run([RUNC, "--root", str(self.state), "state", self.id],
                                capture_output=True, text=True)
        if result.returncode != 0:
            return None
        state = json.loads(result.stdout)
        return state["pid"] if state["status"] == "running" else None

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


@pytest.fixture
def recorder(tmp_path):
    """A CRIU config file whose action script appends each action to a file; returns both."""
    actions = tmp_path / "actions"
    script = tmp_path / "record-action"
    script.write_text(f'#!/bin/sh\necho "$CRTOOLS_SCRIPT_ACTION" >> {actions}\n')
    script.chmod(0o755)
    config = tmp_path / "criu.conf"
    config.write_text(f"action-script {script}\n")
    return str(config), actions


@pytest.fixture
def container(criu, tmp_path, recorder):
    if RUNC is None:
        pytest.skip("runc is not installed (Debian: apt-get install runc)")
    box = Container(tmp_path, recorder[0])
    try:
        started = box.runc("run", "--detach", box.id, check=False)
        if started.returncode != 0:
            pytest.skip(f"runc cannot start a container here (cgroups?): {started.stderr.strip()}")
        yield box
    finally:
        box.remove()


def recorded(actions_file) -> list[str]:
    return actions_file.read_text().split() if actions_file.exists() else []


def test_runc_checkpoint_and_restore_run_the_configured_action_script(container, recorder):
    _, actions = recorder
    pid = container.pid()
    assert pid and container.runs(pid)

    container.runc("checkpoint", "--image-path", str(container.bundle.parent / "images"), container.id)
    assert recorded(actions) == DUMP_ACTIONS
    assert dies(pid) and container.pid() is None

    actions.unlink()
    container.runc("restore", "--detach", "--image-path", str(container.bundle.parent / "images"),
                   container.id)
    assert recorded(actions) == RESTORE_ACTIONS
    restored = container.pid()
    # A new host pid, the same pid inside the container's pid namespace (1: its init).
    assert status_field(restored, "NSpid").split()[-1] == "1"
    assert container.runs(restored)  # with its tmpfs: the ticks file came back and grows


HOOK = shutil.which("criu-gpushare-hook")


def test_runc_with_the_hook_of_hooks_runc_conf_passes_a_container_without_cuda(criu, tmp_path):
    """hooks/runc.conf as a node would install it (the hook's path put in): a container without
    CUDA is checkpointed and restored through the hook, which does nothing for it."""
    if RUNC is None:
        pytest.skip("runc is not installed (Debian: apt-get install runc)")
    if HOOK is None:
        pytest.skip("criu-gpushare-hook is not on PATH (package not installed)")
    example = open(os.path.join(os.path.dirname(__file__), "..", "..", "hooks", "runc.conf")).read()
    config = tmp_path / "runc.conf"
    config.write_text(example.replace("/usr/local/bin/criu-gpushare-hook", HOOK))
    assert HOOK in config.read_text()
    box = Container(tmp_path, str(config))
    try:
        if box.runc("run", "--detach", box.id, check=False).returncode != 0:
            pytest.skip("runc cannot start a container here (cgroups?)")
        pid = box.pid()
        assert pid and box.runs(pid)
        images = str(box.bundle.parent / "images")
        box.runc("checkpoint", "--image-path", images, box.id)
        assert dies(pid)
        box.runc("restore", "--detach", "--image-path", images, box.id)
        assert box.runs(box.pid())
    finally:
        box.remove()
