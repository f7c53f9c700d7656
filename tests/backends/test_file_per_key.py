"""file-per-key specifics the conformance kit does not reach: reads and check verify
against the index (not a record's own header), and a failed read leaves nothing of the
bad bytes in the caller's buffer."""

from __future__ import annotations

import shutil
from pathlib import Path

from kvstored.sdk.registry import open_backend
from kvstored.sdk.types import ProblemKind, ReadStatus, RepairAction


def test_a_valid_record_that_is_not_the_indexed_one_fails_read_and_check(tmp_path):
    store = open_backend("file-per-key", tmp_path / "store")
    other = open_backend("file-per-key", tmp_path / "other")
    assert store.batch_write([("k", b"A" * 5000)])[0].ok
    assert other.batch_write([("k", b"B" * 5000)])[0].ok  # same key, seq and length
    path = store.locate("k").path
    other.close()
    # The other store's record is valid in itself (its header CRC and value CRC check):
    # only the index knows it is not the value that was written here.
    other_path = Path(path.replace("/store/", "/other/"))
    shutil.copyfile(other_path, path)
    assert other_path.read_bytes() == Path(path).read_bytes()

    buf = bytearray(b"\xaa" * 6000)
    assert store.batch_read(["k"], [memoryview(buf)]) == [ReadStatus.CORRUPT]
    assert bytes(buf[:5000]) == bytes(5000), "bytes that failed were left in the buffer"
    assert store.corrupt_reads == 1

    [problem] = store.check().problems
    assert problem.kind is ProblemKind.CORRUPT_RECORD and problem.key == "k"
    assert "not the one indexed" in problem.detail
    [problem] = store.check(repair=True).problems
    assert problem.action is RepairAction.QUARANTINED
    assert problem.action_detail and (tmp_path / "store" / "quarantine").is_dir()
    assert not store.contains("k") and not store.check().problems
    store.close()
    assert not open_backend("file-per-key", tmp_path / "store").contains("k")
