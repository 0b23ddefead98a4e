"""Fixtures for the tests of criu_gpushare.criu: CRIU >= 4 with pycriu, and processes to dump."""
from __future__ import annotations

import os
import signal

import pytest

from criu_gpushare.criu import _pycriu
from criu_gpushare.errors import CriuError


@pytest.fixture(scope="session")
def criu(criu) -> str:
    """tests/conftest.py's criu, with pycriu importable too (skipped, with the reason, if not)."""
    try:
        _pycriu.load("rpc_pb2")
    except CriuError as e:
        pytest.skip(str(e))
    return criu


@pytest.fixture(scope="session")
def pycriu_messages():
    """pycriu, for the tests that talk RPC to a stand-in for CRIU (no real CRIU needed)."""
    try:
        return _pycriu.load("rpc_pb2")
    except CriuError as e:
        pytest.skip(str(e))


@pytest.fixture
def processes():
    """Pids a test started (criutest.start_daemon) or restored: killed and reaped at the end."""
    pids = []
    yield pids
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
