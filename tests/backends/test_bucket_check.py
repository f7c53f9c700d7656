"""check() and check(repair=True) of the bucket backend: what each finds, where the
evidence goes, and that a repaired store stays clean across a reopen."""

from __future__ import annotations

import json
import os
from pathlib import Path

from kvstored.backends.bucket.index import FLAG_QUARANTINED, read_index
from kvstored.sdk.registry import open_backend
from kvstored.sdk.testing import flip_byte, payload
from kvstored.sdk.types import ProblemKind, ReadStatus, RepairAction

ITEMS = [(f"c/{n}", payload(f"c/{n}", 20_000 + 4096 * n)) for n in range(6)]


def _open(path: Path):
    return open_backend("bucket", path, engine="posix")


def test_bad_record_is_copied_out_and_dropped_durably(tmp_path):
    store = tmp_path / "s"
    backend = _open(store)
    backend.batch_write(ITEMS)
    victim = backend.locate("c/2")
    with open(victim.path, "rb") as f:
        original = os.pread(f.fileno(), victim.record_length, victim.record_offset)
    flip_byte(victim.path, victim.offset + 7)
    report = backend.check()
    assert report.records_checked == 6
    assert [(p.kind, p.key, p.action) for p in report.problems] == [
        (ProblemKind.CORRUPT_RECORD, "c/2", None)]
    assert "checksum" in report.problems[0].detail
    assert backend.contains("c/2"), "check without repair must change nothing"

    report = backend.check(repair=True)
    assert report.ok and report.problems[0].action is RepairAction.QUARANTINED
    copies = sorted((store / "quarantine").glob("*.kvr"))
    assert len(copies) == 1 and report.problems[0].action_detail == str(copies[0])
    damaged = bytearray(original)
    damaged[4096 + 7] ^= 0xFF
    assert copies[0].read_bytes() == bytes(damaged), "the evidence is not the record"
    note = json.loads(copies[0].with_suffix(".json").read_text())
    assert note["key"] == "c/2" and note["offset"] == victim.record_offset
    assert note["source"] == victim.path and "checksum" in note["reason"]

    assert backend.batch_read(["c/2"], [memoryview(bytearray(40_000))]) == [ReadStatus.MISSING]
    _, entries = read_index(str(Path(victim.path).with_suffix(".idx")))
    assert {e.key: e.flags for e in entries}["c/2"] == FLAG_QUARANTINED
    assert backend.usage().logical_bytes == sum(len(v) for k, v in ITEMS if k != "c/2")
    assert not backend.check().problems
    usage = backend.usage()
    backend.close()
    backend = _open(store)
    assert backend.usage() == usage
    assert not backend.check().problems
    for key, value in ITEMS:
        assert backend.read(key) == (None if key == "c/2" else value)


def test_quarantining_the_last_record_removes_the_bucket(tmp_path):
    store = tmp_path / "s"
    backend = _open(store)
    backend.batch_write([("alone", payload("alone", 9000))])
    backend.batch_write([("other", b"o")])
    where = backend.locate("alone")
    flip_byte(where.path, where.offset)
    assert backend.check(repair=True).ok
    assert not os.path.exists(where.path)
    assert backend.usage().objects == 1
    assert not backend.check().problems


def test_damaged_index_is_rewritten_from_memory(tmp_path):
    store = tmp_path / "s"
    backend = _open(store)
    backend.batch_write(ITEMS)
    backend.delete("c/4")
    index = Path(backend.locate("c/0").path).with_suffix(".idx")
    flip_byte(str(index), 60)
    report = backend.check()
    assert [p.kind for p in report.problems] == [ProblemKind.INDEX_MISMATCH]
    assert backend.check(repair=True).ok
    assert not backend.check().problems
    backend.close()
    backend = _open(store)
    assert backend.usage().objects == 5 and not backend.contains("c/4")
    for key, value in ITEMS:
        if key != "c/4":
            assert backend.read(key) == value


def test_orphaned_bucket_files_are_reported(tmp_path):
    """Files of a bucket the store does not know, appearing while it is open."""
    store = tmp_path / "s"
    backend = _open(store)
    backend.batch_write(ITEMS[:2])
    buckets = store / "buckets"
    (buckets / "00000000000000ff.data").write_bytes(b"x" * 4096)
    (buckets / ".00000000000000fe.idx.tmp").write_bytes(b"y")
    kinds = sorted(p.kind.value for p in backend.check().problems)
    assert kinds == ["orphan", "torn-write"]
    assert backend.check(repair=True).ok
    assert sorted(p.name for p in buckets.iterdir()) == ["0000000000000001.data",
                                                         "0000000000000001.idx"]
    assert len(list((store / "quarantine").iterdir())) == 2
    assert not backend.check().problems
