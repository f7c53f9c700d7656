"""kvstored/checksum.py and native/copy.c against the crc32c package: ``copy_crc32c``
stores exactly the source's bytes and returns their CRC-32C, and ``crc32c`` (the folding
CRC) is the package's, at every length around the folding step (256 bytes), the
three-stream blocks (256 and 8192 bytes, three of each) and the 8-byte words, from any
alignment, continuing any value."""

from __future__ import annotations

import importlib
import random

import numpy as np
import pytest
from crc32c import crc32c

from kvstored import checksum
from kvstored.client import parts

LENGTHS = sorted({0, 1, 3, 7, 8, 9, 15, 16, 63, 64, 255, 256, 257, 511, 512, 767, 768, 769,
                  1000, 4096, 24575, 24576, 24577, 3 * 8192 + 3 * 256 + 9, 100_000, 1 << 20,
                  (1 << 20) + 13})


@pytest.fixture(scope="module")
def native():
    try:
        return importlib.import_module("kvstored._copy")
    except ImportError:
        pytest.fail("kvstored._copy was not built (setup.py's COPY_EXTENSION); "
                    "same-host reads copy and then check in two passes")


@pytest.mark.parametrize("length", LENGTHS)
def test_a_copy_stores_the_bytes_and_returns_their_crc(native, length):
    rng = random.Random(length)
    data = rng.randbytes(length + 7)
    for start in (0, 1, 5):  # unaligned sources and destinations
        src = memoryview(data)[start:start + length]
        dst = bytearray(length + 11)
        value = rng.getrandbits(32)
        assert native.copy_crc32c(memoryview(dst)[start:], src, value) == crc32c(src, value)
        assert dst[start:start + length] == src
        assert dst[:start] == bytes(start)  # nothing written outside the copy
        assert dst[start + length:] == bytes(len(dst) - start - length)


@pytest.mark.parametrize("length", LENGTHS)
def test_the_folding_crc_is_the_packages(native, length):
    if native.crc32c(b"") is None:
        pytest.skip("this CPU lacks AVX-512 VPCLMULQDQ: the client uses the crc32c package")
    rng = random.Random(length)
    data = rng.randbytes(length + 3)
    for start in (0, 3):
        view = memoryview(data)[start:start + length]
        value = rng.getrandbits(32)
        assert native.crc32c(view) == crc32c(view)
        assert native.crc32c(view, value) == crc32c(view, value)


def test_a_crc_chained_over_copied_pieces_is_the_whole_objects(native):
    data = random.Random(1).randbytes(300_000)
    pieces = [np.zeros(n, dtype=np.uint8) for n in (1, 299, 70_000, 200_000, 29_700)]
    target = parts.parts_of(pieces, key="k", writable=True)
    assert parts.scatter_checked(memoryview(data), target) == crc32c(data)
    assert b"".join(p.tobytes() for p in pieces) == data


def test_bad_buffers_are_refused_before_a_byte_moves(native):
    with pytest.raises(ValueError, match="holds 3 bytes, the source 4"):
        native.copy_crc32c(bytearray(3), b"abcd")
    area = bytearray(b"abcdefgh")
    with pytest.raises(ValueError, match="overlap"):
        native.copy_crc32c(memoryview(area)[2:], memoryview(area)[:4])
    assert area == b"abcdefgh"
    with pytest.raises(TypeError):
        native.copy_crc32c(b"read-only", b"x")


def test_the_data_path_checks_with_the_fastest_crc_at_hand(native):
    fold = native.crc32c(b"") is not None
    assert fold == checksum.FOLDING
    assert (checksum.crc32c is native.crc32c) == fold
    assert checksum.copy_crc32c is native.copy_crc32c
    data = random.Random(2).randbytes(5000)
    assert parts.checksum(memoryview(data)) == crc32c(data)
