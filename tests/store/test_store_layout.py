"""Chunk naming (FORMAT.md section 3): ids are XXH3-128 as xxh128sum prints them."""
import os
import shutil
import subprocess

import pytest

from criu_gpushare.store import chunk_id
from criu_gpushare.store.layout import is_chunk_id, is_ref_name, is_temp_name, temp_name

from store_helpers import chunk_bytes, chunk_path


def test_chunk_id_known_vector():
    # XXH3-128 of "abc" from the xxHash reference implementation (xxh128sum).
    assert chunk_id(b"abc") == "06b05ab6733a618578af5f94892f3950"


def test_stored_chunk_names_check_with_xxh128sum(store):
    tool = shutil.which("xxh128sum")
    if tool is None:
        if os.environ.get("CRIU_GPUSHARE_TEST_NEED_XXH128SUM"):  # scripts/test.sh installed it
            pytest.fail("xxh128sum is missing, though scripts/test.sh installs it (apt install xxhash)")
        pytest.skip("xxh128sum not installed (Debian: apt install xxhash)")
    cids = [store.put(chunk_bytes(i, 5000 + i)).chunk_id for i in range(3)]
    for cid in cids:
        out = subprocess.run([tool, chunk_path(store, cid)], capture_output=True, text=True,
                             check=True).stdout
        assert out.split()[0] == cid


def test_temp_names_are_random_hidden_and_recognised():
    names = {temp_name("0" * 32) for _ in range(100)}
    assert len(names) == 100
    assert all(n.startswith(".") and is_temp_name(n) for n in names)
    assert not is_temp_name("0" * 32)


@pytest.mark.parametrize("name,ok", [("ckpt-1", True), ("a.b_c", True), ("x" * 200, True),
                                     ("x" * 201, False), (".hidden", False), ("-x", False),
                                     ("a/b", False), ("", False), ("..", False)])
def test_ref_names(name, ok):
    assert is_ref_name(name) is ok


def test_chunk_id_shape():
    assert is_chunk_id("0" * 32) and not is_chunk_id("0" * 31) and not is_chunk_id("A" * 32)
