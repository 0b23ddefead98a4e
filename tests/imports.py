"""What a piece of code imports, run in an interpreter of its own: the tests that keep a start
cheap (a command's, a hook action's) assert on it."""
import json
import subprocess
import sys


def modules_after(code, prefixes, env=None, timeout=60):
    """Run `code` in a new interpreter; -> (the sorted names of the modules then imported that
    start with one of `prefixes`, the run: its stdout without that last line). A failing run
    fails the test with its stderr."""
    probe = (f"{code}\nimport json as _json, sys as _sys\n"
             f"print(_json.dumps(sorted(m for m in _sys.modules if m.startswith({tuple(prefixes)!r}))))")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=timeout, env=env)
    assert r.returncode == 0, r.stderr
    *before, last = r.stdout.splitlines()
    r.stdout = "".join(line + "\n" for line in before)
    return json.loads(last), r
