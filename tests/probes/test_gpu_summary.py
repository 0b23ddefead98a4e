"""tests/gpu/summarize.py: the summary scripts/gpu-tests.sh prints after a GPU run (CPU-only test)."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

SUMMARIZE = Path(__file__).resolve().parents[1] / "gpu" / "summarize.py"

TESTS = '''
def test_alpha():
    """Alpha row: works."""

def test_beta():
    """Beta row."""

def test_gamma():
    """Gamma row."""

def test_delta():
    """Delta row, never reached."""

def helper():
    pass
'''

JUNIT = '''<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest">
<testcase classname="tests.gpu.test_x" name="test_alpha" time="1.0"/>
<testcase classname="tests.gpu.test_x" name="test_beta" time="2.0">
  <failure message="AssertionError: importer restore: CUDA_ERROR_UNKNOWN">trace</failure></testcase>
<testcase classname="tests.gpu.test_x" name="test_gamma" time="0.0">
  <skipped type="pytest.skip" message="CRIU &gt;= 4 absent: no `criu` on PATH">skip</skipped></testcase>
</testsuite></testsuites>
'''

FIGURES = """PROBE pinned_copy test=test_alpha h2d_gbps=55.1 d2h_gbps=54.9
PROBE ckpt test=test_beta restore=CUDA_ERROR_UNKNOWN
not a probe line
"""


def summarize(tmp_path, junit=JUNIT, figures=FIGURES, *extra):
    (tmp_path / "test_x.py").write_text(TESTS)
    junit_path, figures_path = tmp_path / "junit.xml", tmp_path / "figures.txt"
    if junit is not None:
        junit_path.write_text(junit)
    figures_path.write_text(figures)
    return subprocess.run([sys.executable, str(SUMMARIZE), "--junit", str(junit_path), "--figures",
                           str(figures_path), "--tests-dir", str(tmp_path), *extra],
                          capture_output=True, text=True, timeout=60)


def test_every_row_gets_its_outcome_reason_and_figures(tmp_path):
    proc = summarize(tmp_path)
    lines = proc.stdout.splitlines()
    assert proc.returncode == 1, "a failed row must fail the summary"
    row = {re.search(r"\btest_\w+", line).group(0): i for i, line in enumerate(lines)
           if line[:1].isalpha() and " test_" in line}
    assert lines[row["test_alpha"]].startswith("PASS") and "Alpha row: works." in lines[row["test_alpha"]]
    assert lines[row["test_alpha"] + 1].strip() == "PROBE pinned_copy h2d_gbps=55.1 d2h_gbps=54.9"
    assert lines[row["test_beta"]].startswith("FAIL")
    assert "CUDA_ERROR_UNKNOWN" in lines[row["test_beta"] + 1]
    assert lines[row["test_gamma"]].startswith("SKIP")
    assert "CRIU >= 4 absent" in lines[row["test_gamma"] + 1]
    assert lines[row["test_delta"]].startswith("NOT RUN")
    assert list(row) == ["test_alpha", "test_beta", "test_gamma", "test_delta"], "file order"
    assert "helper" not in proc.stdout


def test_all_passed_or_skipped_is_success(tmp_path):
    junit = JUNIT.replace('<failure message="AssertionError: importer restore: CUDA_ERROR_UNKNOWN">'
                          'trace</failure>', "")
    junit = junit.replace("</testsuite>", '<testcase name="test_delta"/></testsuite>')
    proc = summarize(tmp_path, junit=junit)
    assert proc.returncode == 0, proc.stdout
    assert "totals: 3 PASS, 1 SKIP" in proc.stdout


def test_rows_not_run_fail_a_whole_run_but_not_a_chosen_subset(tmp_path):
    junit = JUNIT.replace('<failure message="AssertionError: importer restore: CUDA_ERROR_UNKNOWN">'
                          'trace</failure>', "")
    assert "test_delta" not in junit
    whole = summarize(tmp_path, junit)
    assert whole.returncode == 1 and "NOT RUN test_delta" in whole.stdout
    subset = summarize(tmp_path, junit, FIGURES, "--subset")
    assert subset.returncode == 0, subset.stdout
    assert "NOT RUN test_delta" in subset.stdout


def test_missing_junit_still_prints_the_figures(tmp_path):
    proc = summarize(tmp_path, junit=None)
    assert proc.returncode == 1
    assert "no usable JUnit XML" in proc.stdout
    assert "PROBE pinned_copy h2d_gbps=55.1" in proc.stdout
    assert sum(line.startswith("NOT RUN test_") for line in proc.stdout.splitlines()) == 4


def test_cut_short_junit_is_reported_not_a_crash(tmp_path):
    proc = summarize(tmp_path, junit=JUNIT[:200])
    assert proc.returncode == 1
    assert "no usable JUnit XML" in proc.stdout and "Traceback" not in proc.stderr
