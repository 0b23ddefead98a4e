"""Native build only: compiles the LD_PRELOAD shim (shim/src/*.c) into criu_gpushare/libcriu_gpushare.so.

The shim is plain C, not a Python extension. It is compiled against the CUDA 13 `cuda.h` found in
this order, and never linked against libcuda (it finds the driver at run time):
  1. $CUDA_HOME/include
  2. /usr/local/cuda/include
  3. the `nvidia-cuda-runtime` wheel (a build requirement: nvidia/cu13/include)
Anything else is a fatal error that says what to set.
"""
import glob
import hashlib
import os
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

SHIM_NAME = "criu_gpushare.libcriu_gpushare"
CFLAGS = ["-std=gnu11", "-O2", "-fPIC", "-Wall", "-Wextra", "-Werror", "-fvisibility=hidden",
          "-D_GNU_SOURCE"]
MIN_CUDA_VERSION = 13000


def cuda_header_dirs():
    """Candidate include dirs, in the documented order."""
    if os.environ.get("CUDA_HOME"):
        yield "CUDA_HOME", os.path.join(os.environ["CUDA_HOME"], "include")
    yield "/usr/local/cuda", "/usr/local/cuda/include"
    try:
        import nvidia  # namespace package of the nvidia-* wheels
        for root in nvidia.__path__:
            yield "nvidia-cuda-runtime wheel", os.path.join(root, "cu13", "include")
    except ImportError:
        pass


def cuda_version(include_dir):
    with open(os.path.join(include_dir, "cuda.h")) as f:
        for line in f:
            if line.startswith("#define CUDA_VERSION "):
                return int(line.split()[2])
    return 0


def find_cuda_include():
    seen = []
    for origin, d in cuda_header_dirs():
        if not os.path.isfile(os.path.join(d, "cuda.h")):
            continue
        v = cuda_version(d)
        if v >= MIN_CUDA_VERSION:
            return d
        seen.append(f"{d} (CUDA_VERSION {v})")
    sys.exit("criu-gpushare: no CUDA 13 cuda.h found. Looked in $CUDA_HOME/include, "
             "/usr/local/cuda/include and the nvidia-cuda-runtime wheel"
             + (f"; too old: {', '.join(seen)}" if seen else "")
             + ". Set CUDA_HOME to a CUDA 13 toolkit or `pip install nvidia-cuda-runtime`.")


PTX_SOURCE = "criu_gpushare/gpu/xxh3.cu"
PTX_FILE = "criu_gpushare/gpu/xxh3.ptx"


def ptx_is_stale(ptx_path=PTX_FILE, source=PTX_SOURCE):
    """Whether the PTX's recorded hashes (scripts/build-ptx.sh writes them) are not those of the
    .cu and of the fatbin beside it."""
    def sha256(path):
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    try:
        with open(ptx_path) as f:
            f.readline()
            head = [f.readline().strip() for _ in range(2)]
        return head != [f"// source-sha256: {sha256(source)}",
                        f"// fatbin-sha256: {sha256(ptx_path[:-len('.ptx')] + '.fatbin')}"]
    except FileNotFoundError:
        return True


def build_ptx(out_path):
    """The GPU hashing kernel's PTX, by scripts/build-ptx.sh. Only when the committed PTX is older
    than xxh3.cu, or CRIU_GPUSHARE_BUILD_PTX=1: otherwise the committed PTX (the one tested on a
    GPU) ships as it is. Without nvcc, a stale PTX is a warning: the tool then hashes on the CPU
    only if the kernel fails its self-test, so rebuild it where a toolkit is installed."""
    if os.environ.get("CRIU_GPUSHARE_BUILD_PTX") != "1" and not ptx_is_stale():
        return
    r = subprocess.run(["scripts/build-ptx.sh", out_path], capture_output=True, text=True)
    if r.returncode != 0:
        print(f"criu-gpushare: warning: {PTX_FILE} not rebuilt: {r.stderr.strip()}", file=sys.stderr)


class BuildShim(build_ext):
    """Builds the shim as a plain shared library named libcriu_gpushare.so, and the PTX of the
    GPU hashing kernel when it needs rebuilding (build_ptx)."""

    def run(self):
        super().run()
        build_ptx(PTX_FILE if self.inplace else os.path.join(self.build_lib, PTX_FILE))

    def get_ext_filename(self, ext_name):
        # Called with the full dotted name or with its last part only (setuptools does both).
        if SHIM_NAME == ext_name or SHIM_NAME.endswith("." + ext_name):
            return os.path.join(*ext_name.split(".")) + ".so"
        return super().get_ext_filename(ext_name)

    def get_export_symbols(self, ext):
        return ext.export_symbols  # not a Python module: no PyInit_ symbol

    def get_libraries(self, ext):
        return ext.libraries  # never libpython: the shim is preloaded into any program

    def build_extension(self, ext):
        ext.include_dirs.append(find_cuda_include())
        super().build_extension(ext)


def shim_extension():
    return Extension(
        SHIM_NAME,
        sources=sorted(glob.glob("shim/src/*.c")),
        include_dirs=["shim/include"],
        depends=sorted(glob.glob("shim/include/*.h") + glob.glob("shim/src/*.h")),
        extra_compile_args=CFLAGS,
        extra_link_args=["-Wl,--no-undefined", "-Wl,-z,defs"],
        libraries=["dl", "pthread"],
    )


if __name__ == "__main__":  # setuptools runs this file as __main__; tests import it for its helpers
    # criu-gpushare-hook is a shell launcher (it answers the actions we ignore without Python)
    setup(ext_modules=[shim_extension()], cmdclass={"build_ext": BuildShim},
          scripts=["hooks/criu-gpushare-hook"])
