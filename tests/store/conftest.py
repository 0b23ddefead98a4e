"""Fixtures for the chunk-store tests: a fresh store in a temp dir."""
import pytest

from criu_gpushare.store import Store


@pytest.fixture
def store_dir(tmp_path):
    d = tmp_path / "store"
    return str(d)


@pytest.fixture
def store(store_dir):
    s = Store.open(store_dir, create=True)
    yield s
    s.close()
