"""Bucket cutting, the write hint, capacity accounting, watermark eviction and the
eviction policies of the bucket backend."""

from __future__ import annotations

import os
import threading
from functools import partial
from pathlib import Path

import pytest

from kvstored.backends.bucket import BucketBackend
from kvstored.native import IoEngine
from kvstored.sdk.errors import CapacityError, InvalidRequestError
from kvstored.sdk.eviction import EvictionPolicy
from kvstored.sdk.record import record_size
from kvstored.sdk.registry import open_backend, parse_options
from kvstored.sdk.testing import payload
from kvstored.sdk.types import ReadStatus, WriteBatchHint, WriteOutcome
from tests.conftest import run_threads

KiB, MiB = 1024, 1024 * 1024


def _open(path: Path, **options) -> BucketBackend:
    return open_backend("bucket", path, **{"engine": "posix", **options})


def _disk_bytes(store: Path) -> int:
    return sum(p.stat().st_blocks * 512 for p in (store / "buckets").iterdir())


def _bucket_files(store: Path) -> list[str]:
    return sorted(p.name for p in (store / "buckets").glob("*.data"))


def _batch(prefix: str, count: int, size: int) -> list[tuple[str, bytes]]:
    return [(f"{prefix}/{n}", payload(f"{prefix}/{n}", size)) for n in range(count)]


def test_write_hint_reports_the_thresholds(tmp_path):
    backend = _open(tmp_path / "s", bucket_bytes=8 * MiB, bucket_keys=64, bucket_age=1.5)
    assert backend.write_batch_hint() == WriteBatchHint(8 * MiB, 64, 1.5)
    default = _open(tmp_path / "t")
    assert default.write_batch_hint() == WriteBatchHint(256 * MiB, 500, 5.0)


def test_options_parse_from_a_command_line():
    typed = parse_options(BucketBackend, {"bucket_bytes": "64MiB", "bucket_age": "0.5",
                                           "direct": "yes", "policy": "lru",
                                           "high_watermark": "0.95"})
    assert typed == {"bucket_bytes": 64 * MiB, "bucket_age": 0.5, "direct": True,
                     "policy": EvictionPolicy.LRU, "high_watermark": 0.95}


@pytest.mark.parametrize("bad", [{"policy": "random"}, {"bucket_keys": 0},
                                 {"bucket_age": 0}, {"low_watermark": 0.95},
                                 {"engine": "floppy"}])
def test_bad_options_are_refused_by_name(tmp_path, bad):
    with pytest.raises(InvalidRequestError, match=next(iter(bad)).split("_")[0]):
        _open(tmp_path / "s", **bad)


def test_a_batch_is_cut_by_keys_and_bytes(tmp_path):
    store = tmp_path / "s"
    backend = _open(store, bucket_keys=4, bucket_bytes=3 * record_size(10 * KiB))
    backend.batch_write(_batch("a", 10, 10 * KiB))  # 3 + 3 + 3 + 1 (bytes bind first)
    assert len(_bucket_files(store)) == 4
    backend.batch_write(_batch("b", 9, 1 * KiB))  # 4 + 4 + 1 (keys bind first)
    assert len(_bucket_files(store)) == 7
    backend.batch_write([("huge", payload("huge", 200 * KiB))])  # alone, over the limit
    assert len(_bucket_files(store)) == 8
    assert backend.usage().objects == 20


def test_physical_usage_is_st_blocks_of_every_file(tmp_path):
    store = tmp_path / "s"
    backend = _open(store)
    backend.batch_write(_batch("a", 7, 33 * KiB))
    backend.batch_write(_batch("b", 1, 0))
    backend.batch_delete(["a/2"])
    usage = backend.usage()
    assert usage.physical_bytes == _disk_bytes(store)
    assert usage.logical_bytes == 6 * 33 * KiB
    backend.close()
    assert _open(store).usage() == usage


def test_watermarks(tmp_path):
    """Past the high watermark, whole buckets go until usage after the write is under
    the low watermark; below it nothing is evicted."""
    store = tmp_path / "s"
    evicted: list[str] = []
    capacity = 10 * MiB
    backend = _open(store, capacity=capacity, on_evict=evicted.extend)
    n = 0
    while backend.usage().physical_bytes + 1100 * KiB <= 0.9 * capacity:
        backend.batch_write(_batch(f"w{n}", 4, 256 * KiB))  # about 1 MiB a bucket
        n += 1
    assert not evicted, "evicted below the high watermark"
    backend.batch_write(_batch(f"w{n}", 4, 256 * KiB))
    usage = backend.usage().physical_bytes
    assert evicted, "nothing evicted past the high watermark"
    assert usage <= 0.8 * capacity, usage
    assert usage > 0.8 * capacity - 1100 * KiB - 1100 * KiB, "evicted far more than needed"
    assert evicted[:4] == [f"w0/{i}" for i in range(4)], "FIFO evicts the oldest first"
    assert _disk_bytes(store) == usage


def test_capacity_error_when_only_pinned_buckets_remain(tmp_path):
    backend = _open(tmp_path / "s", capacity=3 * MiB)
    first = _batch("p", 4, 256 * KiB)
    backend.batch_write(first)
    backend.batch_write(_batch("q", 4, 256 * KiB))
    with backend.pin(["p/0", "q/3"]):
        results = backend.batch_write(_batch("r", 4, 256 * KiB))
        assert all(r.outcome is WriteOutcome.FAILED for r in results)
        assert isinstance(results[0].error, CapacityError) and "pinned" in str(results[0].error)
        assert not any(backend.batch_contains([k for k, _ in _batch("r", 4, 0)]))
        assert backend.usage().physical_bytes <= 3 * MiB
    assert all(r.ok for r in backend.batch_write(_batch("r", 4, 256 * KiB)))


def test_on_evict_gets_the_live_keys_while_the_files_still_exist(tmp_path):
    store = tmp_path / "s"
    seen: list[tuple[list[str], bool]] = []
    backend = _open(store)
    backend.batch_write(_batch("e", 5, 1 * KiB))
    backend.batch_delete(["e/1"])
    path = backend.locate("e/0").path

    def on_evict(keys: list[str]) -> None:
        seen.append((sorted(keys), os.path.exists(path)))
        assert not any(backend.batch_contains(keys)), "victims still visible in on_evict"

    assert sorted(backend.evict(1, on_evict=on_evict)) == ["e/0", "e/2", "e/3", "e/4"]
    assert seen == [(["e/0", "e/2", "e/3", "e/4"], True)]
    assert not os.path.exists(path)
    assert backend.usage().physical_bytes == 0 == _disk_bytes(store)


@pytest.mark.parametrize("policy, victim", [("fifo", "a"), ("lru", "b")])
def test_policy_picks_the_victim(tmp_path, policy, victim):
    backend = _open(tmp_path / "s", policy=policy)
    for prefix in "abc":
        backend.batch_write(_batch(prefix, 2, 4 * KiB))
    assert backend.read("a/0") is not None  # "a" is now the most recently read
    assert backend.evict(1) == [f"{victim}/0", f"{victim}/1"]


class _GatedEngine:
    """Wraps an engine so that reads wait for a gate: a read held in flight on purpose."""

    def __init__(self, engine: IoEngine) -> None:
        self._engine = engine
        self.reading = threading.Event()
        self.gate = threading.Event()

    def read(self, items):
        self.reading.set()
        assert self.gate.wait(10)
        return self._engine.read(items)

    def __getattr__(self, name):
        return getattr(self._engine, name)


def test_space_of_a_deleted_bucket_is_freed_when_its_read_ends(tmp_path):
    store = tmp_path / "s"
    backend = _open(store)
    backend.batch_write(_batch("d", 3, 64 * KiB))
    before = backend.usage().physical_bytes
    gated = backend.engine = _GatedEngine(backend.engine)
    buf = bytearray(64 * KiB)
    got: list[int] = []
    reader = threading.Thread(target=lambda: got.extend(
        backend.batch_read(["d/1"], [memoryview(buf)])))
    reader.start()
    assert gated.reading.wait(10)
    assert backend.batch_delete(["d/0", "d/1", "d/2"]) == [True] * 3
    assert _bucket_files(store) == [], "a deleted bucket's files must go at once"
    assert backend.usage().physical_bytes == before, "space freed under a read in flight"
    assert backend.evict(10**9) == []
    gated.gate.set()
    reader.join()
    assert got == [64 * KiB] and bytes(buf) == payload("d/1", 64 * KiB)
    assert backend.usage().physical_bytes == 0


def test_reads_in_flight_block_eviction(tmp_path):
    backend = _open(tmp_path / "s")
    backend.batch_write(_batch("r", 2, 8 * KiB))
    gated = backend.engine = _GatedEngine(backend.engine)
    buf = bytearray(8 * KiB)
    reader = threading.Thread(target=backend.batch_read, args=(["r/0"], [memoryview(buf)]))
    reader.start()
    assert gated.reading.wait(10)
    assert backend.evict(10**9) == []
    gated.gate.set()
    reader.join()
    assert sorted(backend.evict(10**9)) == ["r/0", "r/1"]
    assert backend.batch_read(["r/0"], [memoryview(buf)]) == [ReadStatus.MISSING]



def test_batches_naming_the_same_keys_in_opposite_orders_do_not_deadlock(tmp_path):
    """Each key is written exactly once, whichever batch claims it first."""
    backend = _open(tmp_path / "s", bucket_keys=1)
    keys = [f"x/{n}" for n in range(40)]
    written: list[str] = []
    lock = threading.Lock()

    def writer(order: list[str]) -> None:
        results = backend.batch_write([(k, payload(k, 3000)) for k in order])
        assert all(r.ok for r in results)
        with lock:
            written.extend(r.key for r in results if r.outcome is WriteOutcome.WRITTEN)

    # A deadlock fails run_threads after 30 s.
    raised = run_threads((partial(writer, keys if n % 2 else keys[::-1]) for n in range(4)),
                         timeout=30)
    assert not raised, raised
    assert sorted(written) == sorted(keys), "a key was written twice or never"
    for key in keys:
        assert backend.read(key) == payload(key, 3000)
