"""The uring engine's C batch builder (native/batch.c): plain batches are built, run and
answered in one C call, every other batch takes engine.py's general path, and both give
the same per-item results."""

from __future__ import annotations

import errno
import mmap
import os

import numpy as np
import pytest

from kvstored.native import IoError, probe_uring
from kvstored.native.posix import PosixEngine
from tests.conftest import require


@pytest.fixture
def uring():
    require("uring", *probe_uring())
    from kvstored.native import uring as module

    if module._batch is None:
        pytest.fail("kvstored.native._batch was not built (setup.py's BATCH_EXTENSION); "
                    "the uring engine runs on its general path alone")
    return module.UringEngine(queue_depth=8)


class _CountingRun:
    """Wraps the engine's Python request builder (``_run``) to count its batches."""

    def __init__(self, engine):
        self.engine, self.real, self.batches = engine, engine._run, 0
        engine._run = self

    def __call__(self, code, ops):
        self.batches += 1
        return self.real(code, ops)


def _data_file(tmp_path, size=1 << 20):
    data = np.random.default_rng(16).bytes(size)
    path = tmp_path / "data"
    path.write_bytes(data)
    return path, data


def test_a_plain_batch_never_reaches_the_python_request_builder(uring, tmp_path):
    path, data = _data_file(tmp_path)
    counting = _CountingRun(uring)
    staging = mmap.mmap(-1, 64 * 4096)
    views = [memoryview(staging)[i * 4096:(i + 1) * 4096] for i in range(64)]
    offsets = [(i * 7919 % 256) * 4096 for i in range(64)]
    for direct in (False, True):
        with uring.open(path, os.O_RDWR, direct=direct) as f:
            assert uring.read([(f, at, view) for at, view in zip(offsets, views)]) == [4096] * 64
            for at, view in zip(offsets, views):
                assert view == data[at:at + 4096]
            items = [(f, (300 + i) * 4096, view) for i, view in enumerate(views)]
            assert uring.write(items) == [4096] * 64
            if not direct:  # buffered: any offset, length and address is plain
                assert uring.read([(f, 0, bytearray(100)), (f, 5, bytearray(3))]) == [100, 3]
    assert counting.batches == 0
    assert path.read_bytes()[300 * 4096:364 * 4096] == bytes(staging)


def test_vectored_items_are_built_in_c_too(uring, tmp_path):
    """A vectored item whose pieces O_DIRECT takes as they are (any pieces when buffered)
    is built in C as well: its pieces read back to back, empty ones skipped."""
    path, data = _data_file(tmp_path)
    counting = _CountingRun(uring)
    staging = mmap.mmap(-1, 16 * 4096)
    pages = [memoryview(staging)[i * 4096:(i + 1) * 4096] for i in range(16)]
    with uring.open(path, os.O_RDONLY, direct=True) as f:
        items = [(f, 8192 * i, [pages[2 * i], memoryview(bytearray()), pages[2 * i + 1]])
                 for i in range(8)]
        assert uring.read(items) == [8192] * 8
    assert bytes(staging) == data[:16 * 4096]
    odd = [bytearray(3), bytearray(5)]
    with uring.open(path, os.O_RDONLY) as f:
        assert uring.read([(f, 7, odd), (f, len(data) - 4, (bytearray(2), bytearray(9)))]) \
            == [8, 4]
    assert odd[0] + odd[1] == data[7:15]
    assert counting.batches == 0
    assert uring.ring_stats()["vec_sqes"] >= 9


@pytest.mark.parametrize("odd_one", ["unaligned-direct", "unaligned-vectored-direct",
                                     "numpy-offset"])
def test_a_batch_with_one_odd_item_takes_the_general_path_whole(uring, tmp_path, odd_one):
    """The C builder runs all of a batch or none of it: one item it does not handle sends
    the whole batch through engine.py, which starts no I/O twice."""
    path, data = _data_file(tmp_path)
    counting = _CountingRun(uring)
    plain = bytearray(4096)
    odd = bytearray(10)
    with uring.open(path, os.O_RDONLY, direct=odd_one.endswith("direct")) as f:
        item = {"unaligned-direct": (f, 4096 + 3, odd),
                "unaligned-vectored-direct": (f, 4096 + 3, [memoryview(odd)[:4],
                                                            memoryview(odd)[4:]]),
                "numpy-offset": (f, np.int64(4096 + 3), odd)}[odd_one]
        assert uring.read([(f, 0, plain), item]) == [4096, 10]
    assert counting.batches >= 1
    assert plain == data[:4096] and odd == data[4099:4109]


def test_failures_are_the_same_ioerrors_on_both_paths(uring, tmp_path):
    """A closed file, a read past the end and a write to a read-only descriptor fail item
    by item, with the same errno, path, offset and detail as the posix engine gives."""
    path, _ = _data_file(tmp_path, 10_000)
    outcomes = {}
    for engine in (uring, PosixEngine(queue_depth=8)):
        closed = engine.open(path)
        closed.close()
        with engine.open(path) as f:
            reads = engine.read([(f, 0, bytearray(100)), (closed, 0, bytearray(10)),
                                 (f, 9_990, bytearray(100)), (f, 20_000, bytearray(5))])
            writes = engine.write([(f, 0, b"abc")])
        outcomes[engine.name] = reads + writes
    for got in outcomes.values():
        assert got[0] == 100 and got[2] == 10 and got[3] == 0
        for error, number in ((got[1], errno.EBADF), (got[4], errno.EBADF)):
            assert isinstance(error, IoError) and error.errno == number
    assert [repr(r) for r in outcomes["uring"]] == [repr(r) for r in outcomes["posix"]]


def test_buffers_are_let_go_when_the_batch_returns(uring, tmp_path):
    """The C builder holds every buffer while the kernel uses it (a bytearray cannot be
    resized meanwhile) and releases each one after, on success and on failure alike."""
    path, _ = _data_file(tmp_path)
    buffers = [bytearray(4096) for _ in range(4)]
    with uring.open(path) as f:
        closed = uring.open(path)
        closed.close()
        results = uring.read([(f, 0, buffers[0]), (closed, 0, buffers[1]),
                              (f, 4096, buffers[2]), (f, 1 << 30, buffers[3])])
    assert results[0] == 4096 and isinstance(results[1], IoError) and results[3] == 0
    for buffer in buffers:
        buffer.extend(b"x")  # BufferError if an export were still held


def test_bad_items_raise_before_any_io(uring, tmp_path):
    path, _ = _data_file(tmp_path)
    with uring.open(path, os.O_RDWR) as f:
        with pytest.raises(TypeError, match="read-only"):
            uring.read([(f, 0, bytearray(8)), (f, 8, b"read-only")])
        with pytest.raises(ValueError, match="offset"):
            uring.write([(f, 0, b"x" * 8), (f, -1, b"y")])
        with pytest.raises(TypeError, match="IoFile"):
            uring.read([(f, 0, bytearray(8)), (f.fd, 8, bytearray(8))])
    assert path.read_bytes()[:8] != b"x" * 8
