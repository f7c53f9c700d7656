"""Block values: derived from the key, and every wrong byte counted."""

from __future__ import annotations

from kvstored.replay import values


def test_values_are_deterministic_and_differ_per_key():
    assert values.value("k/1", 4096) == values.value("k/1", 4096)
    assert values.value("k/1", 4096) != values.value("k/2", 4096)
    assert values.value("k/1", 100) == values.value("k/1", 4096)[:100]
    assert values.value("k/1", 0) == b""
    # every 8-byte word of a block differs: no shifted read can pass
    block = values.value("k/1", 4096)
    words = {block[i:i + 8] for i in range(0, 4096, 8)}
    assert len(words) == 512


def test_wrong_bytes_counts_flips_truncation_and_growth():
    size = 4096
    scratch = bytearray(size)
    good = bytearray(values.value("k", size))
    assert values.wrong_bytes("k", good, size, scratch) == 0
    flipped = bytearray(good)
    flipped[0] ^= 1
    flipped[4095] ^= 0x80
    assert values.wrong_bytes("k", flipped, size, scratch) == 2
    assert values.wrong_bytes("k", good[:4000], size, scratch) == 96
    assert values.wrong_bytes("k", bytes(good) + b"xy", size, scratch) == 2
    other = values.value("k2", size)
    assert values.wrong_bytes("k", other, size, scratch) > size * 0.9
