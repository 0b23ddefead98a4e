"""What another local user (uid 1001) costs a root workload under the shim, on the fake driver:

  status time, alone and while she holds 64 idle connections to the workload's socket;
  cuMemImportFromShareableHandle of an fd no shim exported, alone and while she squats 20
  @criu-gpushare.<pid> names with full listen backlogs.

    python tests/shim/measure_strangers.py [SHIM.so]     (root; default: the installed shim)
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]

from fakecuda.build import build_fake_driver  # noqa: E402
from shimtest import Workload, fd_pass  # noqa: E402
from stranger import stranger_cmd  # noqa: E402

from criu_gpushare.shimctl import client as control  # noqa: E402


def start_stranger(*args):
    p = subprocess.Popen(stranger_cmd(*args), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True)
    assert json.loads(p.stdout.readline())["ready"]
    return p


def stop(p):
    p.stdin.close()
    p.wait(30)


def timed(fn):
    t0 = time.monotonic()
    fn()
    return time.monotonic() - t0


def import_time(exporter, importer, tmp, tag):
    exporter.do(f"cumem {tag} 4194304")
    got = fd_pass(exporter, importer, tag, tmp)
    return timed(lambda: importer.do(f"import {tag} {got} 4194304", timeout=120))


def main():
    from criu_gpushare.shimctl.shimlib import shim_path
    shim = sys.argv[1] if len(sys.argv) > 1 else shim_path()
    tmp = tempfile.mkdtemp()
    os.chmod(tmp, 0o755)
    base = dict(os.environ, LD_LIBRARY_PATH=build_fake_driver(), FAKECUDA_STATE=tmp,
                NCCL_NVLS_ENABLE="0")
    root = Workload(dict(base, LD_PRELOAD=shim))
    plain = Workload(base)  # an exporter without the shim: nobody claims its fds
    try:
        control.status(root.pid)
        alone = min(timed(lambda: control.status(root.pid)) for _ in range(5))
        s = start_stranger("idle", str(root.pid), "64")
        busy = timed(lambda: control.status(root.pid, timeout=60))
        stop(s)
        imp_alone = import_time(plain, root, tmp, "a")
        s = start_stranger("squat", "20")
        imp_squat = import_time(plain, root, tmp, "b")
        stop(s)
    finally:
        root.close()
        plain.close()
    print(f"shim {shim}")
    print(f"status alone                                 {alone * 1000:9.1f} ms")
    print(f"status with 64 idle connections of uid 1001  {busy * 1000:9.1f} ms")
    print(f"import of an unclaimed fd                    {imp_alone * 1000:9.1f} ms")
    print(f"same with 20 squatted names, full backlogs   {imp_squat * 1000:9.1f} ms")


if __name__ == "__main__":
    main()
