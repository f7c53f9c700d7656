"""The engine contract, run on both engines (posix and uring), buffered and O_DIRECT."""

from __future__ import annotations

import errno
import logging
import mmap
import os
import random
from functools import partial

import numpy as np
import pytest

from kvstored.native import IoError, IoFile, errors, sync_written, write_synced
from tests.conftest import run_threads

BLOCK = 4096


def aligned(size: int) -> memoryview:
    """Page-aligned memory, as O_DIRECT wants it."""
    return memoryview(mmap.mmap(-1, max(size, 1)))[:size]


def unaligned(size: int, shift: int = 3) -> memoryview:
    """Memory that starts ``shift`` bytes past a page boundary."""
    return memoryview(mmap.mmap(-1, size + shift))[shift:shift + size]


def fill(path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)


def open_and_closed(engine, path, data: bytes) -> tuple[IoFile, IoFile]:
    """``path`` filled with ``data``, opened twice by ``engine``: the first file is open,
    the second closed already (its descriptor is invalid)."""
    fill(path, data)
    good = engine.open(path, os.O_RDWR)
    closed = engine.open(path, os.O_RDWR)
    closed.close()
    return good, closed


def test_aligned_round_trip(engine, tmp_path, direct):
    path = tmp_path / "data"
    chunks = [os.urandom(64 << 10) for _ in range(6)]
    with engine.open(path, os.O_RDWR | os.O_CREAT, direct=direct) as f:
        assert f.direct is direct  # ext4 accepts O_DIRECT
        sources = []
        for chunk in chunks:
            buffer = aligned(len(chunk))
            buffer[:] = chunk
            sources.append(buffer)
        written = engine.write([(f, i * (64 << 10), sources[i]) for i in range(len(chunks))])
        assert written == [64 << 10] * len(chunks)
        assert engine.fsync([f]) == [0]
        targets = [aligned(64 << 10) for _ in chunks]
        # Read back in reverse order: results follow the batch order, not the file's.
        order = list(reversed(range(len(chunks))))
        got = engine.read([(f, i * (64 << 10), targets[i]) for i in order])
        assert got == [64 << 10] * len(chunks)
    assert [bytes(t) for t in targets] == chunks
    assert path.read_bytes() == b"".join(chunks)


def test_unaligned_offsets_lengths_and_buffers(engine, tmp_path, direct):
    """Unaligned writes change exactly their bytes (read-modify-write on O_DIRECT keeps
    the neighbours) and unaligned reads return exactly theirs."""
    rng = random.Random(7)
    path = tmp_path / "data"
    model = bytearray(os.urandom(40 * BLOCK))
    fill(path, model)
    # Non-overlapping items with odd offsets, lengths and buffer addresses.
    items, at = [], 5
    while at < len(model) - 3 * BLOCK:
        length = rng.randrange(1, 3 * BLOCK)
        items.append((at, length))
        at += length + rng.randrange(1, 2 * BLOCK)
    with engine.open(path, os.O_RDWR, direct=direct) as f:
        writes = []
        for offset, length in items:
            data = os.urandom(length)
            model[offset:offset + length] = data
            view = unaligned(length, shift=rng.randrange(1, 64))
            view[:] = data
            writes.append((f, offset, view))
        assert engine.write(writes) == [length for _, length in items]
        reads = [(f, offset, unaligned(length, shift=5)) for offset, length in items]
        assert engine.read(reads) == [length for _, length in items]
    assert path.read_bytes() == model
    for (offset, length), (_, _, view) in zip(items, reads):
        assert bytes(view) == model[offset:offset + length]


def test_unaligned_writes_sharing_blocks_in_one_batch(engine, tmp_path, direct):
    """Neighbouring unaligned writes in one batch share edge blocks; none may undo another."""
    path = tmp_path / "data"
    fill(path, b"\xee" * (3 * BLOCK))
    pieces = [(0, b"a" * 100), (100, b"b" * 100), (200, b"c" * 3996), (4196, b"d" * 10),
              (4206, b"e" * 5000)]
    with engine.open(path, os.O_RDWR, direct=direct) as f:
        assert engine.write([(f, off, data) for off, data in pieces]) == [
            len(data) for _, data in pieces]
    expected = bytearray(b"\xee" * (3 * BLOCK))
    for offset, data in pieces:
        expected[offset:offset + len(data)] = data
    assert path.read_bytes() == expected


def test_unaligned_write_past_the_end_keeps_the_exact_size(engine, tmp_path, direct):
    path = tmp_path / "data"
    fill(path, b"x" * 100)
    with engine.open(path, os.O_RDWR, direct=direct) as f:
        assert engine.write([(f, 100, b"y" * 50)]) == [50]
        assert os.path.getsize(path) == 150
        # A hole, an unaligned tail, and an aligned item further out in the same batch.
        aligned_item = aligned(BLOCK)
        aligned_item[:] = b"z" * BLOCK
        assert engine.write([(f, 10_000, b"w" * 7), (f, 4 * BLOCK, aligned_item)]) == [7, BLOCK]
        assert os.path.getsize(path) == 5 * BLOCK
        assert engine.write([(f, 5 * BLOCK + 1, b"v")]) == [1]
    content = path.read_bytes()
    assert len(content) == 5 * BLOCK + 2
    assert content[:150] == b"x" * 100 + b"y" * 50
    assert content[150:10_000] == bytes(10_000 - 150)
    assert content[10_000:10_007] == b"w" * 7
    assert content[4 * BLOCK:5 * BLOCK] == b"z" * BLOCK
    assert content[5 * BLOCK:] == b"\0v"


def test_reads_past_the_end_of_file(engine, tmp_path, direct):
    path = tmp_path / "data"
    data = os.urandom(10_000)
    fill(path, data)
    with engine.open(path, os.O_RDONLY, direct=direct) as f:
        tail, beyond, straddle, odd = aligned(BLOCK), aligned(BLOCK), aligned(4 * BLOCK), \
            unaligned(9000)
        results = engine.read([(f, 2 * BLOCK, tail), (f, 5 * BLOCK, beyond),
                               (f, 0, straddle), (f, 1001, odd)])
    assert results == [10_000 - 2 * BLOCK, 0, 10_000, 8999]
    assert bytes(tail[:10_000 - 2 * BLOCK]) == data[2 * BLOCK:]
    assert bytes(straddle[:10_000]) == data
    assert bytes(odd[:8999]) == data[1001:]


def test_zero_length_items(engine, tmp_path, direct):
    path = tmp_path / "data"
    fill(path, b"abc")
    with engine.open(path, os.O_RDWR, direct=direct) as f:
        assert engine.read([(f, 0, bytearray()), (f, 12345, bytearray())]) == [0, 0]
        assert engine.write([(f, 3, b""), (f, 7, memoryview(b""))]) == [0, 0]
        assert engine.read([]) == [] and engine.write([]) == [] and engine.fsync([]) == []
    assert path.read_bytes() == b"abc"


def test_batch_larger_than_the_ring(make_engine, tmp_path, direct):
    engine = make_engine(queue_depth=4)
    path = tmp_path / "data"
    count = 600
    blocks = [bytes([i % 251]) * BLOCK for i in range(count)]
    with engine.open(path, os.O_RDWR | os.O_CREAT, direct=direct) as f:
        sources = []
        for block in blocks:
            view = aligned(BLOCK)
            view[:] = block
            sources.append(view)
        assert engine.write([(f, i * BLOCK, sources[i]) for i in range(count)]) == [BLOCK] * count
        targets = [aligned(BLOCK) for _ in range(count)]
        assert engine.read([(f, i * BLOCK, targets[i]) for i in range(count)]) == [BLOCK] * count
    assert all(bytes(t) == b for t, b in zip(targets, blocks))


def test_a_bad_descriptor_fails_its_item_only(engine, tmp_path):
    path = tmp_path / "data"
    good, closed = open_and_closed(engine, path, b"0123456789")
    never_opened = IoFile(987_654, "/nonexistent/never-opened")
    first, second = bytearray(4), bytearray(4)
    results = engine.read([(good, 0, first), (closed, 0, bytearray(4)),
                           (never_opened, 8, bytearray(4)), (good, 6, second)])
    assert results[0] == 4 and results[3] == 4
    assert bytes(first) == b"0123" and bytes(second) == b"6789"
    for result, expected_path, offset in ((results[1], str(path), 0),
                                          (results[2], "/nonexistent/never-opened", 8)):
        assert isinstance(result, IoError)
        assert result.errno == errno.EBADF
        assert result.path == expected_path and result.offset == offset and result.op == "read"
        assert expected_path in str(result) and "EBADF" in str(result)
    assert "closed" in str(results[1])
    written = engine.write([(closed, 0, b"zz"), (good, 0, b"ab")])
    assert isinstance(written[0], IoError) and written[1] == 2
    synced = engine.fsync([closed, good], datasync=False)
    assert isinstance(synced[0], IoError) and synced[0].op == "fsync" and synced[1] == 0
    # Nothing else broke: the engine goes on working.
    assert engine.read([(good, 0, first)]) == [4] and bytes(first) == b"ab23"
    good.close()


def test_enospc_is_a_per_item_error(engine, small_tmpfs, direct):
    path = small_tmpfs / "full"
    chunk = 256 << 10
    with engine.open(path, os.O_RDWR | os.O_CREAT, direct=direct) as f:
        sources = []
        for i in range(8):  # 2 MiB into a 1 MiB file system
            view = aligned(chunk)
            view[:] = bytes([i + 1]) * chunk
            sources.append(view)
        results = engine.write([(f, i * chunk, sources[i]) for i in range(8)])
        failures = [r for r in results if isinstance(r, IoError)]
        assert failures, results
        assert all(r.errno == errno.ENOSPC and r.path == str(path) for r in failures)
        assert all(0 <= r.done < chunk for r in failures)
        # What was reported written reads back intact; the engine still works.
        for i, result in enumerate(results):
            if isinstance(result, int):
                assert result == chunk
                target = aligned(chunk)
                assert engine.read([(f, i * chunk, target)]) == [chunk]
                assert bytes(target) == bytes([i + 1]) * chunk
        assert engine.fsync([f]) == [0]


def test_many_threads_at_once(engine, tmp_path, direct):
    path = tmp_path / "data"
    threads, rounds, size = 8, 25, 2 * BLOCK
    fill(path, bytes(threads * size))
    f = engine.open(path, os.O_RDWR, direct=direct)

    def worker(index: int) -> None:
        rng = random.Random(index)
        source, target = aligned(size), aligned(size)
        for round_number in range(rounds):
            source[:] = rng.randbytes(size)
            offset = index * size
            assert engine.write([(f, offset, source)]) == [size]
            assert engine.read([(f, offset, target)]) == [size], round_number
            assert bytes(target) == bytes(source)

    try:
        raised = run_threads((partial(worker, i) for i in range(threads)), timeout=60)
    finally:
        f.close()
    assert not raised, raised[0]


def test_numpy_buffers_and_offsets(engine, tmp_path):
    path = tmp_path / "data"
    values = np.arange(1000, dtype=np.float32)
    with engine.open(path, os.O_RDWR | os.O_CREAT) as f:
        assert engine.write([(f, np.int64(8), values)]) == [values.nbytes]
        back = np.empty_like(values)
        assert engine.read([(f, np.uint32(8), back)]) == [values.nbytes]
    assert np.array_equal(back, values)


def test_malformed_batches_raise_before_any_io(engine, tmp_path):
    path = tmp_path / "data"
    fill(path, b"before")
    with engine.open(path, os.O_RDWR) as f:
        with pytest.raises(TypeError, match="item 1: a read needs a writable buffer"):
            engine.read([(f, 0, bytearray(2)), (f, 0, b"read-only")])
        with pytest.raises(ValueError, match="item 1: the offset must be >= 0"):
            engine.write([(f, 0, b"after!"), (f, -1, b"x")])
        with pytest.raises(ValueError, match="item 0: the offset must be >= 0"):
            engine.write([(f, 2**63 - 2, b"xy")])
        with pytest.raises(ValueError, match="item 0: the offset must be an int"):
            engine.write([(f, 1.5, b"x")])
        with pytest.raises(TypeError, match="item 0: expected an IoFile"):
            engine.write([(f.fd, 0, b"x")])
        with pytest.raises(TypeError, match=r"item 0: expected \(IoFile, offset, buffer\)"):
            engine.read([(f, 0)])
        with pytest.raises(TypeError, match="is not a buffer"):
            engine.write([(f, 0, "text")])
        with pytest.raises(ValueError, match="not contiguous"):
            engine.write([(f, 0, memoryview(b"abcdef")[::2])])
    assert path.read_bytes() == b"before"


def test_fixed_buffer_round_trip(engine, tmp_path, direct):
    staging = mmap.mmap(-1, 1 << 20)
    registered = engine.register_buffer(staging)
    assert registered is (engine.name == "uring")  # root may pin 1 MiB; posix has none
    assert engine.register_buffer(staging) is registered  # idempotent
    view = memoryview(staging)
    payload = os.urandom(256 << 10)
    view[:len(payload)] = payload
    path = tmp_path / "data"
    with engine.open(path, os.O_RDWR | os.O_CREAT, direct=direct) as f:
        before = engine.ring_stats() if engine.name == "uring" else None
        # Aligned slices of the staging buffer, and one unaligned item (bounced on O_DIRECT).
        assert engine.write([(f, 0, view[:128 << 10]), (f, 128 << 10, view[128 << 10:256 << 10]),
                             (f, 300_001, view[3:1000])]) == [128 << 10, 128 << 10, 997]
        back = view[512 << 10:768 << 10]
        assert engine.read([(f, 0, back)]) == [256 << 10]
        assert bytes(back) == payload
        if before is not None:
            after = engine.ring_stats()
            assert after["fixed_sqes"] - before["fixed_sqes"] >= 3
    assert path.read_bytes()[300_001:301_000] == payload[3:1000]


def test_a_file_system_without_o_direct_falls_back_to_buffered(engine, ramfs, caplog,
                                                               monkeypatch):
    monkeypatch.setattr(errors, "_logged", set())  # forget what earlier tests logged
    caplog.set_level(logging.WARNING, logger="kvstored.native")
    files = [engine.open(ramfs / f"f{i}", os.O_RDWR | os.O_CREAT | os.O_EXCL, direct=True)
             for i in range(3)]
    assert [f.direct for f in files] == [False] * 3
    lines = [r for r in caplog.records if "refuses O_DIRECT" in r.getMessage()]
    assert len(lines) == 1  # once per file system, not once per file
    assert engine.write([(f, 1, b"hello") for f in files]) == [5] * 3
    buffers = [bytearray(6) for _ in files]
    assert engine.read([(f, 0, b) for f, b in zip(files, buffers)]) == [6] * 3
    assert all(bytes(b) == b"\0hello" for b in buffers)
    for f in files:
        f.close()


def test_unaligned_direct_write_to_a_write_only_file_says_what_to_do(engine, tmp_path):
    path = tmp_path / "data"
    fill(path, bytes(BLOCK))
    with engine.open(path, os.O_WRONLY, direct=True) as f:
        aligned_block = aligned(BLOCK)
        result, = engine.write([(f, 10, b"unaligned")])
        assert engine.write([(f, 0, aligned_block)]) == [BLOCK]  # aligned needs no read
    assert isinstance(result, IoError) and result.errno == errno.EBADF
    assert "open the file O_RDWR" in str(result)


def test_open_names_the_file_it_cannot_open(engine, tmp_path):
    with pytest.raises(FileNotFoundError) as info:
        engine.open(tmp_path / "missing" / "file", os.O_RDONLY, direct=True)
    assert "missing" in str(info.value)


def test_an_unaligned_tail_write_does_not_cut_an_append_made_meanwhile(tmp_path):
    """The rounding trim only undoes this batch's own growth: bytes another writer
    appended while the batch ran survive it."""
    from kvstored.native import direct, posix

    path = tmp_path / "shared.dat"
    path.write_bytes(b"\0" * 8192)
    fd = os.open(path, os.O_RDWR)
    try:
        def run_then_append(code, ops):
            outcomes = posix._run_serial(code, ops)
            if code == direct.WRITE:  # another writer appends while ours is in flight
                os.pwrite(fd, b"X" * 8192, 16384)
            return outcomes

        data = memoryview(b"y" * 100)
        outcomes = direct.write_through_bounce(run_then_append, [None],
                                               {0: (fd, 8192, data)})
        assert outcomes[0][0] == 100
        assert os.fstat(fd).st_size == 16384 + 8192
        assert os.pread(fd, 8192, 16384) == b"X" * 8192
        assert os.pread(fd, 100, 8192) == b"y" * 100
    finally:
        os.close(fd)


def test_an_unaligned_tail_write_alone_is_cut_back_to_its_end(tmp_path):
    from kvstored.native import direct, posix

    path = tmp_path / "alone.dat"
    path.write_bytes(b"\0" * 4096)
    fd = os.open(path, os.O_RDWR)
    try:
        outcomes = direct.write_through_bounce(posix._run_serial, [None],
                                               {0: (fd, 4096, memoryview(b"z" * 10))})
        assert outcomes[0][0] == 10 and os.fstat(fd).st_size == 4096 + 10
    finally:
        os.close(fd)


def test_write_synced_syncs_each_written_file_once_and_reports_per_item(make_engine,
                                                                         tmp_path):
    """The write-then-fsync every backend uses: an item is durable, or it carries the
    error of its write or of its file's sync; a file no write reached is not synced."""
    engine = make_engine()
    a = engine.open(tmp_path / "a", os.O_RDWR | os.O_CREAT)
    b = engine.open(tmp_path / "b", os.O_RDWR | os.O_CREAT)
    results = write_synced(engine, [(a, 0, b"one"), (b, 0, b"two"), (a, 3, b"three")])
    assert results == [3, 3, 5]
    assert (tmp_path / "a").read_bytes() == b"onethree"
    closed = engine.open(tmp_path / "c", os.O_RDWR | os.O_CREAT)
    closed.close()
    failed = write_synced(engine, [(closed, 0, b"x"), (a, 8, b"!")])
    assert isinstance(failed[0], IoError) and failed[0].op == "write" and failed[1] == 1
    # A write that went through, in a file whose sync fails, is not reported durable.
    synced = sync_written(engine, [closed, b, closed], [7, IoError(5, "b", 0, op="write"), 9])
    assert [type(r) for r in synced] == [IoError, IoError, IoError]
    assert synced[0].op == "fdatasync" and synced[1].op == "write" and synced[2] is synced[0]
    with pytest.raises(ValueError):
        sync_written(engine, [a], [])
    a.close()
    b.close()
