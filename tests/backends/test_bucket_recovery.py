"""Recovery of the bucket backend at open: crash windows (a real process killed at each
step of the write, delete and eviction protocols), damaged indexes and data files,
leftovers, duplicate keys, and the resumed sequences."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kvstored.backends.bucket.index import FLAG_DELETED, read_index
from kvstored.backends.bucket.layout import data_name, index_name
from kvstored.sdk.registry import open_backend
from kvstored.sdk.testing import payload
from kvstored.sdk.types import ProblemKind, RepairAction

OPTIONS = {"engine": "posix"}
BASE = [(f"base/{n}", payload(f"base/{n}", 10_000 + n)) for n in range(5)]
NEW = [(f"new/{n}", payload(f"new/{n}", 7_000 + n)) for n in range(3)]


def _open(path: Path, **extra):
    return open_backend("bucket", path, **OPTIONS, **extra)


def _files(path: Path) -> list[str]:
    return sorted(p.name for p in (path / "buckets").iterdir())


def _crash_during(path: Path, patch: str, action: str) -> None:
    """In a child process: write BASE (acknowledged), apply ``patch`` (which makes the
    process die with os._exit at a chosen step), then run ``action``; it must die."""
    script = textwrap.dedent(f"""
        import os, sys
        from kvstored.sdk.registry import open_backend
        from kvstored.sdk.testing import payload
        BASE = {[k for k, _ in BASE]!r}
        NEW = {[k for k, _ in NEW]!r}
        backend = open_backend("bucket", sys.argv[1], **{OPTIONS!r})
        assert all(r.ok for r in backend.batch_write(
            [(k, payload(k, 10_000 + n)) for n, k in enumerate(BASE)]))
        def die(*args, **kwargs):
            os._exit(9)
        {patch}
        {action}
        sys.exit("the action finished: the crash point was never reached")
    """)
    child = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True,
                           text=True, timeout=60)
    assert child.returncode == 9, child.stderr


def _assert_base_intact(backend) -> None:
    for key, value in BASE:
        assert backend.read(key) == value


WRITE_NEW = "backend.batch_write([(k, payload(k, 7_000 + n)) for n, k in enumerate(NEW)])"


def test_crash_after_data_before_index(tmp_path):
    """Killed after the data file was fdatasync'd, before its index: the bucket was never
    acknowledged, so its data file is removed and its objects are absent."""
    store = tmp_path / "s"
    _crash_during(store, "import kvstored.backends.bucket.writer as w; w.write_indexes = die",
                  WRITE_NEW)
    assert data_name(2) in _files(store) and index_name(2) not in _files(store)
    backend = _open(store)
    assert data_name(2) not in _files(store)
    assert not any(backend.batch_contains([k for k, _ in NEW]))
    _assert_base_intact(backend)
    report = backend.check()
    assert [p.kind for p in report.problems] == [ProblemKind.TORN_WRITE]
    assert report.problems[0].action is RepairAction.REMOVED
    assert backend.check(repair=True).problems
    assert not backend.check().problems


def test_crash_after_temporary_index_before_rename(tmp_path):
    store = tmp_path / "s"
    _crash_during(store, "os.replace = die", WRITE_NEW)
    assert ".0000000000000002.idx.tmp" in _files(store)
    backend = _open(store)
    assert _files(store) == [data_name(1), index_name(1)]
    assert not any(backend.batch_contains([k for k, _ in NEW]))
    _assert_base_intact(backend)
    assert {p.kind for p in backend.check().problems} == {ProblemKind.TORN_WRITE}


def test_crash_after_rename_before_directory_sync(tmp_path):
    """The index is in place: the bucket is complete, so it is kept (never acknowledged,
    but whole; the contract allows complete-or-absent)."""
    store = tmp_path / "s"
    _crash_during(store, "import kvstored.backends.bucket.index as i; i.fsync_dir = die",
                  WRITE_NEW)
    backend = _open(store)
    for key, value in NEW:
        assert backend.read(key) == value
    _assert_base_intact(backend)
    assert not backend.check().problems


def test_crash_between_eviction_unlinks(tmp_path):
    """Eviction removes the index first: killed before the data file goes, the next open
    removes the data file, and the evicted keys stay gone."""
    store = tmp_path / "s"
    patch = textwrap.dedent("""
        import kvstored.backends.bucket.backend as b
        real = b._unlink_quietly
        def unlink(path):
            if path.endswith(".data"):
                die()
            real(path)
        b._unlink_quietly = unlink
    """).replace("\n", "\n        ")
    _crash_during(store, patch, "backend.evict(1)")
    assert _files(store) == [data_name(1)]
    backend = _open(store)
    assert _files(store) == []
    assert backend.usage().objects == 0
    assert not any(backend.batch_contains([k for k, _ in BASE]))


def test_crash_before_delete_is_durable(tmp_path):
    """Killed before the index rewrite: the delete never returned, so the key may come
    back; it does, whole, and the store is consistent."""
    store = tmp_path / "s"
    _crash_during(store, "import kvstored.backends.bucket.backend as b; b.write_indexes = die",
                  "backend.batch_delete(['base/0'])")
    backend = _open(store)
    _assert_base_intact(backend)
    assert not backend.check().problems


def test_deletes_survive_reopen_and_empty_buckets_go(tmp_path):
    store = tmp_path / "s"
    backend = _open(store)
    backend.batch_write(BASE)
    backend.batch_write(NEW)
    assert backend.batch_delete(["base/1", "base/3"]) == [True, True]
    _, entries = read_index(str(store / "buckets" / index_name(1)))
    assert [e.key for e in entries if e.flags & FLAG_DELETED] == ["base/1", "base/3"]
    assert backend.batch_delete([k for k, _ in NEW]) == [True] * 3
    assert _files(store) == [data_name(1), index_name(1)]  # bucket 2 is gone whole
    usage = backend.usage()
    backend.close()
    backend = _open(store)
    assert backend.usage() == usage
    assert backend.batch_contains(["base/0", "base/1", "base/3", "new/0"]) == [
        True, False, False, False]


def test_key_live_in_two_buckets_resolves_by_sequence(tmp_path):
    """The state a crash between a delete's index rewrite and a later rewrite of the key
    would leave: the newer record wins, and the older is marked deleted for good."""
    store = tmp_path / "s"
    backend = _open(store)
    backend.batch_write([("k", b"old"), ("other", b"x")])
    old_index = (store / "buckets" / index_name(1)).read_bytes()
    backend.delete("k")
    backend.batch_write([("k", b"new")])
    backend.close()
    (store / "buckets" / index_name(1)).write_bytes(old_index)  # the delete "never happened"
    backend = _open(store)
    assert backend.read("k") == b"new"
    _, entries = read_index(str(store / "buckets" / index_name(1)))
    assert {e.key: e.flags for e in entries}["k"] & FLAG_DELETED
    backend.evict(10**12)
    backend.close()
    backend = _open(store)
    assert backend.read("k") is None, "an older value resurfaced"


@pytest.mark.parametrize("damage", ["index_missing_data", "data_short"])
def test_broken_bucket_is_dropped_and_quarantined(tmp_path, damage):
    store = tmp_path / "s"
    backend = _open(store)
    backend.batch_write(BASE)
    backend.batch_write(NEW)
    backend.close()
    buckets = store / "buckets"
    if damage == "index_missing_data":
        os.unlink(buckets / data_name(2))
    else:
        os.truncate(buckets / data_name(2), 4096)
    backend = _open(store)
    assert not any(backend.batch_contains([k for k, _ in NEW]))
    _assert_base_intact(backend)
    assert _files(store) == [data_name(1), index_name(1)]
    kept = sorted(p.name for p in (store / "quarantine").iterdir())
    assert any(name.endswith(index_name(2)) for name in kept), kept
    report = backend.check()
    assert len(report.problems) == 1
    assert report.problems[0].action is RepairAction.QUARANTINED
    assert report.problems[0].kind in (ProblemKind.INDEX_MISMATCH, ProblemKind.TORN_WRITE)
    assert backend.check(repair=True).ok
    assert not backend.check().problems
    assert backend.usage().objects == len(BASE)


def test_data_file_cut_short_keeps_the_records_inside_it(tmp_path):
    store = tmp_path / "s"
    backend = _open(store)
    backend.batch_write(BASE)
    ends = {k: backend.locate(k).record_offset + backend.locate(k).record_length
            for k, _ in BASE}
    backend.close()
    os.truncate(store / "buckets" / data_name(1), ends["base/2"])
    backend = _open(store)
    assert backend.batch_contains([k for k, _ in BASE]) == [True] * 3 + [False] * 2
    for key, value in BASE[:3]:
        assert backend.read(key) == value
    [problem] = backend.check().problems
    assert problem.kind is ProblemKind.TORN_WRITE and "2 record(s) past the end" in problem.detail
    assert problem.action is RepairAction.DROPPED_FROM_INDEX
    backend.close()
    assert _open(store).usage().objects == 3, "the rewritten index did not stick"


def test_sequences_resume_above_everything_on_disk(tmp_path):
    store = tmp_path / "s"
    backend = _open(store)
    backend.batch_write(BASE)
    top_seq = max(backend.stat(k).seq for k, _ in BASE)
    backend.close()
    (store / "buckets" / data_name(9)).write_bytes(b"never indexed")  # removed at open
    backend = _open(store)
    backend.batch_write([("later", b"v")])
    record = backend.stat("later")
    assert record.seq > top_seq
    assert Path(record.location.path).name == data_name(10)


def test_unknown_files_are_reported_and_quarantined(tmp_path):
    store = tmp_path / "s"
    backend = _open(store)
    backend.batch_write(BASE)
    stray = store / "buckets" / "notes.txt"
    stray.write_text("not ours")
    report = backend.check()
    assert [(p.kind, p.path) for p in report.problems] == [(ProblemKind.ORPHAN, str(stray))]
    assert backend.check(repair=True).ok
    assert not stray.exists()
    assert [p.read_text() for p in (store / "quarantine").iterdir()] == ["not ours"]
    assert not backend.check().problems


def test_wrong_backend_directory_is_refused(tmp_path):
    store = tmp_path / "s"
    open_backend("file-per-key", store).close()
    with pytest.raises(Exception, match="belongs to the 'file-per-key' backend"):
        _open(store)
