"""Helpers for the CRIU tests: processes CRIU can dump as they are, and probes of their state."""
from __future__ import annotations

import os
import subprocess
import sys
import time


def start_daemon(tmp_path, code: str, processes: list) -> subprocess.Popen:
    """A Python process running code, as CRIU dumps without --shell-job: a session leader with
    stdio on /dev/null. It is our child, so a test reaps it once CRIU has killed it, freeing its
    pid for the restore. Added to processes, which the `processes` fixture kills at the end."""
    ready = tmp_path / f"ready-{len(processes)}"
    proc = subprocess.Popen([sys.executable, "-c", f"open({str(ready)!r}, 'w').close()\n{code}"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    processes.append(proc.pid)
    for _ in range(200):
        if ready.exists():
            return proc
        time.sleep(0.05)
    raise AssertionError("the daemon did not start")


def sleeper(tmp_path, processes: list) -> subprocess.Popen:
    return start_daemon(tmp_path, "import time\nwhile True: time.sleep(0.05)", processes)


def counter(tmp_path, processes: list):
    """A daemon that appends a line to a file every 20 ms, so a test can see it run; returns
    (process, file)."""
    ticks = tmp_path / "ticks"
    code = (f"import time\nwhile True:\n    with open({str(ticks)!r}, 'a') as f: f.write('.')\n"
            "    time.sleep(0.02)")
    return start_daemon(tmp_path, code, processes), ticks


def runs(ticks, within_s: float = 5.0) -> bool:
    """Whether the counter writing ticks makes progress."""
    before = ticks.stat().st_size
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        time.sleep(0.05)
        if ticks.stat().st_size > before:
            return True
    return False


def state(pid: int) -> str | None:
    """The process's state letter (R, S, t, Z, ...), None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return None


def alive(pid: int) -> bool:
    """Running or sleeping: neither gone nor a zombie."""
    return state(pid) not in (None, "Z")


def dies(pid: int, within_s: float = 5.0) -> bool:
    """Whether pid is gone (or a zombie) within the time: a SIGKILL takes effect asynchronously."""
    deadline = time.monotonic() + within_s
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def status_field(pid: int, name: str) -> str:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key == name:
                return value.strip()
    raise KeyError(name)


def children_named(name: str) -> list[int]:
    """Pids of this process's children whose command is name (e.g. criu left behind)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if status_field(int(entry), "PPid") == str(os.getpid()):
                with open(f"/proc/{entry}/comm") as f:
                    if f.read().strip() == name:
                        found.append(int(entry))
        except (FileNotFoundError, ProcessLookupError, KeyError):
            continue
    return found


def shared_library(tmp_path, name: str, source: str) -> str:
    """A shared library built with gcc from C source, at tmp_path/name."""
    src, lib = tmp_path / f"{name}.c", tmp_path / name
    src.write_text(source)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    return str(lib)
