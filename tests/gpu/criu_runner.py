"""Running `criu dump` / `criu restore` from a GPU test: bounded, logged, with the probe tag set."""
from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

CRIU_TIMEOUT_S = 180


@dataclass
class CriuResult:
    returncode: int
    secs: float
    log: str      # CRIU's own log (-o), at -v4
    output: str   # its stdout + stderr
    began: float = 0.0  # the boot clock when CRIU was started (what the hook's lines are told against)

    def tail(self, lines=25):
        return "\n".join((self.output + self.log).splitlines()[-lines:])


def run_criu(criu, action, image_dir: Path, args, env, timeout=CRIU_TIMEOUT_S):
    """`criu ACTION -D image_dir -o ACTION.log -v4 ARGS...`; kills CRIU if it overruns."""
    log_path = image_dir / f"{action}.log"
    argv = [criu, action, "-D", str(image_dir), "-o", log_path.name, "-v4", *map(str, args)]
    start, began = time.monotonic(), time.clock_gettime(time.CLOCK_BOOTTIME)
    try:
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
        returncode, output = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as e:
        partial = "".join(x.decode(errors="replace") if isinstance(x, bytes) else x
                          for x in (e.stdout, e.stderr) if x)
        returncode, output = -9, f"criu {action} killed after {timeout} s\n{partial}"
    secs = time.monotonic() - start
    log = log_path.read_text(errors="replace") if log_path.exists() else ""
    return CriuResult(returncode, round(secs, 3), log, output, began)
