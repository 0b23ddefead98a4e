"""criu_gpushare.criu.libdir: a plugin directory that CRIU reads without NVIDIA's CUDA plugin."""
from __future__ import annotations

import os
import shutil
import stat

from criu_gpushare.criu import libdir, rpc
from criutest import shared_library, sleeper


def plugin_dir(tmp_path, names, markers=None):
    """A stand-in for /usr/lib/criu. With markers (a directory), each plugin is a library that
    writes markers/<name> when CRIU loads it (CRIU loads any *.so, descriptor or not)."""
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    for name in names:
        if markers is None:
            (plugins / name).write_bytes(b"")
            continue
        marker = markers / name
        shared_library(plugins, name, "#include <stdio.h>\n"
                       "__attribute__((constructor)) static void loaded(void) {\n"
                       f'  FILE *f = fopen("{marker}", "w"); if (f) fclose(f);\n}}\n')
    return plugins


def test_without_a_cuda_plugin_nothing_changes(tmp_path):
    plugins = plugin_dir(tmp_path, ["amdgpu_plugin.so"])
    assert libdir.plugin_dir_without_cuda(str(plugins)) is None
    assert libdir.installed_cuda_plugin(str(plugins)) is None


def test_every_plugin_but_the_cuda_one_is_linked(tmp_path):
    plugins = plugin_dir(tmp_path, ["cuda_plugin.so", "amdgpu_plugin.so", "inotify_plugin.so",
                                    "README"])
    private = libdir.plugin_dir_without_cuda(str(plugins))
    try:
        assert sorted(os.listdir(private)) == ["amdgpu_plugin.so", "inotify_plugin.so"]
        assert os.readlink(os.path.join(private, "amdgpu_plugin.so")) == str(plugins / "amdgpu_plugin.so")
        assert stat.S_IMODE(os.stat(private).st_mode) == 0o700
    finally:
        shutil.rmtree(private)  # as a caller does: the links go, their targets stay
    assert os.path.exists(plugins / "amdgpu_plugin.so")


def test_the_installed_cuda_plugin_is_found_where_criu_looks(tmp_path, monkeypatch):
    plugins = plugin_dir(tmp_path, ["cuda_plugin.so"])
    monkeypatch.setenv("CRIU_LIBS_DIR", str(plugins))
    assert libdir.criu_libdir() == str(plugins)
    assert libdir.installed_cuda_plugin() == str(plugins / "cuda_plugin.so")
    monkeypatch.delenv("CRIU_LIBS_DIR")
    assert libdir.criu_libdir() == "/usr/lib/criu"


def test_criu_loads_every_plugin_but_the_cuda_one(criu, tmp_path, processes):
    markers = tmp_path / "loaded"
    markers.mkdir()
    plugins = plugin_dir(tmp_path, ["cuda_plugin.so", "other_plugin.so"], markers)
    proc = sleeper(tmp_path, processes)
    (tmp_path / "all").mkdir()
    rpc.dump(str(tmp_path / "all"), proc.pid, rpc.CriuOptions(leave_running=True, libdir=str(plugins)))
    assert sorted(os.listdir(markers)) == ["cuda_plugin.so", "other_plugin.so"]  # libdir reached CRIU

    for marker in os.listdir(markers):
        os.unlink(markers / marker)
    private = libdir.plugin_dir_without_cuda(str(plugins))
    (tmp_path / "without").mkdir()
    try:
        rpc.dump(str(tmp_path / "without"), proc.pid, rpc.CriuOptions(leave_running=True, libdir=private))
    finally:
        shutil.rmtree(private)
    assert os.listdir(markers) == ["other_plugin.so"]
