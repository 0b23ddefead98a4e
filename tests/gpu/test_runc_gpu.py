"""`runc checkpoint` / `runc restore` of a container that runs a CUDA process on the GPU, through
hooks/runc.conf (criu-gpushare-hook and link-remap), its GPU contents intact after.

The container is tests/criu/test_runc.py's (the host's /usr and /etc read-only, the host's network
namespace, its own pid and mount namespaces) plus what a GPU container has: the NVIDIA device nodes
bind-mounted and allowed, the driver's libraries (under the host's /usr), /opt (where the GPU
machine's Python lives), the repository (the workload and the shim) and a control directory. The
workload is bench/workloads/blocks.py under the shim; the hook runs on the host with the default
settings (store /var/lib/criu-gpushare/store), as a node would have it.
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
sys.path.insert(0, str(REPO / "tests" / "criu"))

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
    from test_runc import Container
    from criu_gpushare.shimctl.shimlib import shim_path

    conf = tmp_path / "runc.conf"
    conf.write_text((REPO / "hooks" / "runc.conf").read_text()
                    .replace("/usr/local/bin/criu-gpushare-hook", HOOK))
    box = Container(tmp_path, str(conf))
    ctl = tmp_path / "ctl"
    ctl.mkdir()
    config = json.loads((box.bundle / "config.json").read_text())
    rootfs = box.bundle / "rootfs"
    binds = [str(REPO), str(ctl)] + [d for d in ("/opt",) if os.path.isdir(d)]
    for path in binds:
        (rootfs / path.lstrip("/")).mkdir(parents=True, exist_ok=True)
        config["mounts"].append({"destination": path, "type": "bind", "source": path,
                                 "options": ["rbind", "rw" if path == str(ctl) else "ro"]})
    devices = sorted(p for p in glob.glob("/dev/nvidia*") if not os.path.isdir(p))
    devices += sorted(glob.glob("/dev/nvidia-caps/*"))
    for dev in devices:
        config["mounts"].append({"destination": dev, "type": "bind", "source": dev,
                                 "options": ["bind", "rw"]})
    config["linux"].setdefault("resources", {})["devices"] = [{"allow": True, "access": "rwm"}]
    env = [f"{k}={v}" for k, v in os.environ.items()
           if k in ("PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "HOME")]
    env += ["NCCL_NVLS_ENABLE=0", "TORCH_SYMM_MEM_DISABLE_MULTICAST=1", "NVSHMEM_DISABLE_NVLS=1",
            f"LD_PRELOAD={shim_path()}"]
    config["process"]["env"] = env
    config["process"]["args"] = [sys.executable, str(REPO / "bench" / "workloads" / "blocks.py"),
                                 "--gib", "2", "--ctl", str(ctl)]
    (box.bundle / "config.json").write_text(json.dumps(config))
    started = box.runc("run", "--detach", box.id, check=False)
    if started.returncode != 0:
        box.remove()
        pytest.skip(f"runc cannot start a container on this machine: {started.stderr.strip()[-500:]}")
    try:
        yield box, Channel(ctl)
    finally:
        box.remove()


def _criu_log(images, name, lines=60):
    """The end of CRIU's log (the hook's lines are in it), for the failure message."""
    try:
        with open(os.path.join(images, name), errors="replace") as f:
            return "\n".join(f.read().splitlines()[-lines:])
    except OSError as e:
        return f"(no {name}: {e.strerror})"


def test_runc_checkpoint_and_restore_of_a_cuda_container(gpu_container, tmp_path):
    box, channel = gpu_container
    info = channel.ready()
    before = channel.ask("check")["sha"]
    images = str(tmp_path / "images")
    for cycle in range(2):
        t0 = time.monotonic()
        result = box.runc("checkpoint", "--image-path", images, box.id, check=False)
        assert result.returncode == 0, f"runc checkpoint: {result.stderr}\n{_criu_log(images, 'dump.log')}"
        out_s = time.monotonic() - t0
        t0 = time.monotonic()
        result = box.runc("restore", "--detach", "--image-path", images, box.id, check=False)
        assert result.returncode == 0, f"runc restore: {result.stderr}\n{_criu_log(images, 'restore.log')}"
        pid = box.pid()
        assert pid, "the container does not run after the restore"
        assert channel.ask("check")["sha"] == before, "GPU contents differ after the restore"
        record("runc_cuda_container", cycle=cycle + 1, out_s=round(out_s, 2),
               back_s=round(time.monotonic() - t0, 2), gib=info["bytes"] / 2 ** 30)
        shutil.rmtree(images, ignore_errors=True)
