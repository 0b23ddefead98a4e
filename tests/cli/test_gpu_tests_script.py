"""scripts/gpu-tests.sh never stops a test without saying which one and where it was, and never
runs its tests beside another run's processes on the GPU."""
import os
import signal
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _one_passing_test(out, count):
    """The script run with one test that passes (its first run), no install."""
    env = dict(os.environ, OUT=str(out), GPU_TESTS_INSTALL="0", GPU_PARTS="gpu",
               GPU_TESTS="tests/cli/flaky_case.py", PYTEST_TIMEOUT_S="60", FLAKY_CASE_COUNT=str(count))
    return subprocess.run(["scripts/gpu-tests.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=240)


def test_a_pytest_run_past_its_timeout_names_the_test_and_its_line(tmp_path):
    out = tmp_path / "out"
    env = dict(os.environ, OUT=str(out), GPU_TESTS_INSTALL="0", GPU_PARTS="gpu",
               GPU_TESTS="tests/cli/hang_case.py", PYTEST_TIMEOUT_S="15")
    r = subprocess.run(["scripts/gpu-tests.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=240)
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
    log = (out / "gpu-tests.log").read_text()
    assert ("pytest tests/cli/hang_case.py stopped by the 15 s timeout (PYTEST_TIMEOUT_S) in "
            "tests/cli/hang_case.py::test_waits_forever") in log, log[-3000:]
    assert 'hang_case.py", line 8 in test_waits_forever' in log, log[-3000:]  # where it was
    assert "pytest tests/cli/hang_case.py: FAILED (exit 124)" in (out / "steps.txt").read_text()


def test_gpu_repeat_runs_the_tests_again_until_a_run_fails(tmp_path):
    """GPU_REPEAT=N looks for a rare failure in one call: it stops at the first failing run, and
    that run's junit.xml and step line are what the summary reads."""
    out, count = tmp_path / "out", tmp_path / "count"
    env = dict(os.environ, OUT=str(out), GPU_TESTS_INSTALL="0", GPU_PARTS="gpu", GPU_REPEAT="5",
               GPU_TESTS="tests/cli/flaky_case.py", PYTEST_TIMEOUT_S="60", FLAKY_CASE_COUNT=str(count))
    r = subprocess.run(["scripts/gpu-tests.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=240)
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
    assert count.read_text() == "2", "it went on after the failing run"
    log = (out / "gpu-tests.log").read_text()
    assert "run 2 of 5" in log and "run 3 of 5" not in log and "the second run fails" in log, log[-3000:]
    steps = (out / "steps.txt").read_text()
    assert "pytest tests/cli/flaky_case.py: ok" in steps and "pytest tests/cli/flaky_case.py: FAILED" in steps
    assert 'failures="1"' in (out / "junit.xml").read_text()


def test_the_benches_tables_come_back_first_beside_the_summary(tmp_path):
    """A machine that brings back only the first few files of OUT, in name order, brings the
    summary and the tables the benches wrote (here one a bench left, as a stopped run leaves it)."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "bench-checkpoint.txt").write_text("single tool tmpfs 40.00 2.30 ...\n")
    r = _one_passing_test(out, tmp_path / "count")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    first = sorted(os.listdir(out))[:3]
    assert first == ["0-bench-checkpoint.txt", "0-summary.txt", "bench-checkpoint.txt"], first
    assert (out / "0-bench-checkpoint.txt").read_text() == "single tool tmpfs 40.00 2.30 ...\n"


def test_gpu_require_stops_before_anything_on_another_card(tmp_path):
    """GPU_REQUIRE=H200 on a machine that lent an H100: nothing installed or run, exit 3, and the
    summary (the first file back) says which card it found."""
    out, bin_dir = tmp_path / "out", tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'NVIDIA H100 80GB HBM3'\n")
    smi.chmod(0o755)
    env = dict(os.environ, OUT=str(out), GPU_REQUIRE="H200", PATH=f"{bin_dir}:{os.environ['PATH']}")
    r = subprocess.run(["scripts/gpu-tests.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 3, r.stdout[-3000:] + r.stderr[-3000:]
    assert os.listdir(out) == ["0-summary.txt"]
    assert (out / "0-summary.txt").read_text() == (
        "gpu-tests: GPU_REQUIRE=H200, and this machine's GPU is NVIDIA H100 80GB HBM3: nothing run\n")
    smi.write_text("#!/bin/sh\necho 'NVIDIA H200'\n")  # the card asked for: the run goes on
    env.update(GPU_TESTS_INSTALL="0", GPU_PARTS="gpu", GPU_TESTS="tests/cli/flaky_case.py",
               PYTEST_TIMEOUT_S="60", FLAKY_CASE_COUNT=str(tmp_path / "count"))
    r = subprocess.run(["scripts/gpu-tests.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=240)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "pytest tests/cli/flaky_case.py: ok" in (out / "steps.txt").read_text()


def _leftover(run):
    """A process as an earlier run's test leaves it: its own session, the run's variable inherited."""
    env = dict(os.environ, GPUSHARE_PROBE_RUN=run)
    return subprocess.Popen(["sleep", "300"], env=env, start_new_session=True)


def test_a_run_kills_what_an_earlier_stopped_run_left_and_says_so(tmp_path):
    """A run stopped before its cleanup (its script's pid gone) left a process: the next run kills
    it before it starts anything and names it in its steps."""
    dead = subprocess.Popen(["true"])
    dead.wait()  # a pid that no longer runs gpu-tests.sh
    left = _leftover(f"gpu-tests-{dead.pid}-1")
    try:
        out = tmp_path / "out"
        r = _one_passing_test(out, tmp_path / "count")
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        assert left.wait(timeout=10) == -9  # SIGKILL
        steps = (out / "steps.txt").read_text()
        assert f"processes left by earlier runs: killed {left.pid}\n" in steps, steps
    finally:
        left.kill()
        left.wait()


def test_a_run_refuses_to_start_beside_a_run_still_going(tmp_path):
    """Another run's script is alive: nothing is run or killed, exit 3, and the summary says why."""
    owner = subprocess.Popen(["bash", "-c", "sleep 300; true", "gpu-tests.sh"], start_new_session=True)
    left = _leftover(f"gpu-tests-{owner.pid}-1")
    try:
        out = tmp_path / "out"
        r = _one_passing_test(out, tmp_path / "count")
        assert r.returncode == 3, r.stdout[-3000:] + r.stderr[-3000:]
        assert left.poll() is None and owner.poll() is None  # theirs, untouched
        summary = (out / "0-summary.txt").read_text()
        assert f"another run (gpu-tests-{owner.pid}-1, pid {owner.pid}) is still going" in summary, summary
        assert not (tmp_path / "count").exists()  # no test ran
    finally:
        for p in (left, owner):
            os.killpg(p.pid, signal.SIGKILL)  # the owner's sleep with it
            p.wait()
