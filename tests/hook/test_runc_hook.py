"""`runc checkpoint` / `runc restore` of a container whose process has GPU memory under the shim,
through hooks/runc.conf (criu-gpushare-hook as CRIU's action script, link-remap), on the fake
driver: the path a node's containers take (hooks/README.md, "Configuration"), without a GPU.

The container is tests/criu/runcbox.py's (its own pid and mount namespaces, the host's network
namespace) plus the repository and its venv (the workload, the shim, the fake driver) read-only and
a control directory read-write (the workload's socket, the fake driver's state), each at its host
path. The workload is the container's init, as a single-process GPU container's is. runc runs with
the tool's settings in its environment (state dir, store): runc passes its environment on to CRIU
and CRIU to the hook, as it passes a node's /etc/criu-gpushare/config.toml path.

cgroups: runc has CRIU freeze the container's cgroup. With cgroup v2 (CI's hosts) that works with
the stopped processes the hook hands over; on a hybrid host (v1 controllers, cgroup2 at
/sys/fs/cgroup/unified) runc runs with the v2 hierarchy in its place (runcbox.cgroup2_view). On
cgroup v1 CRIU would hang on them, and the hook refuses (the second test, on v1 hosts only).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO = os.path.dirname(TESTS)
sys.path.insert(0, os.path.join(TESTS, "criu"))
sys.path.insert(0, os.path.join(TESTS, "shim"))

from criutest import dies  # noqa: E402
from criuwork import LC_WORKLOAD, Client, values, write  # noqa: E402
from runcbox import RUNC, Container, cgroup2_view  # noqa: E402
from shimtest import REAL_DRIVER  # noqa: E402

# The workload is the fake driver's (its state file crosses into the container); on the GPU,
# tests/gpu/test_runc_gpu.py runs a torch container through the same route.
pytestmark = pytest.mark.skipif(REAL_DRIVER, reason="fake driver only: on the GPU, "
                                "tests/gpu/test_runc_gpu.py covers runc")

HOOK = shutil.which("criu-gpushare-hook")
MIB = 1 << 20


def python_home():
    """The venv's base Python where it is not under /usr (pyenv's, a GPU machine's /opt)."""
    home = os.path.realpath(sys.base_prefix)
    return [] if home == "/usr" or home.startswith("/usr/") else [home]


def cli(env, *args):
    return subprocess.run([sys.executable, "-m", "criu_gpushare.cli", *map(str, args)], env=env,
                          capture_output=True, text=True, timeout=60)


def gpu_container(env, tmp_path, prefix):
    """A started container whose init is a socket-served workload under the shim: (box, client)."""
    conf = tmp_path / "runc.conf"
    conf.write_text(open(os.path.join(REPO, "hooks", "runc.conf")).read()
                    .replace("/usr/local/bin/criu-gpushare-hook", HOOK))
    ctl = tmp_path / "ctl"
    ctl.mkdir()
    fake_state = env["app"]["FAKECUDA_STATE"]  # the fake driver's shared state: the hook's and the workload's
    box = Container(tmp_path, str(conf), env=env["tool"], prefix=prefix)
    app = env["app"]
    box.configure([sys.executable, LC_WORKLOAD, "--socket", ctl / "w.sock"],
                  [f"{k}={app[k]}" for k in ("PATH", "LD_LIBRARY_PATH", "LD_PRELOAD", "FAKECUDA_STATE",
                                             "NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST",
                                             "NVSHMEM_DISABLE_NVLS") if k in app],
                  binds=[REPO, *python_home()], rw_binds=[ctl, fake_state])
    started = box.runc("run", "--detach", box.id, check=False)
    if started.returncode != 0:
        box.remove()
        pytest.skip(f"runc cannot start a container here (cgroups?): {started.stderr.strip()[-500:]}")
    client = Client(ctl / "w.sock", box.pid())
    try:
        client.wait_ready()
    except AssertionError:
        box.remove()
        raise
    return box, client


def needs_runc():
    if RUNC is None:
        pytest.skip("runc is not installed (Debian: apt-get install runc)")
    if HOOK is None:
        pytest.skip("criu-gpushare-hook is not on PATH (package not installed)")


@pytest.fixture
def cuda_box(env, tmp_path, criu):
    needs_runc()
    view = cgroup2_view()
    if view is None:
        pytest.skip("no cgroup v2 hierarchy on this host: runc's checkpoint of a GPU container needs "
                    "one (the hook refuses on cgroup v1: the other test)")
    box, client = gpu_container(env, tmp_path, view)
    try:
        yield box, client
    finally:
        box.remove()


def test_runc_checkpoint_and_restore_of_a_container_with_gpu_memory(cuda_box, env, tmp_path):
    box, w = cuda_box
    w.do(f"malloc buf {4 * MIB}")
    w.do(f"cumem vmm {4 * MIB}")
    write(w, "buf", 42)
    write(w, "vmm", 7)
    images = tmp_path / "images"
    for cycle in range(2):
        try:
            cycle_through_runc(box, w, env, images, cycle)
        except (AssertionError, OSError) as e:  # a restored workload that does not answer: why
            raise AssertionError(f"cycle {cycle + 1}: {e!r}\n{box.explain(images)}") from e
        shutil.rmtree(images)


def cycle_through_runc(box, w, env, images, cycle):
    """One `runc checkpoint` and `runc restore`; the memory holds what cycle - 1 left."""
    pid = box.pid()
    box.runc("checkpoint", "--image-path", str(images), box.id)
    assert dies(pid) and box.pid() is None
    box.runc("restore", "--detach", "--image-path", str(images), box.id)
    w.pid = box.pid()
    assert w.pid, "the container does not run after the restore"
    w.wait_ready(timeout=20)
    assert values(w, "buf") == [42 + cycle] * 4, "GPU memory lost"
    assert values(w, "vmm") == [7 + cycle] * 4, "GPU memory lost"
    stopped = {tid: s for tid, s in box.tasks().items() if s in "Tt"}
    assert not stopped, f"threads left stopped after the restore: {stopped}"
    status = cli(env["tool"], "status", w.pid, "--json")
    assert status.returncode == 0, status.stderr
    st = json.loads(status.stdout)
    assert st.get("state") == "running" and not st.get("stopped"), st
    assert sum(a["size"] for a in st["allocations"]) >= 8 * MIB, st
    assert not [n for n in os.listdir(env["run"]) if n.startswith(("journal-", "restore-"))]
    write(w, "buf", 43 + cycle)  # the restored process computes on its memory
    write(w, "vmm", 8 + cycle)


def test_runc_checkpoint_on_a_cgroup_v1_freezer_is_refused_before_anything_changes(env, tmp_path, criu):
    """On a cgroup v1 host runc lets CRIU freeze the container's v1 freezer cgroup, and CRIU then
    hangs for good on a stopped process (the dump hands checkpointed processes over stopped): the
    hook refuses at pre-dump instead, and the container runs on with its GPU memory."""
    needs_runc()
    if cgroup2_view() == [] or not os.path.isdir("/sys/fs/cgroup/freezer"):
        pytest.skip("not a cgroup v1 host: runc uses cgroup v2 here (the other test covers it)")
    box, w = gpu_container(env, tmp_path, [])
    try:
        w.do(f"malloc buf {4 * MIB}")
        write(w, "buf", 42)
        images = tmp_path / "images"
        r = box.runc("checkpoint", "--image-path", str(images), box.id, check=False)
        assert r.returncode != 0
        log = (images / "dump.log").read_text()
        assert "is in the cgroup v1 freezer cgroup" in log and "cgroup v2 host" in log, box.explain(images)
        assert box.pid() == w.pid and values(w, "buf") == [42] * 4
        write(w, "buf", 43)
        assert values(w, "buf") == [43] * 4
    finally:
        box.remove()
