"""Build the fake CUDA driver (``libcuda.so.1``) from ``tests/fakecuda/*.c``.

The output is cached under ``tests/fakecuda/.build/<hash>/`` keyed by a hash of the sources and the
compiler command, so a test session pays for gcc only when the C changed. Several pytest processes
may build at once: each compiles into a private temporary file and renames it into place.
"""
from __future__ import annotations

import glob
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD_ROOT = os.path.join(HERE, ".build")
CFLAGS = ["-std=gnu11", "-O1", "-g", "-Wall", "-Wextra", "-Werror", "-fPIC", "-shared", "-pthread"]


class FakeDriverBuildError(RuntimeError):
    """gcc is missing, no cuda.h was found, or the sources do not compile."""


def find_cuda_include() -> str:
    """Return a directory holding cuda.h: $CUDA_HOME, /usr/local/cuda, then the nvidia wheel."""
    candidates = []
    if os.environ.get("CUDA_HOME"):
        candidates.append(os.path.join(os.environ["CUDA_HOME"], "include"))
    candidates.append("/usr/local/cuda/include")
    for entry in sys.path:
        candidates.append(os.path.join(entry, "nvidia", "cu13", "include"))
        candidates.append(os.path.join(entry, "nvidia", "cuda_runtime", "include"))
    for path in candidates:
        if os.path.isfile(os.path.join(path, "cuda.h")):
            return path
    raise FakeDriverBuildError("cuda.h not found; looked in: " + ", ".join(candidates[:4]) + ", ...")


def _sources() -> list[str]:
    return sorted(glob.glob(os.path.join(HERE, "*.c")) + glob.glob(os.path.join(HERE, "*.h")))


def _prune_old_builds(keep: str, max_age_s: float = 86400) -> None:
    """Remove builds of older sources unused for a day (a running session may still use newer ones)."""
    now = time.time()
    for entry in os.scandir(BUILD_ROOT):
        if entry.is_dir() and entry.path != keep and now - entry.stat().st_mtime > max_age_s:
            shutil.rmtree(entry.path, ignore_errors=True)


def build_fake_driver() -> str:
    """Compile the fake driver if needed; return the directory that holds ``libcuda.so.1``."""
    gcc = shutil.which(os.environ.get("CC", "gcc"))
    if gcc is None:
        raise FakeDriverBuildError("no C compiler: install gcc or set $CC")
    include = find_cuda_include()
    digest = hashlib.sha256()
    digest.update(" ".join(CFLAGS + [gcc, include]).encode())
    for path in _sources():
        digest.update(os.path.basename(path).encode())
        with open(path, "rb") as f:
            digest.update(f.read())
    out_dir = os.path.join(BUILD_ROOT, digest.hexdigest()[:16])
    target = os.path.join(out_dir, "libcuda.so.1")
    if os.path.exists(target):
        return out_dir
    os.makedirs(out_dir, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".libcuda.", dir=out_dir)
    os.close(fd)
    c_files = [p for p in _sources() if p.endswith(".c")]
    cmd = [gcc, *CFLAGS, "-I", include, "-I", HERE, "-Wl,-soname,libcuda.so.1", "-o", tmp, *c_files, "-ldl"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        os.unlink(tmp)
        raise FakeDriverBuildError("building the fake driver failed:\n" + " ".join(cmd) + "\n" + proc.stderr)
    os.chmod(tmp, 0o755)
    os.replace(tmp, target)
    _prune_old_builds(keep=out_dir)
    # libcuda.so for programs that link with -lcuda at build time.
    link = os.path.join(out_dir, "libcuda.so")
    if not os.path.lexists(link):
        try:
            os.symlink("libcuda.so.1", link)
        except FileExistsError:
            pass
    return out_dir


if __name__ == "__main__":
    print(build_fake_driver())
