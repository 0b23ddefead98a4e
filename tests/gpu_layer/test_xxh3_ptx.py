"""The committed PTX (criu_gpushare/gpu/xxh3.ptx) is the one scripts/build-ptx.sh makes of xxh3.cu.

The tool loads the PTX (no toolkit where it runs), so a .cu edited without regenerating the PTX
would run the old kernel: the PTX's header records the SHA-256 of its source. Where nvcc is
installed, the .cu must also build for sm_90 and the committed PTX must assemble for it.
"""
import hashlib
import os
import re
import shutil
import subprocess

import pytest

from criu_gpushare.gpu import fingerprint

GPU_DIR = os.path.dirname(fingerprint.PTX_PATH)
SOURCE = os.path.join(GPU_DIR, "xxh3.cu")


def nvcc():
    for candidate in (shutil.which("nvcc"), os.path.join(os.environ.get("CUDA_HOME", "/nonexistent"), "bin", "nvcc"),
                      "/usr/local/cuda/bin/nvcc"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def test_committed_ptx_comes_from_the_current_source():
    with open(SOURCE, "rb") as f:
        want = hashlib.sha256(f.read()).hexdigest()
    with open(fingerprint.PTX_PATH) as f:
        head = [f.readline() for _ in range(2)]
    match = re.match(r"// source-sha256: ([0-9a-f]{64})$", head[1].strip())
    assert match, f"{fingerprint.PTX_PATH}: no source-sha256 line; regenerate with scripts/build-ptx.sh"
    assert match.group(1) == want, "xxh3.cu changed since xxh3.ptx was made: run scripts/build-ptx.sh"


def test_ptx_declares_the_kernel_for_sm_90():
    text = fingerprint.load_ptx().decode()
    assert text.endswith("\0")
    assert re.search(r"^\.target sm_90\b", text, re.M)
    params = re.search(r"\.visible \.entry " + fingerprint.KERNEL.decode() + r"\(([^)]*)\)", text)
    assert params and params.group(1).count(".param .u64") == 4
    assert f".maxntid {fingerprint.THREADS}" in text


@pytest.mark.skipif(nvcc() is None, reason="nvcc is not installed here")
def test_source_builds_and_ptx_assembles_for_sm_90(tmp_path):
    subprocess.run([nvcc(), "-arch=sm_90", "-cubin", "-o", str(tmp_path / "xxh3.cubin"), SOURCE],
                   check=True, capture_output=True, timeout=120)
    ptxas = os.path.join(os.path.dirname(nvcc()), "ptxas")
    subprocess.run([ptxas, "-arch=sm_90", "-o", str(tmp_path / "ptx.cubin"), fingerprint.PTX_PATH],
                   check=True, capture_output=True, timeout=120)
