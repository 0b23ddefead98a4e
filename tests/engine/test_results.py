"""What a run reports: the final line a command prints, and phases that add up to the steps."""
from criu_gpushare.engine import results


def test_the_summary_line():
    summary = {"state": "suspended", "pids": [1, 2], "seconds": {"quiesce": 0.1, "save": 1.25},
               "bytes": {"copied": 3 * 2**30, "written": 2**20, "deduplicated": 0, "zero": 0,
                         "unchanged": 2**21}}
    assert results.format_summary(summary) == (
        "suspended 2 process(es): quiesce 0.10s, save 1.25s; 3.00 GiB copied, 1.00 MiB written, "
        "0 B deduplicated, 0 B zero, 2.00 MiB skipped as unchanged")
    assert "loaded" in results.format_summary(dict(summary, state="resumed"))


def test_the_summary_line_of_a_run_that_moved_nothing_says_why():
    summary = {"state": "resumed", "pids": [7], "seconds": {}, "bytes": {}, "note": "nothing had been changed"}
    assert results.format_summary(summary) == "resumed 1 process(es): nothing had been changed"


def test_phases_take_a_steps_timed_parts_out_of_it_and_leave_the_total_out():
    times = {"quiesce": 0.5, "save": 2.0, "total": 9.0}
    parts = {"save": {"store commit (sync, manifest, ref)": 0.75}}
    assert results.phases(times, parts) == {"quiesce": 0.5, "save": 1.25,
                                            "store commit (sync, manifest, ref)": 0.75}
