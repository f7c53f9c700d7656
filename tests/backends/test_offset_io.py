"""Record I/O of the offset layout (offset and nvmeof): one vectored engine request per
record, the value moved straight from and into the caller's memory."""

from __future__ import annotations

import mmap

import pytest

from kvstored.native import IoError
from kvstored.sdk.registry import open_backend
from kvstored.sdk.testing import payload
from kvstored.sdk.types import ReadStatus

KiB = 1 << 10
SIZES = [0, 5000, 128 * KiB, 1024 * KiB + 100]


class _Recording:
    """Keeps every item the backend hands to its engine for records (the journal has
    its own reference to the engine and is not recorded)."""

    def __init__(self, engine, fail_reads: bool = False) -> None:
        self._engine = engine
        self.writes: list = []
        self.reads: list = []
        self.fail_reads = fail_reads

    def write(self, items):
        items = list(items)
        self.writes.append(items)
        return self._engine.write(items)

    def read(self, items):
        items = list(items)
        self.reads.append(items)
        if self.fail_reads:
            return [IoError(5, f.path, off, op="read") for f, off, _ in items]
        return self._engine.read(items)

    def __getattr__(self, name):
        return getattr(self._engine, name)


@pytest.mark.parametrize("direct", [False, True])
def test_each_record_is_one_request_from_and_into_the_callers_memory(tmp_path, engine,
                                                                    direct):
    backend = open_backend("offset", tmp_path / "s", capacity=64 << 20, engine=engine,
                           direct=direct)
    recording = backend._engine = _Recording(backend._engine)
    sources = []
    for n, size in enumerate(SIZES):
        memory = mmap.mmap(-1, max(size, 1))
        memory[:size] = payload(f"k{n}", size)
        sources.append(memory)
    items = [(f"k{n}", memoryview(m)[:size]) for n, (m, size) in enumerate(zip(sources, SIZES))]
    assert all(r.ok for r in backend.batch_write(items))
    (written,) = recording.writes
    assert len(written) == len(SIZES)  # one request per record
    for (_, _, pieces), source, size in zip(written, sources, SIZES):
        assert isinstance(pieces, list) and pieces[0].nbytes == 4 * KiB
        if size >= 4 * KiB:
            assert pieces[1].obj is source, "the value was copied instead of written"
        if direct and size % (4 * KiB):
            assert pieces[-1].nbytes == 4 * KiB  # the padded tail: no read-modify-write
    targets = [mmap.mmap(-1, max(size, 1)) for size in SIZES]
    views = [memoryview(t)[:size] for t, size in zip(targets, SIZES)]
    assert backend.batch_read([k for k, _ in items], views) == SIZES
    (read,) = recording.reads
    assert len(read) == len(SIZES)
    for (_, _, pieces), target, (key, _), size in zip(read, targets, items, SIZES):
        assert pieces[1].obj is target
        assert target[:size] == payload(key, size)
    del written, read, pieces, views
    backend.close()


def test_a_failed_record_read_is_an_io_error(tmp_path):
    backend = open_backend("offset", tmp_path / "s", capacity=16 << 20, engine="posix")
    backend.batch_write([("x", b"value")])
    backend._engine = _Recording(backend._engine, fail_reads=True)
    assert backend.batch_read(["x"], [memoryview(bytearray(8))]) == [ReadStatus.IO_ERROR]
    backend.close()


def test_a_record_cut_short_is_corrupt(tmp_path):
    """The volume file ends inside a record (a truncated copy of the volume): the
    vectored read comes back short, and the record is refused rather than returned."""
    backend = open_backend("offset", tmp_path / "s", capacity=16 << 20, engine="posix")
    value = payload("x", 64 * KiB)
    backend.batch_write([("x", value)])
    location = backend.locate("x")
    with open(location.path, "r+b") as f:
        f.truncate(location.offset + 10 * KiB)
    buffer = bytearray(len(value))
    assert backend.batch_read(["x"], [memoryview(buffer)]) == [ReadStatus.CORRUPT]
    assert backend.corrupt_reads == 1
    backend.close()
