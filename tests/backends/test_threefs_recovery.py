"""Recovery and repair of one ``3fs`` node: the crash windows of its write, delete,
eviction and compaction paths, and damage to its journal and shards, made for real on
disk (by killing a process, or by leaving the files as the crash would)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

import pytest

from kvstored.backends.threefs.journal import JOURNAL_NAME, Entry, Kind
from kvstored.backends.threefs.layout import shard_name
from kvstored.sdk.errors import CapacityError, CorruptionError
from kvstored.sdk.record import encode_header, record_size, value_checksum
from kvstored.sdk.registry import open_backend
from kvstored.sdk.testing import payload
from kvstored.sdk.types import ProblemKind, ReadStatus, RepairAction, WriteOutcome
from tests.conftest import scratch_fs

KiB = 1024


def _open(path, **options):
    options.setdefault("engine", "posix")
    options.setdefault("node_id", "n")
    return open_backend("3fs", path, **options)


def _node(path):
    return path / "default" / "n"


def _items(prefix, count, size):
    return [(f"{prefix}{i}", payload(f"{prefix}{i}", size)) for i in range(count)]


def _read(backend, key):
    record = backend.stat(key)
    buf = bytearray(record.size if record else 1)
    got = backend.batch_read([key], [memoryview(buf)])[0]
    return bytes(buf[:got]) if got >= 0 else ReadStatus(got)


def _opened_with(path, items, **options):
    """A node on ``path`` that has written ``items``, each in a batch of its own."""
    backend = _open(path, **options)
    for item in items:
        assert backend.batch_write([item])[0].outcome is WriteOutcome.WRITTEN
    return backend


def test_torn_journal_tail_is_cut_and_nothing_acknowledged_is_lost(tmp_path):
    items = _items("k", 10, 3000)
    backend = _opened_with(tmp_path, items)
    backend.close()
    journal = _node(tmp_path) / JOURNAL_NAME
    size = journal.stat().st_size
    torn = Entry(Kind.PUT, "torn", 1, 99, 0, 5, 0, 0).encode()[:30]
    with open(journal, "ab") as f:  # what a crash in the middle of an append leaves
        f.write(torn)
    backend = _open(tmp_path)
    assert journal.stat().st_size == size
    [kept] = (_node(tmp_path) / "quarantine").glob("*-journal-tail.kvj")
    assert kept.read_bytes() == torn, "the bytes cut off were not kept"
    for key, value in items:
        assert _read(backend, key) == value
    assert not backend.check().problems
    backend.batch_write([("after", b"tail")])
    backend.close()
    backend = _open(tmp_path)
    assert _read(backend, "after") == b"tail" and _read(backend, "k9") == items[9][1]
    backend.close()


def test_damaged_journal_entry_is_skipped_reported_and_repaired(tmp_path):
    items = _items("key-", 8, 2000)
    backend = _opened_with(tmp_path, items)
    backend.close()
    journal = _node(tmp_path) / JOURNAL_NAME
    raw = bytearray(journal.read_bytes())
    at = raw.index(b"key-3")
    raw[at - 20] ^= 0xFF  # inside the fixed part of key-3's put entry
    journal.write_bytes(bytes(raw))

    backend = _open(tmp_path)
    assert _read(backend, "key-3") == ReadStatus.MISSING
    for key, value in items:
        if key != "key-3":
            assert _read(backend, key) == value, "entries after the damage were lost"
    report = backend.check()
    [problem] = report.problems
    assert problem.kind is ProblemKind.CORRUPT_RECORD and problem.path == str(journal)
    report = backend.check(repair=True)
    assert report.ok and report.problems[0].action is RepairAction.REBUILT
    copies = list((_node(tmp_path) / "quarantine").glob(f"*{JOURNAL_NAME}"))
    assert str(copies[0]) in (report.problems[0].action_detail or "")
    assert len(copies) == 1 and copies[0].read_bytes() == bytes(raw)
    assert not backend.check().problems
    backend.close()
    backend = _open(tmp_path)
    assert not backend.check().problems
    assert {r.key for r in backend.scan()} == {k for k, _ in items} - {"key-3"}
    backend.close()


def test_unjournaled_record_is_dead_space_not_an_object(tmp_path):
    """A crash after a batch's records were written but before its journal entries
    leaves records nothing points at: the objects are absent, nothing is a problem."""
    backend = _open(tmp_path)
    backend.batch_write([("real", b"r" * 100)])
    shard = backend.locate("real").path
    backend.close()
    value = b"ghost value"
    header = encode_header(b"ghost", len(value), 77, value_checksum(value))
    with open(shard, "ab") as f:
        f.write(bytes(header) + value + bytes(record_size(len(value)) - 4096 - len(value)))
    backend = _open(tmp_path)
    assert _read(backend, "ghost") == ReadStatus.MISSING
    assert _read(backend, "real") == b"r" * 100
    assert not backend.check().problems
    assert backend.usage().physical_bytes >= os.path.getsize(shard)
    backend.close()


def test_missing_shard_file_is_reported_and_repaired(tmp_path):
    items = _items("m", 8, 30 * KiB)
    backend = _opened_with(tmp_path, items, shard_bytes=64 * KiB)
    first_shard = backend.locate("m0").path
    lost = {r.key for r in backend.scan() if r.location.path == first_shard}
    backend.close()
    os.unlink(first_shard)
    backend = _open(tmp_path, shard_bytes=64 * KiB)
    for key, value in items:
        assert _read(backend, key) == (ReadStatus.MISSING if key in lost else value)
    report = backend.check()
    assert {p.key for p in report.problems if p.key} == lost
    assert all(p.kind is ProblemKind.INDEX_MISMATCH for p in report.problems)
    assert backend.check(repair=True).ok
    assert not backend.check().problems
    backend.close()
    backend = _open(tmp_path, shard_bytes=64 * KiB)
    assert not backend.check().problems
    assert {r.key for r in backend.scan()} == {k for k, _ in items} - lost
    backend.close()


def test_record_cut_short_is_reported_and_what_remains_quarantined(tmp_path):
    backend = _opened_with(tmp_path, [("whole", b"w" * 9000), ("cut", b"c" * 50_000)])
    where = backend.locate("cut")
    backend.close()
    os.truncate(where.path, where.offset + 1000)
    backend = _open(tmp_path)
    assert _read(backend, "cut") == ReadStatus.MISSING and _read(backend, "whole") == b"w" * 9000
    [problem] = backend.check().problems
    assert problem.kind is ProblemKind.TORN_WRITE and problem.key == "cut"
    [problem] = backend.check(repair=True).problems
    assert problem.action is RepairAction.QUARANTINED
    [copy] = (_node(tmp_path) / "quarantine").glob("*.kvr")
    assert problem.action_detail == str(copy)
    assert copy.read_bytes().startswith(b"KVSR") and copy.stat().st_size == 4096 + 1000
    backend.close()
    backend = _open(tmp_path)
    assert not backend.check().problems
    backend.close()


def test_interrupted_eviction_is_finished_at_open(tmp_path):
    items = _items("e", 6, 40 * KiB)
    backend = _opened_with(tmp_path, items, shard_bytes=64 * KiB)
    oldest = backend.locate("e0").path
    with open(oldest, "rb") as f:
        saved = f.read()
    victims = backend.evict(1)
    assert victims == ["e0"]
    backend.close()
    with open(oldest, "wb") as f:  # the crash lost the unlink, not the journaled drop
        f.write(saved)
    backend = _open(tmp_path, shard_bytes=64 * KiB)
    assert not os.path.exists(oldest)
    assert _read(backend, "e0") == ReadStatus.MISSING
    assert _read(backend, "e1") == items[1][1]
    assert not backend.check().problems
    backend.close()


def test_interrupted_compaction_leaves_the_old_journal(tmp_path):
    backend = _open(tmp_path)
    items = _items("c", 5, 100)
    backend.batch_write(items)
    backend.close()
    tmp = _node(tmp_path) / f".{JOURNAL_NAME}.tmp"
    tmp.write_bytes(b"half a new journal")
    backend = _open(tmp_path)
    assert not tmp.exists()
    assert {r.key for r in backend.scan()} == {k for k, _ in items}
    backend.close()


def test_lost_journal_keeps_the_shards_for_repair_to_adopt(tmp_path):
    items = _items("j", 5, 5000)
    backend = _opened_with(tmp_path, items)
    backend.batch_delete(["j1"])
    backend.close()
    os.unlink(_node(tmp_path) / JOURNAL_NAME)
    backend = _open(tmp_path)
    assert backend.usage().objects == 0, "objects appeared without a journal"
    [problem] = backend.check().problems
    assert problem.kind is ProblemKind.ORPHAN and problem.path.endswith(shard_name(1))
    [problem] = backend.check(repair=True).problems
    assert problem.action is RepairAction.ADDED_TO_INDEX
    assert problem.action_detail and problem.action_detail.startswith("5 valid record")
    # The journal held the delete: without it the deleted record comes back (docs/3fs.md).
    for key, value in items:
        assert _read(backend, key) == value
    backend.batch_write([("new", b"n")])
    backend.close()
    backend = _open(tmp_path)
    assert not backend.check().problems and backend.usage().objects == 6
    backend.close()


def test_unreadable_journal_header_refuses_to_open(tmp_path):
    _open(tmp_path).close()
    journal = _node(tmp_path) / JOURNAL_NAME
    raw = bytearray(journal.read_bytes())
    raw[9] ^= 0xFF
    journal.write_bytes(bytes(raw))
    with pytest.raises(CorruptionError, match=r"unreadable.*recover --offline .* --repair"):
        _open(tmp_path)
    assert journal.read_bytes() == bytes(raw), "a refused open changed the journal"
    _open(tmp_path, node_id="other").close()  # the rest of the cluster is unaffected


def test_foreign_file_named_like_a_shard_is_quarantined(tmp_path):
    backend = _open(tmp_path)
    backend.batch_write([("k", b"v")])
    backend.close()
    stray = _node(tmp_path) / shard_name(99)
    stray.write_bytes(os.urandom(20_000))
    backend = _open(tmp_path)
    with_stray = backend.usage().physical_bytes
    [problem] = backend.check().problems
    assert problem.kind is ProblemKind.ORPHAN
    [problem] = backend.check(repair=True).problems
    assert problem.action is RepairAction.QUARANTINED and not stray.exists()
    assert backend.usage().physical_bytes < with_stray
    assert backend.batch_write([("next", b"x")])[0].ok, "the next shard number collided"
    assert backend.locate("next").path.endswith(shard_name(100))
    backend.close()


def test_compaction_keeps_what_is_live(tmp_path):
    backend = _open(tmp_path)
    keep = _items("keep", 20, 100)
    backend.batch_write(keep)
    junk = [(f"junk{n}-" + "j" * 900, b"") for n in range(1200)]
    backend.batch_write(junk)
    generation = backend.journal.header.generation
    backend.batch_delete([k for k, _ in junk])
    assert backend.journal.header.generation > generation
    before = backend.usage()
    assert backend.journal.size < 8 * KiB, "the journal did not shrink"
    backend.close()
    backend = _open(tmp_path)
    assert backend.usage() == before
    assert {r.key for r in backend.scan()} == {k for k, _ in keep}
    assert not backend.check().problems
    [result] = backend.batch_write([("junk0-" + "j" * 900, b"again")])
    assert result.outcome is WriteOutcome.WRITTEN
    backend.close()


@pytest.mark.parametrize("policy", ["fifo", "lru"])
def test_capacity_evicts_whole_shards_by_policy(tmp_path, policy):
    evicted = []
    backend = _open(tmp_path, capacity=1 << 20, policy=policy, on_evict=evicted.extend)
    assert backend.shard_bytes == 128 * KiB
    items = _items("p", 40, 60 * KiB)
    for n, item in enumerate(items):
        assert backend.batch_write([item])[0].ok
        if policy == "lru" and n >= 2:
            assert _read(backend, "p0") == items[0][1]  # keep p0's shard recently used
        assert backend.usage().physical_bytes <= 1 << 20
    assert evicted, "nothing was evicted past the capacity"
    if policy == "fifo":
        assert "p0" in evicted and evicted[:2] == ["p0", "p1"]
    else:
        assert "p0" not in evicted and _read(backend, "p0") == items[0][1]
    assert not any(backend.batch_contains(evicted))
    backend.close()


@pytest.fixture
def small_fs(tmp_path):
    """A real 3 MiB file system, to run out of space."""
    with scratch_fs(tmp_path / "tmpfs", "3m") as where:
        yield where


def test_full_file_system_fails_writes_cleanly(small_fs):
    backend = _open(small_fs, shard_bytes=64 * KiB)
    stored = {}
    failure = None
    for key, value in _items("f", 40, 200 * KiB):
        [result] = backend.batch_write([(key, value)])
        if result.ok:
            stored[key] = value
        else:
            failure = result
            break
    assert failure is not None, "a 3 MiB file system took 8 MiB"
    assert isinstance(failure.error, CapacityError), failure
    assert not backend.contains(failure.key)
    backend.batch_delete(list(stored)[:3])  # their shards empty and are dropped
    [result] = backend.batch_write([("after", b"a" * 100 * KiB)])
    assert result.ok, result
    backend.close()
    backend = _open(small_fs, shard_bytes=64 * KiB)
    for key in list(stored)[3:]:
        assert _read(backend, key) == stored[key]
    assert _read(backend, "after") == b"a" * 100 * KiB
    assert not [p for p in backend.check().problems if p.kind is not ProblemKind.ORPHAN]
    backend.close()


KILLED_WRITER = """
import sys, threading
from kvstored.sdk.registry import open_backend
from kvstored.sdk.testing import payload
backend = open_backend("3fs", sys.argv[1], node_id="n", engine="posix", shard_bytes=65536)
lock = threading.Lock()
def run(t):
    n = 0
    while True:
        keys = [f"t{t}/{n}/{i}" for i in range(3)]
        results = backend.batch_write([(k, payload(k, 20000 + 7000 * i))
                                       for i, k in enumerate(keys)])
        if all(r.ok for r in results):
            with lock:
                print(" ".join(keys), flush=True)
        n += 1
for t in range(2):
    threading.Thread(target=run, args=(t,), daemon=True).start()
threading.Event().wait()
"""


def test_killed_while_two_threads_write_across_shards(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    child = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(tmp_path)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    acked = []
    try:
        while len(acked) < 40 * 3:
            line = child.stdout.readline()
            if not line:
                raise AssertionError(child.stderr.read()[-2000:])
            acked.extend(line.split())
    finally:
        child.send_signal(signal.SIGKILL)
        rest, _ = child.communicate()
    acked.extend(rest.split())
    backend = _open(tmp_path, shard_bytes=64 * KiB)
    for key in acked:
        i = int(key.rsplit("/", 1)[1])
        assert _read(backend, key) == payload(key, 20000 + 7000 * i), f"lost {key}"
    assert not backend.check().problems
    listing = json.dumps(sorted(os.listdir(_node(tmp_path))))
    assert f".{JOURNAL_NAME}.tmp" not in listing
    backend.close()
    shutil.rmtree(tmp_path / "default")


def test_sparse_tail_of_the_shard_in_use_is_cut(tmp_path):
    """The active shard is sized ahead of its data (sparse); a clean close cuts the tail,
    and so does the next open after a crash (only the hole goes, never data)."""
    backend = _open(tmp_path, shard_bytes=1 << 20)
    items = _items("s", 3, 10_000)
    backend.batch_write(items)
    shard = backend.locate("s0").path
    assert os.path.getsize(shard) == 1 << 20, "the active shard is not sized ahead"
    before = backend.usage()
    backend.close()
    assert os.path.getsize(shard) == 3 * record_size(10_000)
    os.truncate(shard, 1 << 20)  # what a crash leaves: the tail was never cut
    backend = _open(tmp_path, shard_bytes=1 << 20)
    assert os.path.getsize(shard) == 3 * record_size(10_000)
    assert backend.usage() == before
    for key, value in items:
        assert _read(backend, key) == value
    assert not backend.check().problems
    backend.close()


def test_cluster_stamp_lost_is_refused_and_rebuilt_by_repair(tmp_path):
    from kvstored.backends.stamp import STAMP_NAME
    from kvstored.sdk import OpenMode, RepairAction

    backend = _open(tmp_path)
    backend.batch_write([("k", b"v")])
    backend.close()
    stamp = tmp_path / "default" / STAMP_NAME
    stamp.unlink()
    with pytest.raises(CorruptionError, match="files of a 3fs store"):
        _open(tmp_path)
    assert not stamp.exists(), "a refused open wrote a stamp"
    repaired = _open(tmp_path, mode=OpenMode.REPAIR)
    assert _read(repaired, "k") == b"v"
    [problem] = repaired.check().problems
    assert problem.path == str(stamp) and problem.action is RepairAction.REBUILT
    assert "new stamp" in (problem.action_detail or "")
    repaired.close()
    _open(tmp_path).close()


def test_one_batch_across_several_shards_journals_each_record_in_its_own_shard(tmp_path):
    """A batch bigger than a shard lands in several; each record's journal entry must
    name the shard it is in, or the record is lost at the next open."""
    backend = _open(tmp_path, shard_bytes=64 * KiB)
    items = [(f"spread/{n}", payload(f"spread/{n}", 20 * KiB)) for n in range(8)]
    assert all(r.ok for r in backend.batch_write(items))
    shards = {backend.locate(key).path for key, _ in items}
    assert len(shards) > 1, "the batch did not span shards: the test proves nothing"
    for key, value in items:
        assert _read(backend, key) == value
    backend.close()
    backend = _open(tmp_path, shard_bytes=64 * KiB)
    for key, value in items:
        assert _read(backend, key) == value, key
    assert not backend.check().problems
    backend.close()
