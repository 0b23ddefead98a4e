"""Loads check every chunk against its name; where the device can hash, it does, and the host
does not hash again (fake driver, a CPU stand-in for the kernel)."""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def test_a_device_checked_load_is_intact_and_refuses_a_damaged_chunk(fake_env, tmp_path):
    r = subprocess.run([sys.executable, os.path.join(HERE, "verified_load.py"), str(tmp_path / "s")],
                       env=fake_env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["intact"] and out["host_hashed"] is False
    # one group of three allocations: two damaged chunks read again (checked), one zeroed again
    assert out["reloaded"] == {"intact": True, "all_damaged": True, "reread_checked": 2}, out
    assert "is corrupted" in out["damaged"] and out["victim"] in out["damaged"], out
