"""sdk/record_check.c against record.py: a record passes the C check exactly when
``verify_record`` finds nothing wrong, and ``verified_reads`` gives each record of a batch
the outcome ``verified_read`` gives it, destination bytes included."""

from __future__ import annotations

import random

import pytest
from crc32c import crc32c

from kvstored.sdk import record
from kvstored.sdk.record import (
    VALUE_OFFSET,
    encode_header,
    verified_read,
    verified_reads,
    verify_record,
)
from kvstored.sdk.types import ReadStatus


@pytest.fixture
def check():
    if record._record_check is None:
        pytest.fail("kvstored.sdk._record_check was not built (setup.py's "
                    "RECORD_CHECK_EXTENSION); records are checked in Python alone")
    return record._record_check


def test_its_crc32c_is_the_crc32c_packages(check):
    rng = random.Random(7)
    for length in [0, 1, 7, 8, 9, 40, 63, 64, 65, 4095, 4096, 4097, 100_000]:
        data = rng.randbytes(length)
        start = rng.getrandbits(32)
        assert check.crc32c(data) == crc32c(data)
        assert check.crc32c(data, start) == crc32c(data, start)


def _record(rng: random.Random, key: str, size: int, seq: int):
    value = rng.randbytes(size)
    head = bytearray(encode_header(key.encode(), size, seq, crc32c(value)))
    return head, bytearray(value)


def _mutations(rng: random.Random, head: bytearray, value: bytearray, key: str, size: int,
               seq: int, checksum: int):
    """The record as written and as the index says, then one thing wrong at a time."""
    yield head, value, key, size, seq, checksum
    for position in (0, 3, 4, 6, 8, 12, 20, 28, 36, 40, 44, 44 + len(key.encode()) - 1):
        bad = bytearray(head)
        bad[position] ^= 1 << rng.randrange(8)
        yield bad, value, key, size, seq, checksum
    if size:
        bad_value = bytearray(value)
        bad_value[rng.randrange(size)] ^= 0x10
        yield head, bad_value, key, size, seq, checksum
    yield head, value, key + "x", size, seq, checksum
    yield head, value, key, size, seq + 1, checksum
    yield head, value, key, size, seq, checksum ^ 1
    tombstone = bytearray(encode_header(key.encode(), size, seq, checksum, flags=1))
    yield tombstone, value, key, size, seq, checksum
    yield bytearray(VALUE_OFFSET), value, key, size, seq, checksum


@pytest.mark.parametrize("in_place", [False, True], ids=["from-scratch", "into-dest"])
def test_the_c_check_agrees_with_verify_record(check, in_place):
    rng = random.Random(16)
    cases = 0
    for n in range(40):
        key = rng.choice(["k", "layer/7/é", "x" * 300]) + str(n)
        size = rng.choice([0, 1, 100, 4096, 5000])
        seq = rng.getrandbits(40)
        head, value = _record(rng, key, size, seq)
        for case in _mutations(rng, head, value, key, size, seq, crc32c(bytes(value))):
            got_head, got_value, want_key, want_size, want_seq, want_checksum = case
            reason = verify_record(got_head, got_value, key=want_key, size=want_size,
                                   seq=want_seq, checksum=want_checksum)
            dest = bytearray(got_value) if in_place else bytearray(len(got_value) + 8)
            entry = (dest, got_head, None if in_place else got_value, want_key, want_size,
                     want_seq, want_checksum)
            failed = check.check([entry])
            assert (failed == []) == (reason is None), (case, reason)
            if reason is None:
                assert dest[:want_size] == got_value
            cases += 1
    assert cases > 600


def test_verified_reads_gives_what_verified_read_gives(check):
    """A batch mixing good records, corrupt ones, short reads and I/O errors: the same
    outcomes (reasons included) and the same destination bytes either way."""
    rng = random.Random(3)
    reads_a, reads_b = [], []
    for n in range(60):
        key, size, seq = f"key/{n}", rng.choice([1, 4096, 9000]), n
        head, value = _record(rng, key, size, seq)
        checksum = crc32c(bytes(value))
        kind = n % 5
        if kind == 1:
            value[0] ^= 1
        elif kind == 2:
            head[20] ^= 1
        error = OSError(5, "Input/output error") if kind == 3 else None
        complete = kind != 4
        for reads in (reads_a, reads_b):
            dest = memoryview(bytearray(b"\xaa" * (size + 3)))
            reads.append((dest, bytes(head), bytes(value), key, size, seq, checksum, error,
                          complete))
    batched = verified_reads(reads_a)
    one_by_one = [verified_read(dest, head, value, key=key, size=size, seq=seq,
                                checksum=checksum, complete=complete, error=error)
                  for dest, head, value, key, size, seq, checksum, error, complete in reads_b]
    assert batched == one_by_one
    assert [a[0].tobytes() for a in reads_a] == [b[0].tobytes() for b in reads_b]
    statuses = {outcome.status for outcome in batched}
    assert {ReadStatus.CORRUPT, ReadStatus.IO_ERROR} <= statuses and any(s > 0 for s in statuses)


def test_without_the_extension_records_are_checked_in_python(monkeypatch):
    rng = random.Random(5)
    head, value = _record(rng, "k", 10, 1)
    monkeypatch.setattr(record, "_record_check", None)
    dest = memoryview(bytearray(10))
    bad = bytearray(value)
    bad[0] ^= 1
    outcomes = verified_reads([
        (dest, head, value, "k", 10, 1, crc32c(bytes(value)), None, True),
        (memoryview(bytearray(10)), head, bad, "k", 10, 1, crc32c(bytes(value)), None, True)])
    assert outcomes[0].status == 10 and dest == value
    assert outcomes[1].status == ReadStatus.CORRUPT and "checksum" in outcomes[1].reason
