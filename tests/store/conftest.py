"""Fixtures for the chunk-store tests: a fresh store and node cache in a temp dir."""
import pytest

from criu_gpushare.store import NodeCache, Store


@pytest.fixture
def store_dir(tmp_path):
    d = tmp_path / "store"
    return str(d)


@pytest.fixture
def store(store_dir):
    s = Store.open(store_dir, create=True)
    yield s
    s.close()


@pytest.fixture
def cache(tmp_path):
    c = NodeCache.open(str(tmp_path / "cache"))
    yield c
    c.close()
