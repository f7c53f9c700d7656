"""Conformance checks: Keys, batches and write-once."""

from __future__ import annotations

import os

from kvstored.sdk.errors import (
    CapacityError,
    InvalidKeyError,
    InvalidRequestError,
    ValueTooLargeError,
)
from kvstored.sdk.testing.checks._common import (
    Clause,
    KiB,
    MiB,
    check,
    write_all,
)
from kvstored.sdk.testing.kit import Kit, Requirement, payload
from kvstored.sdk.types import (
    MAX_KEY_BYTES,
    ReadStatus,
    WriteOutcome,
)

# -- keys --------------------------------------------------------------------------------


@check(Clause.KEYS)
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


@check(Clause.KEYS, Requirement.PERSISTENT)
def longest_key_accepted(kit: Kit) -> None:
    """A key of exactly 1024 bytes of UTF-8 (multi-byte characters) round-trips."""
    backend = kit.open()
    key = "é" * (MAX_KEY_BYTES // 2)
    write_all(backend, [(key, b"long key")])
    backend = kit.reopen(backend)
    kit.assert_value(backend, key, b"long key")


@check(Clause.KEYS, Requirement.PERSISTENT)
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


@check(Clause.BATCHES)
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


@check(Clause.WRITE_ONCE)
def batch_write_duplicates(kit: Kit) -> None:
    """A key repeated within one batch is written once: the first value wins."""
    backend = kit.open()
    results = backend.batch_write([("d", b"first"), ("e", b"x"), ("d", b"second")])
    outcomes = [r.outcome for r in results]
    assert outcomes == [WriteOutcome.WRITTEN, WriteOutcome.WRITTEN, WriteOutcome.EXISTS], outcomes
    kit.assert_value(backend, "d", b"first")


@check(Clause.WRITE_ONCE, Requirement.PERSISTENT)
def put_existing_key(kit: Kit) -> None:
    """Writing an existing key reports EXISTS and keeps the stored value, across reopen."""
    backend = kit.open()
    write_all(backend, [("k", b"original")])
    [result] = backend.batch_write([("k", b"replacement")])
    assert result.outcome is WriteOutcome.EXISTS and result.ok, result
    kit.assert_value(backend, "k", b"original")
    backend = kit.reopen(backend)
    kit.assert_value(backend, "k", b"original")


@check(Clause.ERRORS)
def missing_key(kit: Kit) -> None:
    """A key never written is missing everywhere: read, contains, stat, locate, delete."""
    backend = kit.open()
    write_all(backend, [("present", b"x")])
    assert kit.read(backend, "absent", 10) == ReadStatus.MISSING
    assert backend.batch_contains(["absent", "present"]) == [False, True]
    assert backend.stat("absent") is None and backend.locate("absent") is None
    assert backend.batch_delete(["absent"]) == [False]


@check(Clause.BUFFERS)
def buffer_too_small(kit: Kit) -> None:
    """A buffer shorter than the value gets BUFFER_TOO_SMALL, not a truncated value."""
    backend = kit.open()
    write_all(backend, [("big", payload("big", 10_000))])
    assert kit.read(backend, "big", 9_999) == ReadStatus.BUFFER_TOO_SMALL
    kit.assert_value(backend, "big", payload("big", 10_000))


@check(Clause.KEYS)
def long_keys_sharing_prefix(kit: Kit) -> None:
    """Long keys that differ only in their last character (a shared prefix past any file
    name limit, at 255/256 bytes and at the 1024-byte maximum) are distinct objects."""
    backend = kit.open()
    keys = []
    for length in (255, 256, 300, MAX_KEY_BYTES):
        stem = "p" * (length - 1)
        keys += [stem + tail for tail in "abc"]
    keys.append("é" * (MAX_KEY_BYTES // 2 - 1) + "x")
    keys.append("é" * (MAX_KEY_BYTES // 2 - 1) + "y")
    items = [(k, payload(k, 64 + i)) for i, k in enumerate(keys)]
    write_all(backend, items)
    for key, value in items:
        kit.assert_value(backend, key, value)
    assert backend.usage().objects == len(items), "long keys collided"
    if backend.capabilities.persistent:
        backend = kit.reopen(backend)
        for key, value in items:
            kit.assert_value(backend, key, value)
        assert sorted(r.key for r in backend.scan()) == sorted(keys), "scan lost a long key"


@check(Clause.BUFFERS)
def write_buffers_may_be_reused(kit: Kit) -> None:
    """The caller may reuse its value buffers once batch_write returns: changing them
    afterwards changes nothing stored (bytearray, memoryview slices, offset views)."""
    backend = kit.open()
    whole = bytearray(payload("buf/whole", 30_000))
    arena = bytearray(payload("buf/arena", 50_000))
    items = [("buf/whole", whole), ("buf/slice", memoryview(arena)[1_000:21_001])]
    expected = {"buf/whole": bytes(whole), "buf/slice": bytes(arena[1_000:21_001])}
    write_all(backend, items)
    whole[:] = bytes(len(whole))
    arena[:] = b"\xff" * len(arena)
    for key, value in expected.items():
        kit.assert_value(backend, key, value)


@check(Clause.BUFFERS)
def read_only_buffer_refused(kit: Kit) -> None:
    """A read into a buffer that is not writable raises InvalidRequestError (before any
    item is read) instead of failing inside the I/O."""
    backend = kit.open()
    write_all(backend, [("ro", payload("ro", 5000))])
    try:
        backend.batch_read(["ro"], [memoryview(bytes(5000))])
    except InvalidRequestError:
        return
    except Exception as exc:
        raise AssertionError(f"a read-only buffer raised {type(exc).__name__}: {exc}, not "
                             "InvalidRequestError") from None
    raise AssertionError("a read into a read-only buffer was accepted")


@check(Clause.BATCHES)
def batch_fails_per_item(kit: Kit) -> None:
    """A batch mixing objects that fit with one too large for the capacity fails only
    that one (FAILED with CapacityError); the others are written."""
    backend = kit.open(capacity=4 * MiB)
    small = [(f"fit/{i}", payload(f"fit/{i}", 20_000)) for i in range(3)]
    items = [small[0], ("huge", payload("huge", 6 * MiB)), small[1], small[2]]
    results = backend.batch_write(items)
    outcomes = [r.outcome for r in results]
    assert outcomes == [WriteOutcome.WRITTEN, WriteOutcome.FAILED, WriteOutcome.WRITTEN,
                        WriteOutcome.WRITTEN], f"outcomes {outcomes}"
    assert isinstance(results[1].error, CapacityError), results[1]
    assert not backend.contains("huge")
    for key, value in small:
        kit.assert_value(backend, key, value)


@check(Clause.ERRORS)
def too_large_refused_in_any_batch(kit: Kit) -> None:
    """A value over max_value_size raises ValueTooLargeError naming it wherever it sits in
    a batch (first, middle, last, alone), and the batch writes nothing."""
    limit = 64 * KiB
    backend = kit.open(max_value_size=limit)
    fine = [(f"ok/{i}", payload(f"ok/{i}", 1000)) for i in range(3)]
    too_big = ("too-big", bytes(limit + 1))
    for position in range(len(fine) + 1):
        batch = [*fine[:position], too_big, *fine[position:]]
        try:
            backend.batch_write(batch)
        except ValueTooLargeError as exc:
            assert exc.key == "too-big", f"ValueTooLargeError names {exc.key!r}"
        else:
            raise AssertionError(f"a too-large value at position {position} of a batch "
                                 f"of {len(batch)} was accepted")
        written = [k for k, hit in zip([k for k, _ in batch], backend.batch_contains(
            [k for k, _ in batch])) if hit]
        assert not written, f"a refused batch wrote {written}"
    write_all(backend, [(k, v) for k, v in fine])
    for key, value in fine:
        kit.assert_value(backend, key, value)
