"""The GPU chunk ids (criu_gpushare/gpu/fingerprint.py) are the store's, bit for bit; and fast.

Runs tests/gpu/fingerprint_check.py in a child process (pytest itself never loads the driver) and
records `PROBE fingerprint_fatbin gbps=... secs=... gib=... hasher_ms=...` and the same for
`fingerprint_ptx` (printed, and appended to $PROBE_RECORD).
Standalone: python3 -m pytest tests/gpu/test_fingerprint.py
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from probe_harness import NO_MULTICAST_ENV, record

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("source", ["fatbin", "ptx"])
def test_gpu_chunk_ids_match_xxhash_and_throughput(capsys, source):
    """GPU chunk ids equal xxhash's XXH3-128 for every length class, and 1 GiB pieces hashed at once
    (start_ids, several streams) give each piece's own ids; GB/s over 8 GiB. The kernel as
    the tool loads it (xxh3.fatbin, whose machine code an H200 runs as it is) and from the PTX (the
    fallback); the driver's JIT cache off, so that hasher_ms shows what a fresh node pays."""
    env = {**os.environ, **NO_MULTICAST_ENV, "CUDA_CACHE_DISABLE": "1"}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, str(HERE / "fingerprint_check.py"), "--gib", "8", "--from", source],
                          env=env, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["loaded_from"] == f"xxh3.{source}", out  # the driver took the fatbin
    with capsys.disabled():
        print()
        record(f"fingerprint_{source}", gib=out["gib"], chunks=out["chunks"], secs=out["secs"],
               gbps=out["gbps"], one_chunk_ms=out["one_chunk_ms"], hasher_ms=out["hasher_ms"],
               pieces=out["pieces"], pieces_at_once_ms=out["pieces_at_once_ms"],
               pieces_one_by_one_ms=out["pieces_one_by_one_ms"],
               est_40gib_s=out["est_40gib_s"],
               checked=out["checked"], mismatches=len(out["mismatches"]),
               device=out["device"].replace(" ", "_"))
    assert not out["mismatches"], "\n".join(out["mismatches"])
    assert out["checked"] > 100


@pytest.mark.timeout(300)
def test_second_save_of_unchanged_memory_copies_nothing(capsys):
    """A second save of unchanged memory copies nothing (goal: 40 GiB in <= 0.6 s on an H200).

    Measured on 8 GiB (the time scales with the size); `unchanged_save_check.py --gib 40` by hand."""
    env = {**os.environ, **NO_MULTICAST_ENV}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, str(HERE / "unchanged_save_check.py"), "--gib", "8"],
                          env=env, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    first, second, plain = out["first"], out["second"], out["second_no_gpu_hash"]
    with capsys.disabled():
        print()
        record("fingerprint_save", gib=out["gib"], first_s=first["secs"], second_s=second["secs"],
               second_no_gpu_hash_s=plain["secs"], second_copied=second["copied"],
               second_unchanged=second["unchanged"], est_40gib_s=round(second["secs"] * 40 / out["gib"], 3))
        record("verified_load", gib=out["gib"], gpu_check_s=out["load_gpu_check"]["secs"],
               host_check_s=out["load_host_check"]["secs"],
               gpu_check_gbps=round(out["gib"] * (1 << 30) / out["load_gpu_check"]["secs"] / 1e9, 1),
               host_check_gbps=round(out["gib"] * (1 << 30) / out["load_host_check"]["secs"] / 1e9, 1))
    size = int(out["gib"] * (1 << 30))
    assert out["load_gpu_check"]["intact"], "the GPU-checked load gave other bytes"
    assert out["damaged_refused"], "a damaged chunk was loaded without a word"
    assert out["same_manifest"]
    assert second["copied"] == 0 and second["unchanged"] == size and second["written"] == 0
    assert plain["copied"] == size and plain["unchanged"] == 0
