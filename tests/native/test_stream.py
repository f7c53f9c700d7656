"""Batches in flight across calls: ``start_read``/``start_write`` and the streams built
on them (``read_stream``/``write_stream``), on both engines. The uring engine keeps later
batches in its ring while the caller looks at one batch's results (native/batch.c's
Pending, io_uring_core.c's kv_ring_push/kv_ring_wait); the posix engine runs each batch
to the end when it starts, with the same results."""

from __future__ import annotations

import mmap
import os
import threading

import numpy as np
import pytest

from kvstored.native import IoError, probe_uring
from tests.conftest import require
from tests.native.helpers import run_python

BLOCK = 4096


@pytest.fixture
def data_file(tmp_path):
    data = np.random.default_rng(16).bytes(1 << 20)
    path = tmp_path / "data"
    path.write_bytes(data)
    return path, data


def _batches(file, count: int, per_batch: int, memory: mmap.mmap):
    """``count`` batches of random block reads into two alternating halves of ``memory``
    (a batch's buffers are reused two batches later, once its results were yielded)."""
    rng = np.random.default_rng(3)
    for number in range(count):
        base = (number % 2) * per_batch
        offsets = (rng.integers(0, 256, per_batch) * BLOCK).tolist()
        yield [(file, at, memoryview(memory)[(base + i) * BLOCK:(base + i + 1) * BLOCK])
               for i, at in enumerate(offsets)]


def test_a_read_stream_gives_each_batch_what_read_gives(engine, data_file, direct):
    """Twenty batches of 24 random blocks, on a queue of 8: every batch spans several
    fills of the ring, and the next one is in flight while this one is checked."""
    path, data = data_file
    memory = mmap.mmap(-1, 2 * 24 * BLOCK)
    with engine.open(path, os.O_RDONLY, direct=direct) as f:
        expected = [[(at, data[at:at + BLOCK]) for _, at, _ in batch]
                    for batch in _batches(f, 20, 24, memory)]
        seen = 0
        for number, results in enumerate(engine.read_stream(_batches(f, 20, 24, memory))):
            assert results == [BLOCK] * 24
            base = (number % 2) * 24
            for i, (at, want) in enumerate(expected[number]):
                assert memory[(base + i) * BLOCK:(base + i + 1) * BLOCK] == want, (number, at)
            seen += 1
    assert seen == 20


def test_a_write_stream_writes_every_batch(engine, tmp_path, direct):
    path = tmp_path / "out"
    memory = mmap.mmap(-1, 64 * BLOCK)
    memory[:] = np.random.default_rng(5).bytes(len(memory))
    with engine.open(path, os.O_RDWR | os.O_CREAT, direct=direct) as f:
        batches = ([(f, (8 * n + i) * BLOCK, memoryview(memory)[(8 * n + i) * BLOCK:
                                                                (8 * n + i + 1) * BLOCK])
                    for i in range(8)] for n in range(8))
        assert list(engine.write_stream(batches, ahead=3)) == [[BLOCK] * 8] * 8
    assert path.read_bytes() == bytes(memory)


def test_a_started_batch_reports_errors_item_by_item(engine, data_file):
    path, _ = data_file
    closed = engine.open(path)
    closed.close()
    with engine.open(path) as f:
        pending = engine.start_read([(f, 0, bytearray(100)), (closed, 0, bytearray(10)),
                                     (f, (1 << 20) - 10, bytearray(100))])
        results = pending.wait()
        assert pending.wait() is results  # a second wait gives the same answer
    assert results[0] == 100 and results[2] == 10
    assert isinstance(results[1], IoError) and results[1].detail == "the IoFile was closed"


def test_a_malformed_batch_raises_when_it_is_started(engine, data_file):
    path, _ = data_file
    with engine.open(path) as f:
        with pytest.raises(TypeError, match="item 1"):
            engine.start_read([(f, 0, bytearray(4)), (f, 0, b"read-only")])
        with pytest.raises(ValueError, match="ahead"):
            engine.read_stream([], ahead=-1)


def test_closing_a_stream_early_waits_for_the_batches_in_flight(engine, data_file):
    """The buffers of batches still in flight are handed back only once the kernel is
    done with them: a bytearray held by a request cannot be resized (BufferError)."""
    path, data = data_file
    buffers = [bytearray(BLOCK) for _ in range(12)]
    with engine.open(path) as f:
        batches = [[(f, (4 * n + i) * BLOCK, buffers[4 * n + i]) for i in range(4)]
                   for n in range(3)]
        stream = engine.read_stream(batches, ahead=2)
        assert next(stream) == [BLOCK] * 4
        stream.close()
    for number, buffer in enumerate(buffers):
        assert buffer == data[number * BLOCK:(number + 1) * BLOCK]
        buffer.extend(b"x")  # BufferError if an export were still held


@pytest.fixture
def uring():
    require("uring", *probe_uring())
    from kvstored.native.uring import UringEngine

    return UringEngine(queue_depth=8)


def test_a_later_batch_finishes_while_an_earlier_one_waits():
    """Batch A reads a pipe nobody has written, batch B a file: B's wait returns while A
    is still in the ring (a wait waits for its own batch only, and B went to the kernel
    although A was pushed first and is not done), and A's results arrive once the pipe
    is written. In a child process, so that a hang fails the test."""
    require("uring", *probe_uring())
    out = run_python("""
import json, os, tempfile
from kvstored.native import IoFile
from kvstored.native.uring import UringEngine
engine = UringEngine(queue_depth=8)
read_end, write_end = os.pipe()
pipe = IoFile(read_end, "pipe")
with tempfile.NamedTemporaryFile() as data:
    data.write(b"0123456789" * 1000)
    data.flush()
    with engine.open(data.name) as f:
        first, later = bytearray(5), [bytearray(10) for _ in range(20)]
        a = engine.start_read([(pipe, 0, first)])
        b = engine.start_read([(f, 10 * i, later[i]) for i in range(20)])
        b_results = b.wait()
        os.write(write_end, b"hello")
        a_results = a.wait()
print(json.dumps({"b": b_results, "later": [x.decode() for x in later],
                  "a": a_results, "first": first.decode()}))
""", timeout=30)
    assert out["b"] == [10] * 20 and set(out["later"]) == {"0123456789"}
    assert out["a"] == [5] and out["first"] == "hello"


def test_read_while_a_batch_is_pending_on_the_same_thread(uring, data_file):
    """A plain read() on a thread whose ring holds a started batch runs after it and
    leaves it intact."""
    path, data = data_file
    with uring.open(path, os.O_RDONLY, direct=True) as f:
        memory = mmap.mmap(-1, 48 * BLOCK)
        views = [memoryview(memory)[i * BLOCK:(i + 1) * BLOCK] for i in range(48)]
        pending = uring.start_read([(f, i * BLOCK, views[i]) for i in range(24)])
        assert uring.read([(f, (100 + i) * BLOCK, views[24 + i]) for i in range(24)]) \
            == [BLOCK] * 24
        assert pending.wait() == [BLOCK] * 24
    assert bytes(memory[:24 * BLOCK]) == data[:24 * BLOCK]
    assert bytes(memory[24 * BLOCK:]) == data[100 * BLOCK:124 * BLOCK]


def test_a_batch_is_waited_for_by_the_thread_that_started_it(uring, data_file):
    path, data = data_file
    buffer = bytearray(BLOCK)
    with uring.open(path) as f:
        pending = uring.start_read([(f, BLOCK, buffer)])
        raised = []

        def other() -> None:
            try:
                pending.wait()
            except RuntimeError as exc:
                raised.append(str(exc))

        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
        assert raised and "thread that started it" in raised[0]
        assert pending.wait() == [BLOCK]
    assert buffer == data[BLOCK:2 * BLOCK]


def test_a_batch_dropped_unwaited_is_finished_before_its_buffers_go(uring, data_file):
    path, data = data_file
    buffer = bytearray(BLOCK)
    with uring.open(path) as f:
        pending = uring.start_read([(f, 2 * BLOCK, buffer)])
        del pending
        buffer.extend(b"x")  # the request let go of it: no export is held
        assert uring.read([(f, 0, bytearray(10))]) == [10]  # the ring is still sound
    assert buffer[:BLOCK] == data[2 * BLOCK:3 * BLOCK]


def test_plain_batches_stay_in_c_when_streamed(uring, data_file):
    """A stream of plain batches never reaches the Python request builder."""
    path, _ = data_file
    calls = []
    real = uring._run
    uring._run = lambda code, ops: calls.append(code) or real(code, ops)
    memory = mmap.mmap(-1, 2 * 16 * BLOCK)
    with uring.open(path, os.O_RDONLY, direct=True) as f:
        assert list(uring.read_stream(_batches(f, 6, 16, memory))) == [[BLOCK] * 16] * 6
    assert calls == []
