"""Where the shim library is, and what it says it is."""
import os
import subprocess
import sys

from ..errors import ShimError

SHIM_FILENAME = "libcriu_gpushare.so"

# Run in a throwaway process with the shim preloaded, as a workload would run: this proves the shim
# loads by LD_PRELOAD, and its constructors never run inside the tool itself.
_VERSION_PROBE = """
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL | 0x4)  # RTLD_NOLOAD: it is preloaded
lib.criu_gpushare_shim_version.restype = ctypes.c_char_p
print(lib.criu_gpushare_shim_version().decode(), lib.criu_gpushare_shim_protocol())
"""


def shim_path():
    """Absolute path of the shim built into this package."""
    package_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # setup.py puts it there
    path = os.path.join(package_dir, SHIM_FILENAME)
    if not os.path.isfile(path):
        raise ShimError(f"{path} is missing: the package was installed without its native build "
                        "(reinstall with `pip install .` on a machine with gcc)")
    return path


def shim_version(path=None, timeout=30):
    """(version string, protocol number) reported by the shim preloaded into a child process."""
    path = path or shim_path()
    env = dict(os.environ, LD_PRELOAD=path)
    try:
        r = subprocess.run([sys.executable, "-c", _VERSION_PROBE, path], env=env,
                           capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise ShimError(f"a process with {path} preloaded did not finish in {timeout}s") from e
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["no output"])[-1]
        raise ShimError(f"{path} does not load when preloaded: {last}")
    version, protocol = r.stdout.split()
    return version, int(protocol)
