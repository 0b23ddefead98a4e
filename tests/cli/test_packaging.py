"""The package as a user installs it: the shim is built in, loads by LD_PRELOAD, needs no libcuda."""
import importlib.util
import os
import subprocess
import sys

import pytest

from criu_gpushare.shimctl.shimlib import shim_path, shim_version

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _setup_module():
    spec = importlib.util.spec_from_file_location("criu_gpushare_setup", os.path.join(ROOT, "setup.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_shim_reports_its_version_when_preloaded():
    import criu_gpushare
    version, protocol = shim_version()
    assert version == criu_gpushare.__version__
    assert protocol >= 1


def test_shim_does_not_link_libcuda_or_libpython():
    needed = subprocess.run(["readelf", "-d", shim_path()], capture_output=True, text=True, check=True).stdout
    libs = [line.split("[")[1].rstrip("]") for line in needed.splitlines() if "(NEEDED)" in line]
    assert not any(lib.startswith(("libcuda", "libpython")) for lib in libs), libs


def test_shim_path_command_prints_the_library():
    out = subprocess.run([sys.executable, "-m", "criu_gpushare.cli", "shim-path"], capture_output=True,
                         text=True, check=True).stdout.strip()
    assert out == shim_path() and os.path.isfile(out)


def _fake_cuda_home(tmp_path, name, version):
    inc = tmp_path / name / "include"
    inc.mkdir(parents=True)
    (inc / "cuda.h").write_text(f"#pragma once\n#define CUDA_VERSION {version}\n")
    return str(tmp_path / name)


def test_cuda_headers_come_from_cuda_home_first(tmp_path, monkeypatch):
    setup = _setup_module()
    monkeypatch.setenv("CUDA_HOME", _fake_cuda_home(tmp_path, "cuda13", 13020))
    assert setup.find_cuda_include() == os.path.join(str(tmp_path), "cuda13", "include")


def test_cuda_12_headers_are_skipped_for_the_next_candidate(tmp_path, monkeypatch):
    setup = _setup_module()
    monkeypatch.setenv("CUDA_HOME", _fake_cuda_home(tmp_path, "cuda12", 12080))
    found = setup.find_cuda_include()
    assert "cuda12" not in found and setup.cuda_version(found) >= 13000


def test_no_cuda_headers_is_a_clear_error(tmp_path, monkeypatch):
    setup = _setup_module()
    monkeypatch.setenv("CUDA_HOME", _fake_cuda_home(tmp_path, "cuda12", 12080))
    monkeypatch.setattr(setup, "cuda_header_dirs", lambda: iter([("CUDA_HOME", str(tmp_path / "cuda12" / "include"))]))
    with pytest.raises(SystemExit, match="no CUDA 13 cuda.h found.*CUDA_VERSION 12080"):
        setup.find_cuda_include()
