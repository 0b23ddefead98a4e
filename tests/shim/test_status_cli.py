"""`criu-gpushare status [PID] [--json]` on running workloads (fake driver)."""
from __future__ import annotations

import json
import subprocess
import time

from click.testing import CliRunner

from criu_gpushare.cli import main


def run(*args):
    return CliRunner().invoke(main, ["status", *map(str, args)])


def test_status_shows_allocations_imports_and_gates(workload):
    exporter, importer = workload(), workload()
    exporter.do("malloc buf 4194304")
    handle = exporter.do("ipcget buf")["handle"]
    importer.do(f"ipcopen buf {handle} 4194304")

    res = run(exporter.pid)
    assert res.exit_code == 0, res.output
    assert "allocations: 1" in res.output and "cuMemAlloc" in res.output
    assert "launch gate: open" in res.output

    res = run(importer.pid)
    assert f"cuda-ipc from pid {exporter.pid} allocation #1" in res.output

    res = run(importer.pid, "--json")
    st = json.loads(res.output)
    assert st["imports"][0]["exporter"]["pid"] == exporter.pid


def test_status_without_pid_lists_every_shim_process(workload):
    a, b = workload(), workload()
    a.do("malloc buf 4194304")
    res = run()
    assert res.exit_code == 0, res.output
    lines = {int(line.split()[0]): line for line in res.output.splitlines() if line.strip()}
    assert a.pid in lines and b.pid in lines
    assert "1 alloc" in lines[a.pid]
    assert json.loads(run("--json").output)[str(b.pid)]["ok"]


def test_status_errors_have_their_exit_codes():
    p = subprocess.Popen(["sleep", "30"])
    try:
        res = run(p.pid)
        assert res.exit_code == 8  # ShimError
        assert f"process {p.pid} has no control socket" in res.output
    finally:
        p.kill()
        p.wait()
    res = run(p.pid)
    assert res.exit_code == 5  # ProcessError
    assert f"process {p.pid}: no such process" in res.output


def test_status_lists_the_reachable_and_names_the_unreachable(workload, fake_server):
    """A full backlog and a server that never answers: rc 0, each named with why, the shim listed,
    in about one listing timeout however many there are."""
    from criu_gpushare.cli import status as status_cli

    w = workload()
    squat, mute = fake_server("squat"), fake_server("mute")
    t0 = time.monotonic()
    res = run()
    took = time.monotonic() - t0
    assert res.exit_code == 0, res.output
    lines = {int(line.split()[0]): line for line in res.output.splitlines()
             if line.strip() and line.split()[0].isdigit()}
    assert "alloc" in lines[w.pid]
    assert "listen backlog" in lines[squat] and "stayed full" in lines[squat]
    assert "no reply to 'status'" in lines[mute]
    assert took < status_cli.LIST_TIMEOUT_S + 10, took
