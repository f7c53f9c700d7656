"""Vectored items (a list or tuple of buffers per item), on both engines, buffered and
O_DIRECT: the same per-item contract as one buffer of their total length."""

from __future__ import annotations

import errno
import os
import random

import pytest

from kvstored.native import IoError, direct, probe_uring
from kvstored.native.engine import MAX_PIECES
from kvstored.native.posix import IOV_MAX
from tests.conftest import require
from tests.native.helpers import read_a_pipe_in_two_parts
from tests.native.test_engine_io import BLOCK, aligned, fill, open_and_closed, unaligned


def _no_bounce(monkeypatch) -> None:
    """Makes any use of the bounce path fail the test."""
    def refuse(*args, **kwargs):
        raise AssertionError("an aligned vectored item went through the bounce path")

    monkeypatch.setattr(direct, "read_through_bounce", refuse)
    monkeypatch.setattr(direct, "write_through_bounce", refuse)


def _pieces(*chunks: bytes, make=aligned) -> list[memoryview]:
    views = []
    for chunk in chunks:
        view = make(len(chunk))
        view[:] = chunk
        views.append(view)
    return views


def _vec_sqes(engine) -> int | None:
    return engine.ring_stats()["vec_sqes"] if engine.name == "uring" else None


def test_aligned_pieces_go_straight_to_the_file(engine, tmp_path, direct, monkeypatch):
    """A record laid out as [header block, value, padding block] is written and read back
    as one request per record, from and into the caller's memory."""
    _no_bounce(monkeypatch)
    path = tmp_path / "data"
    records = [(os.urandom(BLOCK), os.urandom(32 * BLOCK), bytes(BLOCK)) for _ in range(5)]
    size = 34 * BLOCK
    with engine.open(path, os.O_RDWR | os.O_CREAT, direct=direct) as f:
        before = _vec_sqes(engine)
        items = [(f, i * size, _pieces(*record)) for i, record in enumerate(records)]
        items[2] = (f, 2 * size, tuple(items[2][2]))  # a tuple works as well as a list
        assert engine.write(items) == [size] * 5
        assert engine.fsync([f]) == [0]
        backs = [[aligned(BLOCK), aligned(32 * BLOCK), aligned(BLOCK)] for _ in records]
        assert engine.read([(f, i * size, backs[i]) for i in reversed(range(5))]) == [size] * 5
        if before is not None:
            assert _vec_sqes(engine) - before == 10  # one READV/WRITEV per item, no more
    assert path.read_bytes() == b"".join(b"".join(record) for record in records)
    for record, back in zip(records, backs):
        assert [bytes(view) for view in back] == list(record)


def test_unaligned_pieces_and_offsets_match_a_model(engine, tmp_path, direct):
    """Odd offsets, piece lengths and addresses (the bounce path on O_DIRECT), mixed in one
    batch with single-buffer items, some sharing edge blocks with vectored ones."""
    rng = random.Random(11)
    path = tmp_path / "data"
    model = bytearray(os.urandom(64 * BLOCK))
    fill(path, model)
    writes, reads, at = [], [], 3
    with engine.open(path, os.O_RDWR, direct=direct) as f:
        while at < len(model) - 6 * BLOCK:
            if rng.random() < 0.6:
                lengths = [rng.randrange(0, 2 * BLOCK) for _ in range(rng.randrange(1, 5))]
                chunks = [os.urandom(n) for n in lengths]
                views = _pieces(*chunks, make=lambda n: unaligned(n, rng.randrange(1, 64)))
                data = b"".join(chunks)
                writes.append((f, at, views))
                reads.append((f, at, [unaligned(n, 5) for n in lengths]))
            else:
                data = os.urandom(rng.randrange(1, 3 * BLOCK))
                writes.append((f, at, data))
                reads.append((f, at, bytearray(len(data))))
            model[at:at + len(data)] = data
            at += len(data) + rng.choice([0, 0, 1, 700])  # often back to back
        lengths = [len(data) if not isinstance(data, list) else sum(v.nbytes for v in data)
                   for _, _, data in writes]
        assert engine.write(writes) == lengths
        assert engine.read(reads) == lengths
    assert path.read_bytes() == model
    for _, offset, buffers in reads:
        got = (b"".join(bytes(v) for v in buffers) if isinstance(buffers, list)
               else bytes(buffers))
        assert got == model[offset:offset + len(got)]


def test_a_short_read_at_end_of_file_fills_the_pieces_in_order(engine, tmp_path, direct):
    path = tmp_path / "data"
    data = os.urandom(10_000)
    fill(path, data)
    with engine.open(path, os.O_RDONLY, direct=direct) as f:
        straddle = [aligned(BLOCK) for _ in range(4)]
        for view in straddle:
            view[:] = b"\xaa" * BLOCK
        beyond = [aligned(BLOCK), aligned(BLOCK)]
        odd = [unaligned(3000, 7), unaligned(3000, 9), unaligned(3000, 1)]
        results = engine.read([(f, 0, straddle), (f, 3 * BLOCK, beyond), (f, 4001, odd)])
    assert results == [10_000, 0, 10_000 - 4001]
    assert bytes(straddle[0]) + bytes(straddle[1]) + bytes(straddle[2][:10_000 - 2 * BLOCK]) \
        == data
    if not direct:  # O_DIRECT may zero what lies past the end: only the count is promised
        assert bytes(straddle[3]) == b"\xaa" * BLOCK
    assert b"".join(bytes(v) for v in odd)[:10_000 - 4001] == data[4001:]


def test_more_pieces_than_one_call_takes(make_engine, tmp_path, direct):
    """Thousands of pieces in one item (beyond IOV_MAX), and more vectored items than the
    ring holds."""
    engine = make_engine(queue_depth=4)
    path = tmp_path / "data"
    count = 3 * IOV_MAX + 17
    blocks = [bytes([i % 251]) * BLOCK for i in range(count)]
    with engine.open(path, os.O_RDWR | os.O_CREAT, direct=direct) as f:
        before = _vec_sqes(engine)
        assert engine.write([(f, 0, _pieces(*blocks))]) == [count * BLOCK]
        if before is not None:
            assert _vec_sqes(engine) - before == 4  # 1024 iovecs per entry at most
        backs = [aligned(BLOCK) for _ in range(count)]
        assert engine.read([(f, 0, backs)]) == [count * BLOCK]
        assert all(bytes(b) == block for b, block in zip(backs, blocks))
        # 300 two-piece items through a ring of 4.
        items = [(f, i * 2 * BLOCK, [aligned(BLOCK), aligned(BLOCK)]) for i in range(300)]
        assert engine.read(items) == [2 * BLOCK] * 300
        assert all(bytes(item[2][1]) == blocks[2 * i + 1] for i, item in enumerate(items))
    assert path.read_bytes() == b"".join(blocks)


def test_empty_pieces_and_empty_items(engine, tmp_path, direct):
    path = tmp_path / "data"
    fill(path, b"abc")
    with engine.open(path, os.O_RDWR, direct=direct) as f:
        assert engine.write([(f, 10, []), (f, 20, [b"", bytearray()])]) == [0, 0]
        assert os.path.getsize(path) == 3
        assert engine.write([(f, 3, [b"", b"de", b"", b"f"])]) == [3]
        first, second = bytearray(2), bytearray(4)
        assert engine.read([(f, 0, [first, bytearray(), second])]) == [6]
    assert path.read_bytes() == b"abcdef"
    assert bytes(first) == b"ab" and bytes(second) == b"cdef"


def test_malformed_pieces_raise_before_any_io(engine, tmp_path):
    path = tmp_path / "data"
    fill(path, b"before")
    with engine.open(path, os.O_RDWR) as f:
        with pytest.raises(TypeError, match="item 1, piece 1: a read needs a writable"):
            engine.read([(f, 0, bytearray(1)), (f, 0, [bytearray(1), b"ro"])])
        with pytest.raises(TypeError, match=r"item 0: piece 1 is a list; .* not nested"):
            engine.write([(f, 0, [b"a", [b"b"]])])
        with pytest.raises(TypeError, match="item 0, piece 0: a str is not a buffer"):
            engine.write([(f, 0, ["text"])])
        with pytest.raises(ValueError, match="item 0, piece 2: the buffer is not contiguous"):
            engine.write([(f, 0, [b"a", b"b", memoryview(b"abcd")[::2]])])
        with pytest.raises(ValueError, match=f"at most {MAX_PIECES}"):
            engine.write([(f, 0, [b"x"] * (MAX_PIECES + 1))])
        with pytest.raises(ValueError, match="item 0: the offset must be >= 0"):
            engine.write([(f, 2**63 - 3, [b"ab", b"cd"])])
    assert path.read_bytes() == b"before"


def test_a_failed_vectored_item_reports_its_whole_length(engine, tmp_path):
    path = tmp_path / "data"
    good, closed = open_and_closed(engine, path, b"0123456789")
    results = engine.write([(closed, 2, [b"xy", b"z"]), (good, 0, [b"A", b"B"])])
    assert results[1] == 2
    assert isinstance(results[0], IoError) and results[0].errno == errno.EBADF
    assert results[0].length == 3 and results[0].offset == 2 and results[0].op == "write"
    good.close()
    assert path.read_bytes() == b"AB23456789"


def test_enospc_in_a_vectored_write(engine, small_tmpfs, direct):
    path = small_tmpfs / "full"
    chunk = 128 << 10
    with engine.open(path, os.O_RDWR | os.O_CREAT, direct=direct) as f:
        items = [(f, i * 2 * chunk, _pieces(bytes([i + 1]) * chunk, bytes([i + 101]) * chunk))
                 for i in range(8)]  # 2 MiB into a 1 MiB file system
        results = engine.write(items)
        failures = [r for r in results if isinstance(r, IoError)]
        assert failures, results
        assert all(r.errno == errno.ENOSPC and r.length == 2 * chunk for r in failures)
        assert all(0 <= r.done < 2 * chunk for r in failures)
        for i, result in enumerate(results):
            if isinstance(result, int):
                back = [aligned(chunk), aligned(chunk)]
                assert engine.read([(f, i * 2 * chunk, back)]) == [2 * chunk]
                assert bytes(back[0]) == bytes([i + 1]) * chunk
                assert bytes(back[1]) == bytes([i + 101]) * chunk


def test_posix_continues_short_transfers_inside_a_piece(tmp_path, monkeypatch):
    """preadv/pwritev may move fewer bytes than asked (signals, some file systems); the
    posix engine then resumes mid-piece. The real calls are made to stop every 1000
    bytes."""
    from kvstored.native.posix import PosixEngine

    real = {"preadv": os.preadv, "pwritev": os.pwritev}

    def stingy(name):
        def call(fd, buffers, offset):
            allowed, cut = 1000, []
            for buffer in buffers:
                view = memoryview(buffer)[:allowed]
                cut.append(view)
                allowed -= view.nbytes
                if not allowed:
                    break
            return real[name](fd, cut, offset)
        return call

    monkeypatch.setattr(os, "preadv", stingy("preadv"))
    monkeypatch.setattr(os, "pwritev", stingy("pwritev"))
    engine = PosixEngine(threads=1)
    path = tmp_path / "data"
    chunks = [os.urandom(n) for n in (1500, 10, 2990, 4096)]
    with engine.open(path, os.O_RDWR | os.O_CREAT) as f:
        assert engine.write([(f, 7, [bytes(c) for c in chunks])]) == [8596]
        backs = [bytearray(len(c)) for c in chunks]
        assert engine.read([(f, 7, backs)]) == [8596]
    assert [bytes(b) for b in backs] == chunks
    assert path.read_bytes()[7:] == b"".join(chunks)


def test_uring_completes_a_short_read_across_pieces():
    """A pipe hands out what it has: the first READV fills one piece and part of the
    next, the ring asks for the rest from there."""
    require("uring", *probe_uring())
    from kvstored.native.uring import UringEngine

    pieces = [bytearray(3), bytearray(4), bytearray(4)]
    result, stats = read_a_pipe_in_two_parts(UringEngine(queue_depth=4), pieces)
    assert result == [11]
    assert [bytes(p) for p in pieces] == [b"fir", b"st s", b"econ"]
    assert stats["resubmits"] >= 1 and stats["vec_sqes"] >= 2


def test_an_engine_without_vectored_requests_gets_them_joined(tmp_path, direct):
    """An engine whose ``_run`` takes single buffers only (USRBIO) still honours the
    contract: the base class joins each vectored item and scatters reads back."""
    from kvstored.native.direct import VECTORED
    from kvstored.native.posix import PosixEngine

    class SingleBuffersOnly(PosixEngine):
        native_vectored = False

        def _run(self, code, ops):
            assert all(op is None or op[3] is not VECTORED for op in ops)
            return super()._run(code, ops)

    engine = SingleBuffersOnly(threads=2)
    path = tmp_path / "data"
    fill(path, bytes(8 * BLOCK))
    chunks = [os.urandom(BLOCK), os.urandom(3 * BLOCK), os.urandom(100)]
    with engine.open(path, os.O_RDWR, direct=direct) as f:
        assert engine.write([(f, BLOCK, _pieces(*chunks)), (f, 0, [b"ab", b"c"]),
                             (f, 7 * BLOCK, [])]) == [4 * BLOCK + 100, 3, 0]
        backs = [aligned(BLOCK), aligned(3 * BLOCK), unaligned(BLOCK)]
        assert engine.read([(f, BLOCK, backs), (f, 0, [bytearray(1), bytearray(2)])]) == [
            5 * BLOCK, 3]
    assert [bytes(b) for b in backs[:2]] == chunks[:2]
    assert bytes(backs[2][:100]) == chunks[2] and bytes(backs[2][100:]) == bytes(BLOCK - 100)
    assert path.read_bytes()[:3] == b"abc"
