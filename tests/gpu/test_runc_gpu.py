"""`runc checkpoint` / `runc restore` of a container that runs a CUDA process on the GPU, through
hooks/runc.conf (criu-gpushare-hook and link-remap), its GPU contents intact after.

The container is tests/criu/runcbox.py's (the host's /usr and /etc read-only, the host's network
namespace, its own pid and mount namespaces) plus what a GPU container has: the NVIDIA device nodes
bind-mounted and allowed, the driver's libraries (under the host's /usr), /opt (where the GPU
machine's Python lives), the repository (the workload and the shim) and a control directory. The
host's directories are bound as runcbox's host_binds does (each mount below one on its own: the
driver's directory on the GPU machine is a file system of its own under /usr). The workload is
bench/workloads/blocks.py under the shim, its output in the control directory's workload.log; the
hook runs on the host with the default settings (store /var/lib/criu-gpushare/store), as a node
would have it. tests/hook/test_runc_hook.py runs the same path on the fake driver in CI.

A failure prints what explains it: the hook's lines of CRIU's dump.log and restore.log, the
container's threads and their states (T: stopped), and the workload's log.
"""
from __future__ import annotations

import glob
import json
import os
import shutil
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "criu"))  # runcbox

from probe_harness import record  # noqa: E402

RUNC = shutil.which("runc")
HOOK = shutil.which("criu-gpushare-hook")


class Channel:
    """bench/workloads/wlcommon.py's file channel, from the host side."""

    def __init__(self, directory):
        self.dir, self.seq = Path(directory), 0

    def ready(self, timeout=150):
        deadline = time.monotonic() + timeout
        while not (self.dir / "ready").exists():
            assert time.monotonic() < deadline, "the container's workload did not get ready"
            time.sleep(0.1)
        return json.loads((self.dir / "ready").read_text())

    def log(self, lines=40):
        try:
            return "\n".join((self.dir / "workload.log").read_text(errors="replace").splitlines()[-lines:])
        except OSError as e:
            return f"(no workload.log: {e.strerror})"

    def ask(self, cmd, timeout=300):
        n, self.seq = self.seq, self.seq + 1
        (self.dir / f"cmd-{n}.tmp").write_text(cmd)
        os.rename(self.dir / f"cmd-{n}.tmp", self.dir / f"cmd-{n}")
        reply = self.dir / f"reply-{n}"
        deadline = time.monotonic() + timeout
        while not reply.exists():
            assert time.monotonic() < deadline, f"no answer to {cmd!r} within {timeout} s"
            time.sleep(0.05)
        answer = json.loads(reply.read_text())
        reply.unlink()
        assert "error" not in answer, answer
        return answer


@pytest.fixture
def gpu_container(tmp_path, criu_bin, torch_available):
    if RUNC is None:
        pytest.skip("runc is not installed (carry Debian's runc deb in .criu-debs/)")
    if HOOK is None:
        pytest.skip("criu-gpushare-hook is not on PATH (package not installed)")
    from runcbox import Container, cgroup2_view
    from criu_gpushare.shimctl.shimlib import shim_path

    conf = tmp_path / "runc.conf"
    conf.write_text((REPO / "hooks" / "runc.conf").read_text()
                    .replace("/usr/local/bin/criu-gpushare-hook", HOOK))
    box = Container(tmp_path, str(conf), prefix=cgroup2_view() or [])
    ctl = tmp_path / "ctl"
    ctl.mkdir()
    env = [f"{k}={v}" for k, v in os.environ.items()
           if k in ("PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "HOME")]
    env += ["NCCL_NVLS_ENABLE=0", "TORCH_SYMM_MEM_DISABLE_MULTICAST=1", "NVSHMEM_DISABLE_NVLS=1",
            f"LD_PRELOAD={shim_path()}"]
    # its output into the control directory (a file there is dumped like any other)
    args = ["sh", "-c", f'exec "$0" "$@" >> {ctl}/workload.log 2>&1', sys.executable,
            REPO / "bench" / "workloads" / "blocks.py", "--gib", "2", "--ctl", ctl]
    config = box.configure(args, env, binds=[REPO] + [d for d in ("/opt",) if os.path.isdir(d)],
                           rw_binds=[ctl])
    devices = sorted(p for p in glob.glob("/dev/nvidia*") if not os.path.isdir(p))
    devices += sorted(glob.glob("/dev/nvidia-caps/*"))
    for dev in devices:
        config["mounts"].append({"destination": dev, "type": "bind", "source": dev,
                                 "options": ["bind", "rw"]})
    config["linux"].setdefault("resources", {})["devices"] = [{"allow": True, "access": "rwm"}]
    (box.bundle / "config.json").write_text(json.dumps(config))
    started = box.runc("run", "--detach", box.id, check=False)
    if started.returncode != 0:
        box.remove()
        pytest.skip(f"runc cannot start a container on this machine: {started.stderr.strip()[-500:]}")
    try:
        yield box, Channel(ctl)
    finally:
        box.remove()


def test_runc_checkpoint_and_restore_of_a_cuda_container(gpu_container, tmp_path):
    box, channel = gpu_container
    info = channel.ready()
    before = channel.ask("check")["sha"]
    images = str(tmp_path / "images")

    def why():
        return f"{box.explain(images)}\nworkload.log:\n{channel.log()}"

    for cycle in range(2):
        t0 = time.monotonic()
        result = box.runc("checkpoint", "--image-path", images, box.id, check=False)
        assert result.returncode == 0, f"runc checkpoint: {result.stderr}\n{why()}"
        out_s = time.monotonic() - t0
        t0 = time.monotonic()
        result = box.runc("restore", "--detach", "--image-path", images, box.id, check=False)
        assert result.returncode == 0, f"runc restore: {result.stderr}\n{why()}"
        assert box.pid(), f"the container does not run after the restore\n{why()}"
        try:
            sha = channel.ask("check", timeout=60)["sha"]
        except AssertionError as e:
            raise AssertionError(f"cycle {cycle + 1}: {e}\n{why()}") from None
        assert sha == before, f"GPU contents differ after the restore\n{why()}"
        stopped = {tid: s for tid, s in box.tasks().items() if s in "Tt"}
        assert not stopped, f"threads left stopped after the restore: {stopped}\n{why()}"
        record("runc_cuda_container", cycle=cycle + 1, out_s=round(out_s, 2),
               back_s=round(time.monotonic() - t0, 2), gib=info["bytes"] / 2 ** 30)
        shutil.rmtree(images, ignore_errors=True)
