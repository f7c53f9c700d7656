"""The ``3fs`` backend as a cluster: several nodes on one directory, each writing its own
files and reading everyone's. An ordinary directory stands in for the 3FS mount."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
from functools import partial

import pytest

from kvstored.backends.threefs import ThreeFsBackend
from kvstored.sdk.errors import BackendBusyError, InvalidRequestError
from kvstored.sdk.registry import open_backend
from kvstored.sdk.testing import flip_byte, payload
from kvstored.sdk.types import ReadStatus, WriteOutcome
from tests.conftest import run_threads

KiB = 1024


def _open(path, node, **options) -> ThreeFsBackend:
    options.setdefault("engine", "posix")
    return open_backend("3fs", path, node_id=node, **options)


@pytest.fixture
def pair(tmp_path):
    a, b = _open(tmp_path, "a"), _open(tmp_path, "b")
    yield a, b
    a.close()
    b.close()


def _read(backend, key, size=1 << 20):
    buf = bytearray(size)
    got = backend.batch_read([key], [memoryview(buf)])[0]
    return bytes(buf[:got]) if got >= 0 else ReadStatus(got)


def test_each_node_writes_only_its_own_directory(tmp_path, pair):
    a, b = pair
    a.batch_write([("x", b"1")])
    b.batch_write([("y", b"2")])
    cluster = tmp_path / "default"
    assert sorted(p.name for p in cluster.iterdir()) == ["KVSTORED-BACKEND.json", "a", "b"]
    assert a.locate("x").path.startswith(str(cluster / "a"))
    assert b.locate("y").path.startswith(str(cluster / "b"))


def test_a_write_is_visible_on_the_other_node_once_acknowledged(pair):
    a, b = pair
    for n in range(20):
        key, value = f"k{n}", payload(f"k{n}", 1000 * n)
        [result] = a.batch_write([(key, value)])
        assert result.outcome is WriteOutcome.WRITTEN
        assert _read(b, key) == value, "an acknowledged write was not visible to node b"


def test_scan_is_per_node_and_scan_cluster_is_everything(pair):
    a, b = pair
    a.batch_write([("a1", b"x"), ("a2", b"y")])
    b.batch_write([("b1", b"z")])
    assert {r.key for r in a.scan()} == {"a1", "a2"}
    assert {r.key for r in b.scan()} == {"b1"}
    assert {(o.node_id, o.record.key) for o in b.scan_cluster()} == {
        ("a", "a1"), ("a", "a2"), ("b", "b1")}
    assert a.nodes() == b.nodes() == ["a", "b"]
    assert b.contains("b1") and not b.contains("a1"), "contains() is about this node"
    found = b.find("a2")
    assert found.node_id == "a" and found.record.size == 1
    assert b.read("a2") == b"y"


def test_deletes_and_evictions_reach_the_other_node(pair):
    a, b = pair
    a.batch_write([("gone", b"soon"), ("evicted", b"e" * 5000)])
    assert b.read("gone") == b"soon" and b.read("evicted") == b"e" * 5000
    a.batch_delete(["gone"])
    b.refresh()
    assert b.find("gone") is None and _read(b, "gone") == ReadStatus.MISSING
    victims = a.evict(1 << 40)
    assert "evicted" in victims
    # Until b refreshes it may still read the immutable value through a handle it had
    # open, or find the file gone; never anything else.
    assert _read(b, "evicted") in (b"e" * 5000, ReadStatus.MISSING)
    b.refresh()
    assert _read(b, "evicted") == ReadStatus.MISSING, "a refreshed view read a dropped shard"


def test_journal_compaction_is_followed(tmp_path):
    a, b = _open(tmp_path, "a"), _open(tmp_path, "b")
    try:
        keep = [(f"keep{n}", payload(f"keep{n}", 100)) for n in range(50)]
        a.batch_write(keep)
        assert b.read("keep0") is not None  # b now follows a's journal incrementally
        generation = a.journal.header.generation
        junk = [(f"junk{n}-" + "j" * 900, b"") for n in range(1200)]
        a.batch_write(junk)
        a.batch_delete([k for k, _ in junk])
        assert a.journal.header.generation > generation, "the journal was not compacted"
        a.batch_write([("after", b"compaction")])
        for key, value in keep:
            assert _read(b, key) == value
        assert b.read("after") == b"compaction"
        assert b.find("junk0-" + "j" * 900) is None
    finally:
        a.close()
        b.close()


def test_concurrent_writers_on_two_nodes_read_each_other(tmp_path):
    """Writers on both nodes and readers on both, at once: every acknowledged object is
    readable from the other node, byte for byte."""
    a, b = _open(tmp_path, "a"), _open(tmp_path, "b", engine="auto")
    acked = {"a": [], "b": []}
    lock = threading.Lock()
    errors = []
    stop = threading.Event()

    def writer(node, backend, w):
        for n in range(30):
            items = [(f"{node}/{w}/{n}/{i}", payload(f"{node}/{w}/{n}/{i}", 1 + 97 * KiB * i // 3))
                     for i in range(3)]
            for (key, _), result in zip(items, backend.batch_write(items)):
                if result.outcome is not WriteOutcome.WRITTEN:
                    errors.append(f"write {key}: {result}")
                with lock:
                    acked[node].append(key)

    def reader(backend, other):
        rng = random.Random()
        while not stop.is_set():
            with lock:
                keys = rng.sample(acked[other], min(8, len(acked[other])))
            if not keys:
                continue
            buffers = [memoryview(bytearray(200 * KiB)) for _ in keys]
            for key, got, buf in zip(keys, backend.batch_read(keys, buffers), buffers):
                i = int(key.rsplit("/", 1)[1])
                expected = payload(key, 1 + 97 * KiB * i // 3)
                if got != len(expected) or bytes(buf[:got]) != expected:
                    errors.append(f"read {key} on the other node: {got}")

    try:
        errors += run_threads(
            [partial(writer, node, backend, w) for node, backend in (("a", a), ("b", b))
             for w in range(2)],
            beside=[partial(reader, a, "b"), partial(reader, b, "a")], stop=stop)
        assert not errors, errors[:5]
        assert {r.key for r in a.scan()} == set(acked["a"])
        assert {r.key for r in b.scan()} == set(acked["b"])
        for key in acked["a"][::7]:
            assert b.read(key) == a.read(key)
    finally:
        a.close()
        b.close()


WRITER = """
import sys
from kvstored.sdk.registry import open_backend
from kvstored.sdk.testing import payload
backend = open_backend("3fs", sys.argv[1], node_id="writer", engine="posix")
for n in range(int(sys.argv[2])):
    key = f"w{n}"
    [result] = backend.batch_write([(key, payload(key, 1000 + n * 37))])
    assert result.ok, result
    print(key, flush=True)
backend.close()
"""


def test_another_process_writes_and_this_one_reads_at_once(tmp_path):
    """A real second process is node "writer"; every key it acknowledges is readable
    here as soon as the acknowledgement arrives."""
    reader = _open(tmp_path, "reader")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    child = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), "60"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        seen = 0
        for line in child.stdout:
            key = line.strip()
            n = int(key[1:])
            assert _read(reader, key) == payload(key, 1000 + n * 37), f"{key} not visible"
            seen += 1
        assert child.wait(timeout=60) == 0, child.stderr.read()
        assert seen == 60
        assert reader.nodes() == ["reader", "writer"]
    finally:
        child.kill()
        child.wait()
        reader.close()


def test_corrupt_record_of_another_node_is_reported_not_returned(pair):
    a, b = pair
    a.batch_write([("victim", payload("victim", 20_000)), ("fine", payload("fine", 20_000))])
    where = a.locate("victim")
    flip_byte(where.path, where.offset + 100)
    assert _read(b, "victim") == ReadStatus.CORRUPT
    assert b.view.corrupt_reads == 1
    assert _read(b, "fine") == payload("fine", 20_000)


def test_shared_reads_off_sees_only_this_node(tmp_path):
    a = _open(tmp_path, "a")
    b = _open(tmp_path, "b", shared_reads=False)
    try:
        a.batch_write([("x", b"1")])
        assert _read(b, "x") == ReadStatus.MISSING and b.find("x") is None
        assert b.nodes() == ["b"]
    finally:
        a.close()
        b.close()


def test_one_writer_per_node_id(tmp_path):
    first = _open(tmp_path, "a")
    try:
        with pytest.raises(BackendBusyError, match=r"node 'a' .* is in use"):
            _open(tmp_path, "a")
    finally:
        first.close()
    _open(tmp_path, "a").close()  # free again once closed


def test_nodes_starting_together_share_the_stamp(tmp_path):
    opened = []

    def start(n):
        opened.append(_open(tmp_path, f"n{n}"))

    errors = run_threads(partial(start, n) for n in range(8))
    for backend in opened:
        backend.close()
    assert not errors, errors
    assert len(opened) == 8


@pytest.mark.parametrize("option", [{"node_id": "../x"}, {"node_id": "a/b"}, {"cluster": ""},
                                    {"cluster": ".hidden"}, {"node_id": "x" * 129}])
def test_names_that_cannot_be_directories_are_refused(tmp_path, option):
    options = {"node_id": "ok", **option}
    with pytest.raises(InvalidRequestError, match="not a valid name"):
        open_backend("3fs", tmp_path, engine="posix", **options)
    assert not any(tmp_path.iterdir()), "a refused open created files"


def test_another_backends_directory_is_refused(tmp_path):
    open_backend("file-per-key", tmp_path).close()
    with pytest.raises(InvalidRequestError, match="file-per-key"):
        _open(tmp_path, "a")


def test_clusters_are_separate(tmp_path):
    a = _open(tmp_path, "a", cluster="one")
    b = _open(tmp_path, "b", cluster="two")
    try:
        a.batch_write([("x", b"1")])
        assert _read(b, "x") == ReadStatus.MISSING
        assert b.nodes() == ["b"]
    finally:
        a.close()
        b.close()

