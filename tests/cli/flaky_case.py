"""A test that fails on its second run, for tests/cli/test_gpu_tests_script.py (GPU_REPEAT):
collected only when named on the command line (its file name is not test_*.py)."""
import os


def test_fails_on_the_second_run():
    count = os.environ["FLAKY_CASE_COUNT"]  # a file counting the runs
    runs = int(open(count).read() or 0) + 1 if os.path.exists(count) else 1
    with open(count, "w") as f:
        f.write(str(runs))
    assert runs != 2, "the second run fails"
