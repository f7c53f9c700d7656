"""The deterministic value of a block: ``--block-bytes`` bytes derived from its key, so
that every byte a get returns can be checked against what the put wrote.

The value of key ``k`` is the little-endian 64-bit words ``mix((s + i) * M)`` for
``i = 0, 1, ...``, cut to the block size, where ``s`` is 64 bits of BLAKE2b of the key,
``M`` an odd constant and ``mix`` an xor-shift: every byte depends on the key and on its
position, so a value of another key, a shifted read or a torn write all differ from it
(a block of another key matches in no word position, except by a 2**-64 chance). It
costs a few numpy passes per block, far less than moving the block.

This module makes and checks values; it does not name blocks (``keys``).
"""

from __future__ import annotations

import hashlib

import numpy as np

_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)
_SHIFT = np.uint64(29)


def seed_of(key: str) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")


def fill(key: str, out: memoryview | bytearray | np.ndarray) -> None:
    """Write the value of ``key`` into ``out`` (its length is the block size)."""
    view = np.frombuffer(out, dtype=np.uint8)
    words = (len(view) + 7) // 8
    pattern = np.arange(words, dtype=np.uint64)
    pattern += np.uint64(seed_of(key))  # wraps modulo 2**64
    pattern *= _MULTIPLIER
    pattern ^= pattern >> _SHIFT
    view[:] = pattern.view(np.uint8)[:len(view)]


def value(key: str, size: int) -> bytes:
    """The value of ``key`` at ``size`` bytes (for tests and one-off checks)."""
    out = bytearray(size)
    fill(key, out)
    return bytes(out)


def wrong_bytes(key: str, got: memoryview | bytes | bytearray, size: int,
                scratch: bytearray) -> int:
    """How many bytes of ``got`` differ from the value of ``key`` at ``size`` bytes; a
    length other than ``size`` counts every missing or extra byte as wrong.
    ``scratch`` (at least ``size`` bytes) holds the expected value."""
    expected = memoryview(scratch)[:size]
    fill(key, expected)
    n = min(len(got), size)
    if len(got) == size and expected == memoryview(got).cast("B"):
        return 0
    a = np.frombuffer(got, dtype=np.uint8, count=n)
    b = np.frombuffer(expected, dtype=np.uint8, count=n)
    return int(np.count_nonzero(a != b)) + abs(len(got) - size)
