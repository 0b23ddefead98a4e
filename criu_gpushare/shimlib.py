"""Where the shim library is, and what it says it is."""
import ctypes
import os

from .errors import ShimError

SHIM_FILENAME = "libcriu_gpushare.so"


def shim_path():
    """Absolute path of the shim built into this package."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), SHIM_FILENAME)
    if not os.path.isfile(path):
        raise ShimError(f"{path} is missing: the package was installed without its native build "
                        "(reinstall with `pip install .` on a machine with gcc)")
    return path


def shim_version(path=None):
    """(version string, protocol number) as reported by the shim library itself.

    Loading it with RTLD_LOCAL in this process is harmless: its interposed driver functions only
    take effect when it is preloaded.
    """
    path = path or shim_path()
    try:
        lib = ctypes.CDLL(path, mode=os.RTLD_LOCAL | os.RTLD_LAZY)
    except OSError as e:
        raise ShimError(f"cannot load {path}: {e}") from e
    lib.criu_gpushare_shim_version.restype = ctypes.c_char_p
    return lib.criu_gpushare_shim_version().decode(), lib.criu_gpushare_shim_protocol()
