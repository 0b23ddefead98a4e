"""Summarise a GPU test run: one line per probe row (PASS/FAIL/SKIP/NOT RUN) and its figures.

    python3 tests/gpu/summarize.py --junit OUT/junit.xml --figures OUT/probe-figures.txt

The rows are the test functions of tests/gpu/test_*.py, in file order, named by the first line of
their docstring; outcomes come from pytest's JUnit XML, figures from the `PROBE <name> test=<test>
k=v ...` lines that probe_harness.record() appended to the figures file. Either input may be
missing or cut short (pytest killed by a timeout): the summary says so and prints what there is.
Exit status 0 when every row passed or skipped, 1 otherwise.
"""
from __future__ import annotations

import argparse
import ast
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

GPU_DIR = Path(__file__).resolve().parent


def rows(tests_dir=GPU_DIR):
    """[(test name, first docstring line)] of every test function, in file order."""
    found = []
    for path in sorted(Path(tests_dir).glob("test_*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                doc = (ast.get_docstring(node) or "").strip().splitlines()
                found.append((node.name, doc[0] if doc else ""))
    return found


def outcomes(junit_path):
    """{test name: (PASS|FAIL|SKIP, message)}; (None, why) when the XML is missing or unreadable."""
    try:
        tree = ET.parse(junit_path)
    except (OSError, ET.ParseError) as e:
        return None, f"no usable JUnit XML ({junit_path}): {e}"
    found = {}
    for case in tree.iter("testcase"):
        name = case.get("name", "?").split("[")[0]
        outcome, message = "PASS", ""
        for child in case:
            if child.tag in ("failure", "error"):
                outcome, message = "FAIL", child.get("message") or (child.text or "")
                break
            if child.tag == "skipped":
                outcome, message = "SKIP", child.get("message") or ""
        found[name] = (outcome, " ".join(message.split())[:300])
    return found, None


def figures(figures_path):
    """{test name: ["name k=v ...", ...]} from the PROBE lines of the figures file."""
    found = {}
    try:
        lines = Path(figures_path).read_text(errors="replace").splitlines()
    except OSError:
        return found
    for line in lines:
        parts = line.split()
        if len(parts) < 2 or parts[0] != "PROBE":
            continue
        test = next((p[5:] for p in parts[2:] if p.startswith("test=")), "-")
        rest = [p for p in parts[2:] if not p.startswith("test=")]
        found.setdefault(test, []).append(" ".join([parts[1]] + rest))
    return found


def summary(junit_path, figures_path, tests_dir=GPU_DIR, subset=False):
    """The summary text and whether every row passed or skipped (or, for a run of a chosen subset
    of the tests, was not run)."""
    results, problem = outcomes(junit_path)
    figs = figures(figures_path)
    lines = ["== criu-gpushare GPU probes: summary =="]
    if problem:
        lines.append(f"!! {problem}; outcomes unknown, figures below are what was recorded")
    results = results or {}
    counts = {}
    known = rows(tests_dir)
    for name, title in known + [(n, "") for n in results if n not in dict(known)]:
        outcome, message = results.get(name, ("NOT RUN", ""))
        counts[outcome] = counts.get(outcome, 0) + 1
        lines.append(f"{outcome:<7} {name}" + (f"  -- {title}" if title else ""))
        if message:
            lines.append(f"        {message}")
        for figure in figs.pop(name, []):
            lines.append(f"        PROBE {figure}")
    for name, extra in figs.items():  # figures of tests that are not rows (should not happen)
        lines.extend(f"        PROBE {figure} (from {name})" for figure in extra)
    lines.append("totals: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())))
    ok = not problem and all(k in ("PASS", "SKIP") + (("NOT RUN",) if subset else ()) for k in counts)
    return "\n".join(lines), ok


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--junit", required=True)
    parser.add_argument("--figures", required=True)
    parser.add_argument("--tests-dir", default=str(GPU_DIR))
    parser.add_argument("--subset", action="store_true",
                        help="the run chose some of the tests (GPU_TESTS, GPU_PARTS): rows not run are no failure")
    args = parser.parse_args()
    text, ok = summary(args.junit, args.figures, args.tests_dir, args.subset)
    print(text)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
