"""A process tree CRIU can dump: this parent (no CUDA) and N socket-served lifecycle workloads as
its children (tests/hook/criuwork.py). Writes the children's pids to DIR/children once they serve.

    python criutree.py N DIR [PLAIN]

PLAIN: comma-separated indices of children started without the shim (LD_PRELOAD removed).
"""
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
LC_WORKLOAD = os.path.join(os.path.dirname(HERE), "engine", "lcworkload.py")


def main():
    n, d = int(sys.argv[1]), sys.argv[2]
    plain = {int(i) for i in sys.argv[3].split(",")} if len(sys.argv) > 3 and sys.argv[3] else set()
    children = []
    for i in range(n):
        sock = os.path.join(d, f"w{i}.sock")
        env = dict(os.environ)
        if i in plain:
            env.pop("LD_PRELOAD", None)
        children.append(subprocess.Popen([sys.executable, LC_WORKLOAD, "--socket", sock],
                                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL, env=env))
    with open(os.path.join(d, "children.tmp"), "w") as f:
        json.dump([c.pid for c in children], f)
    os.rename(os.path.join(d, "children.tmp"), os.path.join(d, "children"))
    while True:  # reap whatever ends; run until killed
        try:
            os.wait()
        except ChildProcessError:
            time.sleep(0.2)


if __name__ == "__main__":
    main()
