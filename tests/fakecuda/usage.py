"""Read the fake driver's per-process device memory usage files, as nvidia-smi would show them.

Each process that called cuInit keeps ``$FAKECUDA_STATE/usage/<pid>`` with one ``<device> <bytes>``
line per device: the device memory it owns now (allocations it made; imports are the exporter's).
A checkpointed process owns none.
"""
from __future__ import annotations

import os


def read_usage(state_dir: str, include_dead: bool = False) -> dict[int, dict[int, int]]:
    """Return {pid: {device: bytes}} for the processes of this state directory (live ones only)."""
    usage_dir = os.path.join(state_dir, "usage")
    result: dict[int, dict[int, int]] = {}
    try:
        names = os.listdir(usage_dir)
    except FileNotFoundError:
        return result
    for name in names:
        if not name.isdigit():
            continue
        pid = int(name)
        if not include_dead and not os.path.exists(f"/proc/{pid}"):
            continue
        try:
            with open(os.path.join(usage_dir, name)) as f:
                lines = f.read().split("\n")
        except FileNotFoundError:
            continue
        per_device = {}
        for line in lines:
            if line.strip():
                dev, used = line.split()
                per_device[int(dev)] = int(used)
        result[pid] = per_device
    return result


def process_usage(state_dir: str, pid: int) -> int:
    """Bytes of device memory (all devices) that pid owns now; 0 if it has no usage file."""
    return sum(read_usage(state_dir, include_dead=True).get(pid, {}).values())


if __name__ == "__main__":
    import sys

    if len(sys.argv) != 2:
        sys.exit("usage: usage.py FAKECUDA_STATE_DIR")
    for pid, devices in sorted(read_usage(sys.argv[1]).items()):
        print(pid, " ".join(f"dev{dev}={used >> 20}MiB" for dev, used in sorted(devices.items())))
