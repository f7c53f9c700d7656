"""bucket's and offset's read streams keep the engine's batches in flight across groups
(the conformance kit proves the results; these prove the overlap and the edges)."""

from __future__ import annotations

import errno
import threading

import pytest

from kvstored.backends.bucket.records import SMALL_VALUE_MAX
from kvstored.native import IoError
from kvstored.sdk.errors import InvalidRequestError
from kvstored.sdk.registry import open_backend
from kvstored.sdk.streams import (
    STREAM_AHEAD,
    STREAM_GROUP_BYTES,
    STREAM_GROUP_KEYS,
    stream_group_keys,
    stream_spans,
)
from kvstored.sdk.testing.kit import payload
from kvstored.sdk.types import ReadStatus
from tests.backends.conftest import item_nbytes

KiB = 1024
#: Each backend, the attribute its io engine is kept in, and the options it needs here.
BACKENDS = {"bucket": ("engine", {}), "offset": ("_engine", {"capacity": 256 << 20})}
SIZES = [0, 1, 4095, 4096, 4097, SMALL_VALUE_MAX, SMALL_VALUE_MAX + 1, 200 * KiB + 3]


class _Recording:
    """Wraps an engine: records each batch started, read and waited for (and can fail
    every read with EIO)."""

    def __init__(self, engine, fail: bool = False) -> None:
        self._engine = engine
        self.events: list[tuple[str, int]] = []
        self.started: list[list] = []
        self.fail = fail

    def start_read(self, items):
        items = list(items)
        self.events.append(("start", len(items)))
        self.started.append(items)
        return _Waited(self, self._engine.start_read(items), items)

    def read(self, items):
        items = list(items)
        self.events.append(("read", len(items)))
        if self.fail:  # the disk fails the records again when read one by one
            return [IoError(errno.EIO, f.path, offset, op="read") for f, offset, _ in items]
        return self._engine.read(items)

    def __getattr__(self, name):
        return getattr(self._engine, name)


class _Waited:
    def __init__(self, recording: _Recording, pending, items) -> None:
        self.recording, self.pending, self.items = recording, pending, items

    def wait(self):
        first = not hasattr(self, "results")
        results = self.results = self.pending.wait()
        if first:  # a second wait returns the same results (PendingBatch)
            self.recording.events.append(("wait", len(results)))
        if self.recording.fail:
            return [IoError(errno.EIO, f.path, offset, op="read") for f, offset, _ in self.items]
        return results


@pytest.fixture(params=sorted(BACKENDS))
def store(request, tmp_path, engine):
    name = request.param
    attribute, options = BACKENDS[name]
    backend = open_backend(name, tmp_path / "s", engine=engine, direct=True, **options)
    yield backend, attribute
    backend.close()


def _write(backend, count: int, size: int = 4 * KiB) -> dict[str, bytes]:
    items = [(f"k/{n}", payload(f"k/{n}", size)) for n in range(count)]
    assert all(r.ok for r in backend.batch_write(items))
    return dict(items)


def test_the_next_groups_are_in_flight_before_one_is_handed_out(store):
    backend, attribute = store
    values = _write(backend, 300)
    keys = list(values)[::-1]
    recording = _Recording(getattr(backend, attribute))
    setattr(backend, attribute, recording)
    buffers = [memoryview(bytearray(4 * KiB)) for _ in keys]
    stream = backend.read_stream(keys, buffers)
    index, result = next(stream)
    assert recording.events == [("start", STREAM_GROUP_KEYS)] * (1 + STREAM_AHEAD) + [
        ("wait", STREAM_GROUP_KEYS)], recording.events
    seen = {index: result, **dict(stream)}
    assert seen == dict.fromkeys(range(len(keys)), 4 * KiB)
    assert all(bytes(buffers[i]) == values[key] for i, key in enumerate(keys))
    groups = -(-len(keys) // STREAM_GROUP_KEYS)
    assert [kind for kind, _ in recording.events].count("start") == groups
    assert [kind for kind, _ in recording.events].count("wait") == groups
    assert ("read", len(keys)) not in recording.events, "the stream fell back to read()"


def test_a_short_stream_is_still_groups_all_in_flight(store):
    """32 keys (a node's get): three groups started before the first is waited for, so
    results come back while the rest is read, at the queue depth of one group of 32."""
    backend, attribute = store
    values = _write(backend, 32)
    keys = list(values)
    recording = _Recording(getattr(backend, attribute))
    setattr(backend, attribute, recording)
    buffers = [memoryview(bytearray(4 * KiB)) for _ in keys]
    stream = backend.read_stream(keys, buffers)
    next(stream)
    # Counted in bytes: neighbouring records may be joined into one request (bucket).
    assert [kind for kind, _ in recording.events] == ["start"] * 3 + ["wait"]
    first, second, third = (sum(map(item_nbytes, items)) for items in recording.started)
    assert first == second and third * 11 == first * 10, recording.started
    rest = dict(stream)
    assert len(rest) == 31 and all(r == 4 * KiB for r in rest.values())
    assert stream_group_keys(1) == 1 and stream_group_keys(10**6) == STREAM_GROUP_KEYS


def test_large_values_stream_in_groups_of_bytes(store):
    """32 values of 1 MiB (a node's get): groups of STREAM_GROUP_BYTES, not three groups
    of 11 that the disk would finish together, so the first lands while the rest is
    read; still three groups in flight before the first is waited for."""
    backend, attribute = store
    size = 1 << 20
    values = _write(backend, 32, size)
    keys = list(values)
    recording = _Recording(getattr(backend, attribute))
    setattr(backend, attribute, recording)
    buffers = [memoryview(bytearray(size)) for _ in keys]
    stream = backend.read_stream(keys, buffers)
    next(stream)
    per_group = STREAM_GROUP_BYTES // size
    assert recording.events == [("start", per_group)] * (1 + STREAM_AHEAD) + [
        ("wait", per_group)], recording.events
    rest = dict(stream)
    assert len(rest) == 31 and all(r == size for r in rest.values())
    assert all(bytes(buffers[i]) == values[key] for i, key in enumerate(keys))
    assert [kind for kind, _ in recording.events].count("start") == 32 // per_group


def test_stream_spans_cut_by_keys_and_by_bytes():
    big = STREAM_GROUP_BYTES
    assert list(stream_spans([])) == []
    assert list(stream_spans([4 * KiB] * 32)) == [range(0, 11), range(11, 22), range(22, 32)]
    # A buffer larger than a group is a group of its own; it never splits or is dropped.
    assert list(stream_spans([1, 3 * big, 1])) == [range(0, 1), range(1, 2), range(2, 3)]
    assert list(stream_spans([big // 2] * 5)) == [range(0, 2), range(2, 4), range(4, 5)]
    assert [len(r) for r in stream_spans([0] * 1000)] == [STREAM_GROUP_KEYS] * 15 + [40]


@pytest.mark.parametrize("size", SIZES)
def test_every_size_streams_as_batch_read_reads(store, size):
    """Small values come through scratch, large ones (bucket) partly straight into the
    caller's memory: each reads the same through the stream."""
    backend, _ = store
    values = _write(backend, 70, size)
    keys = [*values, "absent"]
    streamed = [memoryview(bytearray(size + 8)) for _ in keys]
    batched = [memoryview(bytearray(size + 8)) for _ in keys]
    got = dict(backend.read_stream(keys, streamed))
    assert [got[i] for i in range(len(keys))] == backend.batch_read(keys, batched)
    assert got[len(keys) - 1] == ReadStatus.MISSING
    for i, key in enumerate(keys[:-1]):
        assert got[i] == size and bytes(streamed[i][:size]) == values[key]


def test_an_io_error_fails_its_items_alone_and_ends_nothing(store):
    backend, attribute = store
    values = _write(backend, 100)
    setattr(backend, attribute, _Recording(getattr(backend, attribute), fail=True))
    keys = [*values, "absent"]
    got = dict(backend.read_stream(keys, [memoryview(bytearray(4 * KiB)) for _ in keys]))
    assert got == {**dict.fromkeys(range(100), ReadStatus.IO_ERROR), 100: ReadStatus.MISSING}


def test_a_step_on_another_thread_is_refused_and_lets_the_pins_go(store):
    backend, _ = store
    values = _write(backend, 300)
    keys = list(values)
    buffers = [memoryview(bytearray(4 * KiB)) for _ in keys]
    stream = backend.read_stream(keys, buffers)
    next(stream)
    failure: list[BaseException] = []

    def step() -> None:
        try:
            next(stream)
        except BaseException as exc:  # the test looks at what it was
            failure.append(exc)

    thread = threading.Thread(target=step)
    thread.start()
    thread.join()
    assert len(failure) == 1 and isinstance(failure[0], InvalidRequestError), failure
    assert "thread" in str(failure[0])
    # The stream is over; its pins are gone, and the first thread's ring still works.
    assert set(backend.evict(10**15)) == set(keys)
    again = _write(backend, 10)
    got = backend.batch_read(list(again), [memoryview(bytearray(4 * KiB)) for _ in again])
    assert got == [4 * KiB] * len(again)
