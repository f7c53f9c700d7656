"""Record I/O of the bucket backend: batched reads, both read paths (contiguous and
split), O_DIRECT with unaligned buffers, records swapped on disk, I/O errors, and a real
full file system."""

from __future__ import annotations

import errno
import mmap
import os
from pathlib import Path

import pytest

from kvstored.backends.bucket.records import JOINED_READ_MAX, SMALL_VALUE_MAX
from kvstored.native import IoError
from kvstored.sdk.errors import CapacityError, InvalidRequestError
from kvstored.sdk.record import record_size
from kvstored.sdk.registry import open_backend
from kvstored.sdk.testing import flip_byte, payload
from kvstored.sdk.types import ReadStatus, WriteOutcome
from tests.backends.conftest import item_nbytes
from tests.conftest import scratch_fs

KiB = 1024
SIZES = [0, 1, 4095, 4096, 4097, SMALL_VALUE_MAX, SMALL_VALUE_MAX + 1, 3 * SMALL_VALUE_MAX + 4096]


class _CountingEngine:
    """Counts the engine submissions a backend makes (and can fail reads with EIO)."""

    def __init__(self, engine, fail_reads: bool = False) -> None:
        self._engine = engine
        self.reads: list[int] = []
        self.fail_reads = fail_reads

    def read(self, items):
        items = list(items)
        self.reads.append(len(items))
        if self.fail_reads:
            return [IoError(errno.EIO, f.path, off, op="read") for f, off, _ in items]
        return self._engine.read(items)

    def __getattr__(self, name):
        return getattr(self._engine, name)


def test_one_submission_for_a_batch_across_buckets(tmp_path, engine):
    backend = open_backend("bucket", tmp_path / "s", engine=engine, bucket_keys=3)
    items = [(f"k{n}", payload(f"k{n}", size)) for n, size in enumerate(SIZES)]
    backend.batch_write(items)
    assert len({backend.locate(k).path for k, _ in items}) == 3
    counting = backend.engine = _CountingEngine(backend.engine)
    keys = [k for k, _ in items][::-1]
    bufs = [memoryview(bytearray(len(dict(items)[k]) + 10)) for k in keys]
    assert backend.batch_read(keys, bufs) == [len(dict(items)[k]) for k in keys]
    assert len(counting.reads) == 1, counting.reads
    for key, buf in zip(keys, bufs):
        assert bytes(buf[:len(dict(items)[key])]) == dict(items)[key]


@pytest.mark.parametrize("direct", [False, True])
def test_unaligned_caller_buffers(tmp_path, engine, direct):
    """Values written from and read into buffers at odd addresses, with O_DIRECT or not."""
    backend = open_backend("bucket", tmp_path / "s", engine=engine, direct=direct)
    arena = mmap.mmap(-1, 4 * 1024 * KiB)
    items, at = [], 1
    for n, size in enumerate(SIZES):
        value = payload(f"u{n}", size)
        arena[at:at + size] = value
        items.append((f"u{n}", memoryview(arena)[at:at + size]))
        at += size + 3
    assert all(r.outcome is WriteOutcome.WRITTEN for r in backend.batch_write(items))
    out = mmap.mmap(-1, 4 * 1024 * KiB)
    bufs, at = [], 5
    for size in SIZES:
        bufs.append(memoryview(out)[at:at + size + 1])
        at += size + 7
    assert backend.batch_read([k for k, _ in items], bufs) == SIZES
    for (key, _), buf, size in zip(items, bufs, SIZES):
        assert bytes(buf[:size]) == payload(key, size)
    del items, bufs
    backend.close()


@pytest.mark.parametrize("where", ["body", "tail", "header"])
def test_split_read_reports_corrupt_and_clears_the_buffer(tmp_path, where):
    backend = open_backend("bucket", tmp_path / "s", engine="posix")
    size = 3 * SMALL_VALUE_MAX + 100
    backend.batch_write([("big", payload("big", size)), ("ok", payload("ok", size))])
    loc = backend.locate("big")
    offset = {"body": loc.offset + 10, "tail": loc.offset + size - 5,
              "header": loc.record_offset + 8}[where]
    flip_byte(loc.path, offset)
    buf = bytearray(b"\xaa" * size)
    assert backend.batch_read(["big"], [memoryview(buf)]) == [ReadStatus.CORRUPT]
    assert buf == bytes(size), "bytes that failed their check were left in the buffer"
    assert backend.read("ok") == payload("ok", size)
    assert backend.corrupt_reads == 1


def test_records_swapped_on_disk_are_never_returned_as_each_other(tmp_path):
    """Both records check on their own; only the header's key and seq tell them apart."""
    backend = open_backend("bucket", tmp_path / "s", engine="posix")
    backend.batch_write([("a", payload("a", 5000)), ("b", payload("b", 5000))])
    a, b = backend.locate("a"), backend.locate("b")
    with open(a.path, "r+b") as f:
        first = os.pread(f.fileno(), a.record_length, a.record_offset)
        second = os.pread(f.fileno(), b.record_length, b.record_offset)
        os.pwrite(f.fileno(), second, a.record_offset)
        os.pwrite(f.fileno(), first, b.record_offset)
    bufs = [memoryview(bytearray(5000)) for _ in range(2)]
    assert backend.batch_read(["a", "b"], bufs) == [ReadStatus.CORRUPT] * 2


def test_io_errors_are_reported_per_item(tmp_path):
    backend = open_backend("bucket", tmp_path / "s", engine="posix")
    backend.batch_write([("x", b"value")])
    backend.engine = _CountingEngine(backend.engine, fail_reads=True)
    buf = memoryview(bytearray(10))
    assert backend.batch_read(["x", "missing"], [buf, buf]) == [ReadStatus.IO_ERROR,
                                                                ReadStatus.MISSING]


@pytest.fixture
def small_fs(tmp_path):
    """A 2 MiB tmpfs, to run out of space for real."""
    with scratch_fs(tmp_path / "tmpfs", "2m") as where:
        yield where


def test_full_file_system_fails_the_bucket_with_capacity_error(small_fs: Path):
    store = small_fs / "s"
    backend = open_backend("bucket", store, engine="posix")
    assert all(r.ok for r in backend.batch_write([("small", b"x" * 1000)]))
    results = backend.batch_write([(f"big{n}", payload(f"big{n}", 512 * KiB))
                                   for n in range(6)])
    assert all(r.outcome is WriteOutcome.FAILED for r in results)
    assert isinstance(results[0].error, CapacityError), results[0].error
    assert results[0].error.key == "big0"
    assert sorted(p.name for p in (store / "buckets").iterdir()) == [
        "0000000000000001.data", "0000000000000001.idx"], "a failed bucket left files"
    assert backend.read("small") == b"x" * 1000
    assert backend.usage().objects == 1
    backend.close()
    assert open_backend("bucket", store, engine="posix").usage().objects == 1


def test_read_only_buffers_are_refused_before_any_io(tmp_path):
    backend = open_backend("bucket", tmp_path / "s", engine="posix")
    backend.batch_write([("k", b"value")])
    with pytest.raises(InvalidRequestError, match="writable") as caught:
        backend.batch_read(["k", "k"], [memoryview(bytearray(8)), memoryview(bytes(8))])
    assert caught.value.key == "k"
    assert backend.read("k") == b"value"


class _WriteCounting:
    def __init__(self, engine) -> None:
        self._engine = engine
        self.writes: list[int] = []

    def write(self, items):
        items = list(items)
        self.writes.append(len(items))
        return self._engine.write(items)

    def __getattr__(self, name):
        return getattr(self._engine, name)


def test_small_records_go_in_bounded_submissions_of_one_request_each(tmp_path):
    """300 records of 64 KiB need 20 MiB of scratch: two submissions, one request per
    record; a large value is one request too (a vectored one)."""
    backend = open_backend("bucket", tmp_path / "s", engine="posix")
    counting = backend.engine = _WriteCounting(backend.engine)
    items = [(f"s{n}", payload(f"s{n}", SMALL_VALUE_MAX)) for n in range(300)]
    items.append(("large", payload("large", SMALL_VALUE_MAX + 5)))
    assert all(r.ok for r in backend.batch_write(items))
    assert len(counting.writes) == 2 and sum(counting.writes) == 300 + 1, counting.writes
    backend.close()
    backend = open_backend("bucket", tmp_path / "s", engine="posix")
    for key, value in items:
        assert backend.read(key) == value


def test_read_handles_stay_bounded(tmp_path):
    """Only the most recently read buckets keep an open data file; close closes them."""
    backend = open_backend("bucket", tmp_path / "s", engine="posix")
    backend._handles.limit = 4
    for n in range(10):
        backend.batch_write([(f"h{n}", payload(f"h{n}", 100))])
    for _ in range(2):
        for n in range(10):
            assert backend.read(f"h{n}") == payload(f"h{n}", 100)
    buckets = list(backend._buckets.values())
    assert [b.file is not None for b in buckets] == [False] * 6 + [True] * 4
    backend.close()
    assert all(b.file is None for b in buckets)


class _Recording:
    """Keeps every item the backend hands to the engine (and the data file's size at
    the first write)."""

    def __init__(self, engine) -> None:
        self._engine = engine
        self.writes: list = []
        self.reads: list = []
        self.size_at_first_write: int | None = None

    def write(self, items):
        items = list(items)
        if self.size_at_first_write is None:
            self.size_at_first_write = os.fstat(items[0][0].fd).st_size
        self.writes.append(items)
        return self._engine.write(items)

    def read(self, items):
        items = list(items)
        self.reads.append(items)
        return self._engine.read(items)

    def __getattr__(self, name):
        return getattr(self._engine, name)


@pytest.mark.parametrize("size", [SMALL_VALUE_MAX + 1, 128 * KiB, 1024 * KiB + 100])
def test_a_large_record_is_one_request_from_and_into_the_callers_memory(tmp_path, engine,
                                                                          size):
    """[header block, the value's whole blocks, its padded last block]: one vectored
    request, the middle piece being the caller's own buffer, on the way out and in."""
    backend = open_backend("bucket", tmp_path / "s", engine=engine, direct=True)
    recording = backend.engine = _Recording(backend.engine)
    source = mmap.mmap(-1, size)
    source[:] = payload("big", size)
    assert all(r.ok for r in backend.batch_write([("big", memoryview(source))]))
    (item,), = recording.writes
    _, offset, pieces = item
    whole = size & ~(4 * KiB - 1)
    assert offset == 0 and isinstance(pieces, list)
    assert [p.nbytes for p in pieces] == [4 * KiB, whole] + ([4 * KiB] if size > whole else [])
    assert pieces[1].obj is source, "the value was copied instead of written from its buffer"
    target = mmap.mmap(-1, size)
    assert backend.batch_read(["big"], [memoryview(target)]) == [size]
    (item,), = recording.reads
    assert isinstance(item[2], list) and item[2][1].obj is target
    assert target[:] == source[:]
    del pieces, item
    backend.close()


def test_a_data_file_has_its_final_size_before_any_record_is_written(tmp_path, engine):
    """O_DIRECT writes inside the file, never past its end (which ext4 serialises)."""
    backend = open_backend("bucket", tmp_path / "s", engine=engine, direct=True)
    recording = backend.engine = _Recording(backend.engine)
    items = [(f"k{n}", payload(f"k{n}", size)) for n, size in enumerate([5000, 200 * KiB, 1])]
    assert all(r.ok for r in backend.batch_write(items))
    data_len = sum(record_size(len(value)) for _, value in items)
    assert recording.size_at_first_write == data_len
    assert os.path.getsize(backend.locate("k0").path) == data_len
    backend.close()


class _BadBlock:
    """Fails with EIO every read request that covers ``bad`` (an offset in ``path``), as
    a disk with one unreadable block does: alone or inside a larger request."""

    def __init__(self, engine, path: str, bad: int) -> None:
        self._engine, self.path, self.bad = engine, path, bad
        self.requests: list[int] = []

    def read(self, items):
        items = list(items)
        self.requests.append(len(items))
        results = self._engine.read(items)
        for n, item in enumerate(items):
            file, offset, _ = item
            if file.path == self.path and offset <= self.bad < offset + item_nbytes(item):
                results[n] = IoError(errno.EIO, file.path, offset, op="read")
        return results

    def __getattr__(self, name):
        return getattr(self._engine, name)


def _put_back_to_back(tmp_path, engine, count: int, size: int):
    backend = open_backend("bucket", tmp_path / "s", engine=engine, direct=True)
    items = [(f"n{n}", payload(f"n{n}", size)) for n in range(count)]
    assert all(r.ok for r in backend.batch_write(items))
    starts = [backend.locate(key).record_offset for key, _ in items]
    assert starts == [n * record_size(size) for n in range(count)], "not back to back"
    return backend, items


def test_neighbouring_small_records_are_read_as_one_request(tmp_path, engine):
    """32 records of 64 KiB written together: read in their order, they come in requests
    of up to JOINED_READ_MAX bytes (15, 15 and 2 records), each verified on its own; in
    another order, each is a request of its own."""
    backend, items = _put_back_to_back(tmp_path, engine, 32, SMALL_VALUE_MAX)
    recording = backend.engine = _Recording(backend.engine)
    keys = [key for key, _ in items]
    buffers = [memoryview(bytearray(SMALL_VALUE_MAX)) for _ in keys]
    assert backend.batch_read(keys, buffers) == [SMALL_VALUE_MAX] * 32
    assert all(bytes(b) == value for b, (_, value) in zip(buffers, items))
    (requests,) = recording.reads
    per_request = JOINED_READ_MAX // record_size(SMALL_VALUE_MAX)
    assert [item[2].nbytes for item in requests] == [
        per_request * record_size(SMALL_VALUE_MAX)] * 2 + [
        (32 - 2 * per_request) * record_size(SMALL_VALUE_MAX)]
    recording.reads.clear()
    shuffled = keys[1::2] + keys[::2]
    buffers = [memoryview(bytearray(SMALL_VALUE_MAX)) for _ in keys]
    assert backend.batch_read(shuffled, buffers) == [SMALL_VALUE_MAX] * 32
    assert [len(items) for items in recording.reads] == [32]
    assert all(bytes(b) == dict(items)[k] for b, k in zip(buffers, shuffled))
    backend.close()


def test_a_bad_block_in_a_joined_read_costs_only_its_own_record(tmp_path, engine):
    """The joined request fails; its records are read again one by one, so only the one
    on the bad block is an IO_ERROR and its neighbours come back whole."""
    backend, items = _put_back_to_back(tmp_path, engine, 8, 20 * KiB)
    bad = backend.locate("n3")
    backend.engine = faulty = _BadBlock(backend.engine, bad.path, bad.offset + 5 * KiB)
    keys = [key for key, _ in items]
    buffers = [memoryview(bytearray(20 * KiB)) for _ in keys]
    got = backend.batch_read(keys, buffers)
    assert got == [20 * KiB] * 3 + [ReadStatus.IO_ERROR] + [20 * KiB] * 4, got
    assert faulty.requests == [1, 8], "one joined request, then each record alone"
    assert all(bytes(buffers[n]) == items[n][1] for n in range(8) if n != 3)
    assert backend.read("n4") == items[4][1]
    backend.close()


def test_a_corrupt_record_in_a_joined_read_is_the_only_miss(tmp_path, engine):
    backend, items = _put_back_to_back(tmp_path, engine, 6, 9000)
    flip_byte(backend.locate("n2").path, backend.locate("n2").offset + 100)
    keys = [key for key, _ in items]
    buffers = [memoryview(bytearray(b"\xaa" * 9000)) for _ in keys]
    assert backend.batch_read(keys, buffers) == [9000] * 2 + [ReadStatus.CORRUPT] + [9000] * 3
    assert bytes(buffers[2]) == bytes(9000), "bytes that failed their check were left"
    assert all(bytes(buffers[n]) == items[n][1] for n in range(6) if n != 2)
    backend.close()


def test_a_read_short_at_the_end_of_the_file_fails_only_what_it_cut(tmp_path, engine):
    """A data file cut short under a joined read (another tool, a torn copy): the
    records before the cut come back, the ones past it are misses, never stale bytes."""
    backend, items = _put_back_to_back(tmp_path, engine, 5, 10 * KiB)
    cut = backend.locate("n3")
    os.truncate(cut.path, cut.record_offset + 4 * KiB)
    keys = [key for key, _ in items]
    buffers = [memoryview(bytearray(10 * KiB)) for _ in keys]
    got = backend.batch_read(keys, buffers)
    assert got[:3] == [10 * KiB] * 3 and all(s < 0 for s in got[3:]), got
    assert all(bytes(buffers[n]) == items[n][1] for n in range(3))
    assert all(bytes(buffers[n]) == bytes(10 * KiB) for n in (3, 4))
    backend.close()
