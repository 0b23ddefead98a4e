"""The committed PTX and fatbin (criu_gpushare/gpu/xxh3.ptx, xxh3.fatbin) are the ones
scripts/build-ptx.sh makes of xxh3.cu.

The tool loads the fatbin, else the PTX (no toolkit where it runs), so a .cu edited without
regenerating them would run the old kernel: the PTX's header records the SHA-256 of its source and
of the fatbin made with it. Where nvcc is installed, the .cu must also build for sm_90 and the
committed PTX must assemble for it; where it is the nvcc that made them, the fatbin is made again
byte for byte (nvcc's output depends only on the source and its own version).
"""
import hashlib
import os
import re
import shutil
import subprocess

import pytest

from criu_gpushare.gpu import fingerprint

GPU_DIR = os.path.dirname(fingerprint.PTX_PATH)
REPO = os.path.dirname(os.path.dirname(GPU_DIR))
SOURCE = os.path.join(GPU_DIR, "xxh3.cu")


def nvcc():
    for candidate in (shutil.which("nvcc"), os.path.join(os.environ.get("CUDA_HOME", "/nonexistent"), "bin", "nvcc"),
                      "/usr/local/cuda/bin/nvcc"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def ptx_header():
    with open(fingerprint.PTX_PATH) as f:
        return [f.readline().strip() for _ in range(3)]


def test_committed_ptx_comes_from_the_current_source():
    match = re.match(r"// source-sha256: ([0-9a-f]{64})$", ptx_header()[1])
    assert match, f"{fingerprint.PTX_PATH}: no source-sha256 line; regenerate with scripts/build-ptx.sh"
    assert match.group(1) == sha256(SOURCE), "xxh3.cu changed since xxh3.ptx was made: run scripts/build-ptx.sh"


def test_committed_fatbin_was_made_with_the_ptx():
    match = re.match(r"// fatbin-sha256: ([0-9a-f]{64})$", ptx_header()[2])
    assert match, f"{fingerprint.PTX_PATH}: no fatbin-sha256 line; regenerate with scripts/build-ptx.sh"
    assert match.group(1) == sha256(fingerprint.FATBIN_PATH), \
        "xxh3.fatbin is not the one made with xxh3.ptx: run scripts/build-ptx.sh"


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


def nvcc_release(path):
    out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60).stdout
    return re.search(r"release [\d.]+, V[\d.]+", out).group(0)


@pytest.mark.skipif(nvcc() is None, reason="nvcc is not installed here")
def test_fatbin_is_made_again_byte_for_byte_by_the_same_nvcc(tmp_path):
    with open(fingerprint.PTX_PATH) as f:
        made_by = re.search(r"release [\d.]+, V[\d.]+", f.read(4000)).group(0)
    if nvcc_release(nvcc()) != made_by:
        pytest.skip(f"nvcc here is {nvcc_release(nvcc())}, the committed files were made by {made_by}")
    subprocess.run([os.path.join(REPO, "scripts", "build-ptx.sh"), str(tmp_path / "xxh3.ptx")],
                   check=True, capture_output=True, timeout=300, env=dict(os.environ, NVCC=nvcc()))
    assert sha256(tmp_path / "xxh3.fatbin") == sha256(fingerprint.FATBIN_PATH)
