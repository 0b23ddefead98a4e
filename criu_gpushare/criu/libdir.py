"""A CRIU plugin directory without NVIDIA's cuda_plugin.so.

CRIU 4.x loads every *.so in its plugin directory (-L / `libdir`, else $CRIU_LIBS_DIR, else
/usr/lib/criu). Its CUDA plugin records itself in the image inventory even for tasks it skips, and
on restore then restores and unlocks CHECKPOINTED tasks itself: for our tasks that is the tool's
job, in its order. Pointing CRIU at a directory holding every other plugin keeps the rest working.
A restore enables the CUDA plugin only for an image whose inventory names it (images.py:
inventory_plugins), so the directory matters for dumps above all; an image that names it cannot be
restored without it ("Missing required plugin").
"""
from __future__ import annotations

import os
import tempfile

CRIU_DEFAULT_LIBDIR = "/usr/lib/criu"  # compiled into CRIU (criu/include/plugin.h)
CUDA_PLUGIN = "cuda_plugin.so"


def criu_libdir() -> str:
    """The plugin directory CRIU uses when not told one: $CRIU_LIBS_DIR, else its default."""
    return os.environ.get("CRIU_LIBS_DIR") or CRIU_DEFAULT_LIBDIR


def installed_cuda_plugin(libdir: str | None = None) -> str | None:
    """The path of the CUDA plugin CRIU would load from libdir (default: criu_libdir()), or None."""
    path = os.path.join(libdir or criu_libdir(), CUDA_PLUGIN)
    return path if os.path.exists(path) else None


def plugin_dir_without_cuda(default_dir: str | None = None) -> str | None:
    """A new private temporary directory with a symlink to each plugin of default_dir (default:
    criu_libdir()) but the CUDA one, to pass as CriuOptions.libdir; the caller removes it
    (shutil.rmtree) when CRIU is done. None when default_dir has no CUDA plugin: then CRIU's own
    choice is already right and nothing needs changing."""
    default_dir = os.path.abspath(default_dir or criu_libdir())
    if installed_cuda_plugin(default_dir) is None:
        return None
    private = tempfile.mkdtemp(prefix="criu-gpushare-plugins-")  # mode 0700
    for name in sorted(os.listdir(default_dir)):
        if name.endswith(".so") and name != CUDA_PLUGIN:  # CRIU loads *.so only
            os.symlink(os.path.join(default_dir, name), os.path.join(private, name))
    return private
