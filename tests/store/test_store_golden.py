"""The golden stores in store/golden (written by an earlier version) still read the same."""
import os
import shutil

import pytest

from criu_gpushare.errors import StoreError
from criu_gpushare.store import ChunkRef, Store, verify_store

GOLDEN = os.path.join(os.path.dirname(__file__), "..", "..", "store", "golden")
CHUNK_A = b"criu-gpushare golden chunk A\n" * 100
CHUNK_B = b"criu-gpushare golden chunk B: the last chunk of an allocation is short\n"
ID_A, ID_B = "dbd43c2ca6eb651c745971af03ce2ac5", "3e42c4df350df96c473cc9d6fd716025"


def golden_copy(name, tmp_path):
    dst = tmp_path / name
    shutil.copytree(os.path.join(GOLDEN, name), dst)
    for root, dirs, files in os.walk(dst):  # as a fresh checkout under any umask would not be
        os.chmod(root, 0o755)
        for f in files:
            os.chmod(os.path.join(root, f), 0o644)
    return str(dst)


def test_v1_basic_reads_back_byte_for_byte(tmp_path):
    with Store.open(golden_copy("v1-basic", tmp_path)) as st:
        assert st.list_refs() == ["golden-1"]
        ref = st.read_ref("golden-1")
        assert ref.meta == {"note": "two allocations sharing chunk A, one zero chunk"}
        m = st.read_manifest(ref.manifest)
        (proc,) = m.processes
        assert (proc.pid, proc.meta, m.created) == (4242, {"comm": "golden"},
                                                    "2026-12-02T00:00:00Z")
        first, second = proc.allocations
        assert (first.key, first.size, first.meta) == ("0x7f0000000000", 2900 + 4096 + 71,
                                                       {"device": 0})
        assert first.chunks == [ChunkRef(ID_A, 2900), ChunkRef(None, 4096), ChunkRef(ID_B, 71)]
        assert (second.key, second.chunks) == ("0x7f0000200000", [ChunkRef(ID_A, 2900)])
        for cid, expected in ((ID_A, CHUNK_A), (ID_B, CHUNK_B)):
            out = bytearray(len(expected))
            st.get(cid, out, verify=True)
            assert out == expected
        assert verify_store(st, all_chunks=True).problems == []


def test_v1_future_manifest_is_refused_naming_file_and_versions(tmp_path):
    with Store.open(golden_copy("v1-future-manifest", tmp_path)) as st:
        mid = st.read_ref("golden-1").manifest
        with pytest.raises(StoreError, match=f"manifests/{mid}.json: manifest format version 2 "
                                             f"is newer than this tool reads \\(version 1\\)"):
            st.read_manifest(mid)
