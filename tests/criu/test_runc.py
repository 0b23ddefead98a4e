"""`runc checkpoint` / `runc restore` run CRIU's action scripts from the config file that the
container's `org.criu.config` annotation names: the route by which criu-gpushare-hook reaches
containers (hooks/runc.conf). The test writes its own config file, never /etc/criu. runc runs with
the cgroup v2 hierarchy (runcbox.cgroup2_view) where the host has one: the v1 freezer left a task
of the container in D state past CRIU's 10 s freeze timeout now and then on a hybrid host."""
from __future__ import annotations

import os
import shutil

import pytest

from criutest import dies, status_field
from runcbox import RUNC, Container, cgroup2_view
# What CRIU 4.2.1 runs for runc: a container has its own namespaces, so a restore sets them up.
# Its network namespace is the host's here (CRIU needs iptables to lock a private one), so there is
# no network-lock/-unlock.
DUMP_ACTIONS = ["pre-dump", "post-dump"]
RESTORE_ACTIONS = ["pre-restore", "setup-namespaces", "post-setup-namespaces", "post-restore",
                   "pre-resume", "post-resume"]


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
    box = Container(tmp_path, recorder[0], prefix=cgroup2_view() or [])
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
    box = Container(tmp_path, str(config), prefix=cgroup2_view() or [])
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
