"""Conformance checks: Read streams (``read_stream``), against ``batch_read``."""

from __future__ import annotations

import gc
from collections.abc import Generator, Sequence

from crc32c import crc32c

from kvstored.sdk.backend import StorageBackend
from kvstored.sdk.errors import InvalidRequestError
from kvstored.sdk.testing.checks._common import (
    Clause,
    KiB,
    check,
    describe,
    located,
    make_items,
    write_all,
)
from kvstored.sdk.testing.kit import Kit, flip_byte, payload
from kvstored.sdk.types import EvictionGranularity, ReadStatus

#: What an untouched read buffer is filled with, to see what a failed read left in it.
FILL = 0xA5
#: Objects the stream checks write: enough for several groups of any sensible size.
STREAMED = 300


def streamed(backend: StorageBackend, keys: Sequence[str],
             buffers: Sequence[memoryview]) -> dict[int, int]:
    """Every ``(index, result)`` of ``read_stream(keys, buffers)``, by index, after
    checking that each is a pair of ints naming an index of ``keys``, and each index
    came exactly once."""
    results: dict[int, int] = {}
    for item in backend.read_stream(keys, buffers):
        assert isinstance(item, tuple) and len(item) == 2, \
            f"read_stream yielded {item!r}, not an (index, result) pair"
        index, result = item
        assert isinstance(index, int) and isinstance(result, int), \
            f"read_stream yielded {item!r}: index and result must be ints"
        assert 0 <= index < len(keys), \
            f"read_stream yielded index {index} for {len(keys)} keys"
        assert index not in results, \
            f"read_stream yielded index {index} ({keys[index]!r}) twice"
        results[index] = result
    missed = sorted(set(range(len(keys))) - set(results))
    assert not missed, f"read_stream never yielded {len(missed)} of {len(keys)} indices, " \
                       f"the first {missed[:5]}"
    return results


def _buffers(sizes: Sequence[int]) -> list[memoryview]:
    return [memoryview(bytearray(bytes([FILL]) * size)) for size in sizes]


def _untouched_or_zero(buffer: memoryview) -> bool:
    data = bytes(buffer)
    return data in (bytes([FILL]) * len(data), bytes(len(data)))


@check(Clause.STREAMS)
def read_stream_matches_batch_read(kit: Kit) -> None:
    """read_stream over present, missing and repeated keys and a too-small buffer
    yields every index exactly once, each with what batch_read gives for it, the same
    bytes in the buffers; a failed item's buffer holds nothing of the stored bytes."""
    backend = kit.open()
    items = make_items("s", STREAMED, 20 * KiB)
    write_all(backend, items)
    values = dict(items)
    keys = [key for key, _ in items]
    keys[7:7] = ["absent/1", keys[3]]                     # a miss, and a key twice
    keys += ["absent/2", keys[-1]]
    sizes = [len(values[key]) if key in values else 64 for key in keys]
    small = next(n for n, key in enumerate(keys) if len(values.get(key, b"")) > 1)
    sizes[small] -= 1                                      # BUFFER_TOO_SMALL
    from_stream = _buffers(sizes)
    got = streamed(backend, keys, from_stream)
    from_batch = _buffers(sizes)
    expected = backend.batch_read(keys, from_batch)
    for index, key in enumerate(keys):
        assert got[index] == expected[index], \
            f"read_stream gave {got[index]} for {key!r} (index {index}), batch_read " \
            f"{expected[index]}"
        result = got[index]
        if result >= 0:
            assert bytes(from_stream[index][:result]) == values[key], \
                f"read_stream put wrong bytes in the buffer of {key!r} (index {index})"
        else:
            assert _untouched_or_zero(from_stream[index]), \
                f"a failed streamed read of {key!r} ({describe(ReadStatus(result))}) left " \
                "bytes in its buffer"
    assert got[small] == ReadStatus.BUFFER_TOO_SMALL, got[small]
    assert streamed(backend, [], []) == {}, "read_stream of no keys yielded something"


@check(Clause.STREAMS)
def read_stream_corrupt_is_miss(kit: Kit) -> None:
    """A value that fails its checksum reads CORRUPT through read_stream, as through
    batch_read (counted alike where the backend counts), never its bytes; the objects
    beside it read correctly; check(repair=True) quarantines it and it reads MISSING."""
    backend = kit.open()
    items = make_items("sc", 40, 12 * KiB)
    victim = next(key for key, value in items if len(value) > 100)
    items.append(("sc/big", payload("sc/big", 70_000)))
    write_all(backend, items)
    where = located(backend, victim)
    flip_byte(where.path, where.offset + where.length // 2)
    values = dict(items)
    keys = [key for key, _ in items]
    counted = getattr(backend, "corrupt_reads", None)
    buffers = _buffers([len(values[key]) for key in keys])
    got = streamed(backend, keys, buffers)
    for index, key in enumerate(keys):
        if key == victim:
            assert got[index] == ReadStatus.CORRUPT, \
                f"the damaged {key!r} read as {got[index]} through read_stream, not CORRUPT"
            assert _untouched_or_zero(buffers[index]), \
                "a corrupt streamed read left bytes in the caller's buffer"
        else:
            assert got[index] == len(values[key]) \
                and bytes(buffers[index][:got[index]]) == values[key], \
                f"{key!r} beside a damaged one read as {got[index]}"
    if counted is not None:
        after_stream = getattr(backend, "corrupt_reads", counted)
        backend.batch_read([victim], _buffers([len(values[victim])]))
        after_batch = getattr(backend, "corrupt_reads", counted)
        assert after_stream - counted == after_batch - after_stream == 1, \
            f"corrupt_reads grew by {after_stream - counted} for a streamed corrupt read " \
            f"and by {after_batch - after_stream} for batch_read's"
    report = backend.check(repair=True)
    assert report.problems, "check(repair=True) did not find the damaged record"
    assert not backend.contains(victim), "the damaged record is still indexed after repair"
    assert streamed(backend, [victim], _buffers([len(values[victim])]))[0] == \
        ReadStatus.MISSING, "a quarantined record does not read MISSING through read_stream"


def _evictable(backend: StorageBackend) -> bool:
    return backend.capabilities.eviction is not EvictionGranularity.NONE


def _all_released(backend: StorageBackend, keys: Sequence[str], how: str) -> None:
    """Every key of ``keys`` can go: evict() removes all of them (no pin left behind),
    or, where the backend does not evict, a delete removes them all."""
    if _evictable(backend):
        evicted = set(backend.evict(10**15))
        kept = sorted(set(keys) - evicted)
        assert not kept, f"after a read stream was {how}, evict() kept {len(kept)} keys " \
                         f"(their pins were not released), the first {kept[:3]}"
    else:
        assert all(backend.batch_delete(list(keys))), f"a delete after a stream {how} failed"
    assert backend.usage().objects == 0, \
        f"{backend.usage().objects} objects remain after a stream was {how}"


@check(Clause.STREAMS)
def read_stream_closed_early_releases_pins(kit: Kit) -> None:
    """A read stream closed after its first item (close(), leaving a for loop, or
    dropping it) releases every pin: evict() (or delete) removes every key afterwards."""
    backend = kit.open()
    items = make_items("se", STREAMED, 4 * KiB)
    keys = [key for key, _ in items]
    for how in ("closed", "left by break", "dropped"):
        write_all(backend, items)
        stream: Generator = backend.read_stream(keys, _buffers([4 * KiB] * len(keys)))
        if how == "left by break":
            for _ in stream:
                break
        else:
            next(stream)
        if how == "closed":
            stream.close()
        del stream
        gc.collect()
        _all_released(backend, keys, how)


@check(Clause.STREAMS)
def read_stream_pins_until_yielded(kit: Kit) -> None:
    """Eviction while a stream is suspended, then writes into the space it freed, never
    make the stream hand out wrong bytes: every item after it is the stored value or
    MISSING (a key looked up after it went), never CORRUPT nor another value."""
    backend = kit.open()
    items = make_items("sp", STREAMED, 8 * KiB)
    write_all(backend, items)
    values = dict(items)
    keys = [key for key, _ in items]
    buffers = _buffers([len(values[key]) for key in keys])
    stream = backend.read_stream(keys, buffers)
    index, result = next(stream)
    assert result == len(values[keys[index]]), f"the first item read {result}"
    if _evictable(backend):
        backend.evict(10**15)
    else:
        backend.batch_delete(keys)
    write_all(backend, make_items("sp-new", STREAMED, 8 * KiB))
    for index, result in stream:
        key = keys[index]
        if result == ReadStatus.MISSING:
            continue
        assert result == len(values[key]), \
            f"{key!r} read as {result} after an eviction while its stream was suspended"
        got = bytes(buffers[index][:result])
        assert got == values[key], \
            f"{key!r} read as other bytes (CRC {crc32c(got):#x}) after an eviction and " \
            "new writes while its stream was suspended: a read went on after its pin did"


@check(Clause.STREAMS)
def read_stream_missing_and_bad_buffers(kit: Kit) -> None:
    """read_stream of keys never written yields MISSING for each; a read-only buffer or
    a count of buffers other than of keys raises InvalidRequestError at the call,
    before any step."""
    backend = kit.open()
    write_all(backend, [("here", payload("here", 100))])
    keys = [f"gone/{n}" for n in range(150)]
    got = streamed(backend, keys, _buffers([16] * len(keys)))
    assert set(got.values()) == {ReadStatus.MISSING}, \
        f"keys never written read as {sorted(set(got.values()) - {ReadStatus.MISSING})}"
    for what, keys, buffers in (
            ("a read-only buffer", ["here"], [memoryview(bytes(100))]),
            ("two buffers for one key", ["here"], _buffers([100, 100]))):
        try:
            backend.read_stream(keys, buffers)
        except InvalidRequestError:
            continue
        raise AssertionError(f"read_stream with {what} did not raise InvalidRequestError "
                             "at the call")
