"""Crash windows of the offset layout: checkpoint + journal replay, deletes, reuse.

``crash(backend)`` leaves the volume as kill -9 does: every write of this backend is
synchronous (written and fdatasync'd before the call returns), so the only thing a kill
skips is the closing checkpoint, and ``crash`` skips exactly that. One test kills a real
writer process as well.
"""

from __future__ import annotations

import json
import os
from functools import partial

import pytest

from kvstored.backends.offset.layout import encode_checkpoint
from kvstored.sdk.errors import (
    BackendBusyError,
    CapacityError,
    CorruptionError,
    InvalidRequestError,
)
from kvstored.sdk.registry import open_backend
from kvstored.sdk.testing import flip_byte, payload
from kvstored.sdk.types import ProblemKind, ReadStatus, RepairAction, WriteOutcome
from tests.backends.conftest import kill_9_after_ack
from tests.conftest import run_threads

MiB = 1 << 20
SMALL = 16 * MiB  # a small volume keeps these tests quick and the disk empty


def crash(backend) -> None:
    """Drop the backend as a killed process would: no closing checkpoint (the kernel
    drops a dead process's locks, so this does too)."""
    backend._closed = True
    backend._file.close()
    backend._release_holds()


def open_offset(path, **options):
    options.setdefault("capacity", SMALL)
    options.setdefault("engine", "posix")
    return open_backend("offset", path, **options)


def write_all(backend, items) -> None:
    results = backend.batch_write(items)
    assert all(r.outcome is WriteOutcome.WRITTEN for r in results), results


def items(prefix: str, count: int, size: int = 20_000) -> list[tuple[str, bytes]]:
    return [(f"{prefix}/{i}", payload(f"{prefix}/{i}", size + i)) for i in range(count)]


def assert_values(backend, expected) -> None:
    for key, value in expected:
        assert backend.read(key) == value, key


def test_journal_replay_after_crash(store_dir):
    backend = open_offset(store_dir)
    first = items("a", 10)
    write_all(backend, first)
    backend.checkpoint()
    second = items("b", 10)
    write_all(backend, second)  # only in the journal
    crash(backend)
    backend = open_offset(store_dir)
    assert_values(backend, first + second)
    assert backend.usage().objects == 20
    backend.close()


def _delete_every_third(backend, objects) -> list[str]:
    gone = [k for k, _ in objects[::3]]
    backend.batch_delete(gone)
    return gone


def _evict_some(backend, objects) -> list[str]:
    victims = backend.evict(60_000)
    assert victims
    return victims


@pytest.mark.parametrize("prefix,count,remove", [("d", 12, _delete_every_third),
                                                 ("v", 10, _evict_some)],
                         ids=["delete", "evict"])
def test_what_is_removed_after_a_checkpoint_stays_removed_after_a_crash(store_dir, prefix,
                                                                          count, remove):
    backend = open_offset(store_dir)
    objects = items(prefix, count)
    write_all(backend, objects)
    backend.checkpoint()  # the removed keys are in the checkpoint...
    gone = remove(backend, objects)  # ...and only the journal's tombstones remove them
    crash(backend)
    backend = open_offset(store_dir)
    assert not any(backend.batch_contains(gone))
    assert_values(backend, [kv for kv in objects if kv[0] not in gone])
    backend.close()


def test_delete_before_any_checkpoint_stays_deleted(store_dir):
    backend = open_offset(store_dir)
    write_all(backend, items("e", 4))
    backend.batch_delete(["e/1"])
    crash(backend)
    backend = open_offset(store_dir)
    assert backend.batch_contains(["e/0", "e/1", "e/2"]) == [True, False, True]
    backend.close()


def test_reused_space_never_resurrects_the_old_record(store_dir):
    backend = open_offset(store_dir)
    write_all(backend, [("old", payload("old", 50_000))])
    backend.checkpoint()
    old_place = backend.locate("old").record_offset
    backend.batch_delete(["old"])
    write_all(backend, [("new", payload("new", 50_000))])
    assert backend.locate("new").record_offset == old_place, "the space was not reused"
    crash(backend)
    backend = open_offset(store_dir)
    assert not backend.contains("old")
    assert backend.read("new") == payload("new", 50_000)
    assert not backend.check().problems
    backend.close()


def test_unacknowledged_record_with_bad_value_is_left_out(store_dir):
    """A record whose header landed but whose value did not (a torn batch) is dropped at
    replay: its value fails the CRC."""
    backend = open_offset(store_dir)
    write_all(backend, items("ok", 3))
    write_all(backend, [("torn", payload("torn", 30_000))])
    where = backend.locate("torn")
    crash(backend)
    flip_byte(where.path, where.offset + 100)
    backend = open_offset(store_dir)
    assert not backend.contains("torn")
    assert_values(backend, items("ok", 3))
    backend.close()


def test_torn_checkpoint_falls_back_to_the_previous_one(store_dir):
    """A checkpoint cut short by a crash: the other slot and the journal (which is only
    restarted after a checkpoint is durable) still hold everything."""
    backend = open_offset(store_dir)
    first = items("p", 5)
    write_all(backend, first)
    backend.checkpoint()
    second = items("q", 5)
    write_all(backend, second)
    geometry, generation = backend.geometry, backend.generation
    image = encode_checkpoint(geometry, generation + 1, *backend._snapshot_locked())
    path = backend.volume_file.path
    crash(backend)
    fd = os.open(path, os.O_WRONLY)
    try:  # the first block of the next checkpoint landed, the rest did not
        os.pwrite(fd, image[:4096], geometry.slot_offsets[(generation + 1) % 2])
    finally:
        os.close(fd)
    backend = open_offset(store_dir)
    assert_values(backend, first + second)
    # Recovery wrote a fresh checkpoint over the torn one (same slot, same generation).
    assert backend.generation == generation + 1
    assert not backend.check().problems
    backend.close()


def test_full_journal_forces_checkpoints(store_dir):
    backend = open_offset(store_dir, capacity=4 * MiB)  # a 64 KiB journal: 16 entries
    before = backend.generation
    objects = [(f"j/{i}", payload(f"j/{i}", 1000)) for i in range(60)]
    for item in objects:
        write_all(backend, [item])
    assert backend.generation >= before + 3
    crash(backend)
    backend = open_offset(store_dir, capacity=4 * MiB)
    assert_values(backend, objects)
    backend.close()


def test_checkpoint_bytes_bounds_replay(store_dir):
    backend = open_offset(store_dir, checkpoint_bytes=200_000)
    before = backend.generation
    write_all(backend, items("c", 20))  # about 500 KB of records
    assert backend.generation > before
    crash(backend)
    backend = open_offset(store_dir, checkpoint_bytes=200_000)
    assert_values(backend, items("c", 20))
    backend.close()


def test_writers_racing_checkpoints_lose_nothing(store_dir):
    backend = open_offset(store_dir, capacity=8 * MiB, checkpoint_bytes=100_000)
    errors: list[str] = []

    def writer(w: int) -> None:
        for key, value in items(f"w{w}", 25, 2_000):
            [result] = backend.batch_write([(key, value)])
            if result.outcome is not WriteOutcome.WRITTEN:
                errors.append(str(result))
        backend.batch_delete([f"w{w}/0", f"w{w}/1"])

    raised = run_threads(partial(writer, w) for w in range(4))
    assert not errors and not raised, (errors, raised)
    crash(backend)
    backend = open_offset(store_dir, capacity=8 * MiB)
    for w in range(4):
        expected = items(f"w{w}", 25, 2_000)
        assert backend.batch_contains([f"w{w}/0", f"w{w}/1"]) == [False, False]
        assert_values(backend, expected[2:])
    assert not backend.check().problems
    backend.close()


def test_lru_order_survives_reopen(store_dir):
    backend = open_offset(store_dir, policy="lru")
    write_all(backend, [("a", b"1" * 9000), ("b", b"2" * 9000), ("c", b"3" * 9000)])
    backend.read("a")  # a becomes the most recently used
    backend.close()
    backend = open_offset(store_dir, policy="lru")
    assert backend.evict(1) == ["b"]
    backend.close()


def test_index_area_full_evicts_or_fails(store_dir):
    key = "k" * 1000  # about 1 KiB of index per object
    backend = open_offset(store_dir, index_bytes=4096, auto_evict=False)
    fits = backend.geometry.index_capacity // (38 + 1001)  # 38 bytes + the key per entry
    results = backend.batch_write([(f"{i}{key}", b"v") for i in range(fits + 1)])
    assert [r.outcome for r in results[:fits]] == [WriteOutcome.WRITTEN] * fits
    assert isinstance(results[-1].error, CapacityError)
    assert "index" in str(results[-1].error)
    backend.close()
    evicted: list[str] = []
    backend = open_offset(store_dir, on_evict=evicted.extend)
    write_all(backend, [(f"x{key}", b"v")])
    assert evicted and not backend.contains(evicted[0])
    backend.close()


def test_checkpoint_damage_is_found_and_repaired(store_dir):
    backend = open_offset(store_dir)
    write_all(backend, items("r", 5))
    backend.checkpoint()
    slot = backend.geometry.slot_offsets[backend.generation % 2]
    flip_byte(backend.volume_file.path, slot + 100)
    report = backend.check()
    assert [p.kind for p in report.problems] == [ProblemKind.INDEX_MISMATCH]
    report = backend.check(repair=True)
    assert report.ok
    assert not backend.check().problems
    crash(backend)
    backend = open_offset(store_dir)
    assert_values(backend, items("r", 5))
    backend.close()


def test_repair_copies_the_record_out_and_it_stays_out(store_dir):
    backend = open_offset(store_dir)
    write_all(backend, items("y", 4))
    where = backend.locate("y/2")
    flip_byte(where.path, where.offset + 7)
    [problem] = backend.check(repair=True).problems
    assert problem.key == "y/2" and problem.action is RepairAction.QUARANTINED
    [copy] = list((store_dir / "quarantine").glob("*.kvr"))
    assert problem.action_detail == str(copy)
    raw = copy.read_bytes()
    assert len(raw) == where.record_length and b"y/2" in raw[:4096]
    note = json.loads(copy.with_suffix(".json").read_text())
    assert note["key"] == "y/2" and note["offset"] == where.record_offset
    crash(backend)  # the drop is journalled: it holds without a checkpoint
    backend = open_offset(store_dir)
    assert not backend.contains("y/2")
    assert backend.batch_contains(["y/0", "y/1", "y/3"]) == [True] * 3
    backend.close()


def test_damaged_superblock_refuses_to_open(store_dir):
    open_offset(store_dir).close()
    flip_byte(str(store_dir / "volume.kvo"), 20)
    with pytest.raises(CorruptionError, match="superblock"):
        open_offset(store_dir)


def test_unknown_layout_version_is_refused(store_dir):
    open_offset(store_dir).close()
    import struct

    from crc32c import crc32c

    path = store_dir / "volume.kvo"
    with open(path, "r+b") as f:
        block = bytearray(f.read(4096))
        struct.pack_into("<I", block, 8, 99)
        struct.pack_into("<I", block, 96, crc32c(bytes(block[:96])))
        f.seek(0)
        f.write(block)
    with pytest.raises(InvalidRequestError, match="version 99"):
        open_offset(store_dir)


def test_both_checkpoints_lost_refuses_to_open(store_dir):
    backend = open_offset(store_dir)
    write_all(backend, items("z", 2))
    backend.checkpoint()
    geometry, path = backend.geometry, backend.volume_file.path
    backend.close()
    for slot in geometry.slot_offsets:
        flip_byte(path, slot)
    with pytest.raises(CorruptionError, match="neither checkpoint slot"):
        open_offset(store_dir)


def test_capacity_mismatch_is_refused(store_dir):
    open_offset(store_dir).close()
    with pytest.raises(InvalidRequestError, match="resizing is not supported"):
        open_offset(store_dir, capacity=2 * SMALL)
    open_offset(store_dir, capacity=None).close()  # none means "as formatted"


def test_second_opener_is_refused(store_dir):
    backend = open_offset(store_dir)
    with pytest.raises(BackendBusyError, match="in use by this process"):
        open_offset(store_dir)
    backend.close()
    open_offset(store_dir).close()  # released by close, at once


def test_too_small_a_volume_is_refused(store_dir):
    with pytest.raises(InvalidRequestError, match="too small"):
        open_offset(store_dir, capacity=300_000)


WRITER = """
import sys
from kvstored.sdk.registry import open_backend
backend = open_backend("offset", sys.argv[1], capacity=16 << 20, engine=sys.argv[2],
                       checkpoint_bytes=1 << 40)
backend.batch_write([(f"k{i}", bytes([i]) * (5000 + i)) for i in range(30)])
backend.checkpoint()
backend.batch_delete([f"k{i}" for i in range(0, 30, 3)])
backend.batch_write([(f"n{i}", bytes([i]) * 7000) for i in range(10)])
print("ACK", flush=True)
sys.stdin.read()
"""


def test_kill_9_keeps_acknowledged_writes_and_deletes(store_dir, engine):
    kill_9_after_ack(WRITER, str(store_dir), engine)
    backend = open_offset(store_dir, engine=engine)
    for i in range(30):
        expected = None if i % 3 == 0 else bytes([i]) * (5000 + i)
        assert backend.read(f"k{i}") == expected
    for i in range(10):
        assert backend.read(f"n{i}") == bytes([i]) * 7000
    assert backend.usage().objects == 30
    backend.close()


def test_reads_report_damage_as_corrupt_not_bytes(store_dir):
    backend = open_offset(store_dir)
    write_all(backend, [("h", payload("h", 9000))])
    where = backend.locate("h")
    flip_byte(where.path, where.record_offset + 30)  # inside the header's write time
    buf = bytearray(9000)
    assert backend.batch_read(["h"], [memoryview(buf)]) == [ReadStatus.CORRUPT]
    assert backend.corrupt_reads == 1
    backend.close()


class JournalFails:
    """The real engine, except that writes into the journal region fail with EIO (a
    dying disk): what the write and delete paths do when they cannot journal."""

    def __init__(self, engine, geometry):
        self.engine, self.geometry = engine, geometry
        self.failing = True

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def write(self, items):
        from kvstored.native import IoError

        items = list(items)
        start = self.geometry.journal_offset
        end = start + self.geometry.journal_size
        results = self.engine.write([i for i in items if not self._hit(i, start, end)])
        out = iter(results)
        return [IoError(5, f.path, off, op="write", length=len(buf))
                if self._hit((f, off, buf), start, end) else next(out)
                for f, off, buf in items]

    def _hit(self, item, start, end) -> bool:
        return self.failing and start <= item[1] < end


def test_failed_journal_write_fails_the_items_and_leaves_nothing(store_dir):
    backend = open_offset(store_dir)
    write_all(backend, [("before", b"ok")])
    used = backend._alloc.used_bytes
    failing = JournalFails(backend._engine, backend.geometry)
    backend._engine = backend._journal._engine = failing
    results = backend.batch_write([("x", b"1" * 5000), ("y", b"2")])
    assert all(r.outcome is WriteOutcome.FAILED for r in results)
    assert "journal" in str(results[0].error)
    assert not any(backend.batch_contains(["x", "y"]))
    with pytest.raises(Exception, match="journal"):
        backend.batch_delete(["before"])
    assert backend.read("before") == b"ok", "a delete that could not be journalled undid"
    backend._engine.failing = False
    # The failed items could not even be cancelled, so their space stays held until the
    # next open rather than being reused under a journal entry that may have landed.
    assert backend._alloc.used_bytes > used
    write_all(backend, [("after", b"fine")])
    crash(backend)
    backend = open_offset(store_dir)
    assert backend.batch_contains(["before", "x", "y", "after"]) == [True, False, False, True]
    assert not backend.check().problems
    backend.close()
