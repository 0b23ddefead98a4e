"""A test that never ends, for tests/cli/test_gpu_tests_script.py: collected only when named on the
command line (its file name is not test_*.py)."""
import time


def test_waits_forever():
    while True:
        time.sleep(1)  # the line the stack dump must name
