"""Conformance checks: Keys, batches and write-once."""

from __future__ import annotations

import os

from kvstored.sdk.errors import (
    InvalidKeyError,
)
from kvstored.sdk.testing.checks._common import (
    check,
    write_all,
)
from kvstored.sdk.testing.kit import Kit, payload
from kvstored.sdk.types import (
    MAX_KEY_BYTES,
    ReadStatus,
    WriteOutcome,
)

# -- keys --------------------------------------------------------------------------------


@check
def invalid_keys_rejected(kit: Kit) -> None:
    """Empty, over-long and non-UTF-8 keys raise InvalidKeyError, and the batch writes
    nothing."""
    backend = kit.open()
    for bad in ("", "k" * (MAX_KEY_BYTES + 1), "\ud800"):
        try:
            backend.batch_write([("fine", b"x"), (bad, b"y")])
        except InvalidKeyError:
            pass
        else:
            raise AssertionError(f"key {bad[:20]!r} was accepted")
        assert not backend.contains("fine"), "a batch with an invalid key wrote part of itself"


@check
def longest_key_accepted(kit: Kit) -> None:
    """A key of exactly 1024 bytes of UTF-8 (multi-byte characters) round-trips."""
    backend = kit.open()
    key = "é" * (MAX_KEY_BYTES // 2)
    write_all(backend, [(key, b"long key")])
    backend = kit.reopen(backend)
    kit.assert_value(backend, key, b"long key")


@check
def hostile_keys(kit: Kit) -> None:
    """Keys with '/', '..', NUL, spaces and non-ASCII neither escape the directory nor
    collide."""
    keys = ["a/b", "a", "b", "../escape", "../../etc/passwd", "/abs", ".", "..", "a\x00b",
            "a\x00c", " ", "a b", "a  b", "ключ", "鍵", "🔑", "\\", "a/../b", "A", "CON"]
    before = set(os.listdir(kit.workspace))
    backend = kit.open()
    items = [(k, payload(k, 100 + i)) for i, k in enumerate(keys)]
    write_all(backend, items)
    for key, value in items:
        kit.assert_value(backend, key, value)
    backend = kit.reopen(backend)
    for key, value in items:
        kit.assert_value(backend, key, value)
    after = set(os.listdir(kit.workspace))
    assert after - before <= {"store"}, f"files appeared outside the store: {after - before}"
    assert not os.path.exists("/etc/passwd.kvr")


# -- batches and write-once -------------------------------------------------------------


@check
def batch_read_mixed(kit: Kit) -> None:
    """A batch read mixing present, missing and repeated keys answers each item."""
    backend = kit.open()
    write_all(backend, [("p1", b"one"), ("p2", b"two" * 1000)])
    keys = ["p1", "nope", "p2", "p1", "also-nope"]
    bufs = [memoryview(bytearray(4000)) for _ in keys]
    results = backend.batch_read(keys, bufs)
    assert results == [3, ReadStatus.MISSING, 3000, 3, ReadStatus.MISSING], results
    assert bytes(bufs[0][:3]) == b"one" and bytes(bufs[3][:3]) == b"one"
    assert bytes(bufs[2][:3000]) == b"two" * 1000


@check
def batch_write_duplicates(kit: Kit) -> None:
    """A key repeated within one batch is written once: the first value wins."""
    backend = kit.open()
    results = backend.batch_write([("d", b"first"), ("e", b"x"), ("d", b"second")])
    outcomes = [r.outcome for r in results]
    assert outcomes == [WriteOutcome.WRITTEN, WriteOutcome.WRITTEN, WriteOutcome.EXISTS], outcomes
    kit.assert_value(backend, "d", b"first")


@check
def put_existing_key(kit: Kit) -> None:
    """Writing an existing key reports EXISTS and keeps the stored value, across reopen."""
    backend = kit.open()
    write_all(backend, [("k", b"original")])
    [result] = backend.batch_write([("k", b"replacement")])
    assert result.outcome is WriteOutcome.EXISTS and result.ok, result
    kit.assert_value(backend, "k", b"original")
    backend = kit.reopen(backend)
    kit.assert_value(backend, "k", b"original")


@check
def missing_key(kit: Kit) -> None:
    """A key never written is missing everywhere: read, contains, stat, locate, delete."""
    backend = kit.open()
    write_all(backend, [("present", b"x")])
    assert kit.read(backend, "absent", 10) == ReadStatus.MISSING
    assert backend.batch_contains(["absent", "present"]) == [False, True]
    assert backend.stat("absent") is None and backend.locate("absent") is None
    assert backend.batch_delete(["absent"]) == [False]


@check
def buffer_too_small(kit: Kit) -> None:
    """A buffer shorter than the value gets BUFFER_TOO_SMALL, not a truncated value."""
    backend = kit.open()
    write_all(backend, [("big", payload("big", 10_000))])
    assert kit.read(backend, "big", 9_999) == ReadStatus.BUFFER_TOO_SMALL
    kit.assert_value(backend, "big", payload("big", 10_000))


