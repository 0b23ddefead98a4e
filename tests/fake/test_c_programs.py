"""C programs built against cuda.h and linked with -lcuda run on the fake (as the shim's tests do)."""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from fakecuda.build import find_cuda_include

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is not installed")
@pytest.mark.parametrize("defines", [[], ["-DCUDA_API_PER_THREAD_DEFAULT_STREAM"]], ids=["legacy", "ptds"])
def test_direct_link_against_the_fake(fake_env, fake_driver_dir, tmp_path, defines):
    exe = tmp_path / "direct_link"
    subprocess.run(["gcc", "-Wall", "-Werror", *defines, "-I", find_cuda_include(),
                    os.path.join(HERE, "c", "direct_link.c"), "-L", fake_driver_dir, "-lcuda", "-o", str(exe)],
                   check=True)
    proc = subprocess.run([str(exe)], env=fake_env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0 and proc.stdout.strip() == "PASS", proc.stdout + proc.stderr
