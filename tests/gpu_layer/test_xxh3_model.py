"""The model of the GPU kernel (xxh3_model.py) gives, bit for bit, what the store names chunks by.

It runs the kernel's split of the work (tiles, warps, threads, shuffle tree, chain, tail) in
Python, so an error in that split shows here, on any machine, before the kernel ever runs.
"""
import random

import pytest

from criu_gpushare.store.layout import chunk_id

import xxh3_model

# Every short-path boundary, the block (1024) and tile (64 blocks) boundaries around them, and
# lengths that end mid-word and mid-stripe.
LENGTHS = sorted({*range(0, 260), 1023, 1024, 1025, 1087, 1088, 1089, 2047, 2048, 2049, 3000,
                  64 * 1024 - 1, 64 * 1024, 64 * 1024 + 1, 65 * 1024 + 7, 128 * 1024 + 1000})


@pytest.mark.parametrize("n", LENGTHS)
def test_random_bytes(n):
    data = random.Random(n).randbytes(n)
    assert xxh3_model.hexdigest(data) == chunk_id(data)


@pytest.mark.parametrize("n", [1, 16, 17, 128, 129, 240, 241, 1024, 1025, 65 * 1024])
def test_zero_and_all_ones(n):
    for byte in (0, 0xFF):
        data = bytes([byte]) * n
        assert xxh3_model.hexdigest(data) == chunk_id(data)
