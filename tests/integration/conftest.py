"""CRIU integration tests: they need CRIU >= 4 (Debian 13's packages, or the GPU machine's debs)."""
import re
import shutil
import subprocess

import pytest


def criu_version():
    criu = shutil.which("criu")
    if not criu:
        return None, "criu is not installed (CRIU >= 4 packages exist for Debian 13, not Debian 12)"
    out = subprocess.run([criu, "--version"], capture_output=True, text=True).stdout
    m = re.search(r"Version:\s*(\d+)\.(\d+)", out)
    if not m or int(m.group(1)) < 4:
        return None, f"{criu} is not CRIU >= 4 ({out.strip() or 'no version'}); 3.x fails on recent kernels"
    check = subprocess.run([criu, "check"], capture_output=True, text=True)
    if check.returncode != 0:
        return None, f"`criu check` fails here: {(check.stdout + check.stderr).strip().splitlines()[-1:]}"
    return criu, ""


@pytest.fixture(scope="session")
def criu():
    path, why = criu_version()
    if not path:
        pytest.skip(why)
    return path
