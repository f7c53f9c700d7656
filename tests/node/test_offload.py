"""The offloader in-process, on a real DRAM segment and a real file-per-key backend:
what fits is written when the SSD is short of room, failures wait and retry, corrupt
or oversized DRAM copies are never written, and a backend that raises fails its batch
without stopping anything."""

from __future__ import annotations

import os

import pytest
import trio
from crc32c import crc32c
from prometheus_client import CollectorRegistry

from kvstored.backends.file_per_key import FilePerKeyBackend
from kvstored.metrics import NodeMetrics
from kvstored.node.offload import Offloader
from kvstored.node.report import Outcomes
from kvstored.protocol import OffloadFailed, OffloadFailure, Tier
from kvstored.sdk import BackendIOError, CapacityError, WriteOutcome, WriteResult
from kvstored.supervisor import Supervisor

MiB = 1 << 20


class AllOrNothing(FilePerKeyBackend):
    """file-per-key that, like a bucket, places a whole batch or none of it: a batch
    larger than ``room`` fails every item for lack of space."""

    room = 0
    raise_next: Exception | None = None

    def batch_write(self, items):
        if self.raise_next is not None:
            error, self.raise_next = self.raise_next, None
            raise error
        total = sum(memoryview(v).nbytes for _, v in items)
        if total > self.room:
            return [WriteResult(k, WriteOutcome.FAILED,
                                CapacityError("the file system is full", key=k, path=self.path))
                    for k, _ in items]
        self.room -= total
        return super().batch_write(items)


@pytest.fixture
def setup(dram, tmp_path):
    backend = AllOrNothing(tmp_path / "ssd", max_value_size=2 * MiB)
    report = Outcomes()
    corrupt: list[str] = []
    metrics = NodeMetrics(CollectorRegistry())
    offloader = Offloader(node="n1", backend=backend, dram=dram, outcomes=report,
                          metrics=metrics, supervisor=Supervisor("node n1",
                                                                 metrics.background_errors),
                          wake=lambda: None, on_corrupt=lambda key, tier: corrupt.append(key))
    yield offloader, backend, report, corrupt
    backend.close()


def _commit(dram, key: str, size: int) -> bytes:
    data = os.urandom(size)
    dram.allocate(key, size, crc32c(data), timeout=30)
    obj = dram.being_written(key)
    dram.view(obj)[:] = data
    dram.commit(obj)
    return data


def _failures(report: Outcomes) -> list[OffloadFailed]:
    return report.take().offload_failed


def test_what_fits_is_written_and_the_rest_waits_for_a_retry(setup):
    offloader, backend, report, _ = setup
    sizes = {"a": MiB, "b": 300_000, "c": MiB, "d": 100_000, "e": MiB}
    for key, size in sizes.items():
        _commit(offloader.dram, key, size)
    backend.room = MiB + 450_000  # room for d, b and one of the 1 MiB objects
    assert trio.run(offloader.write, list(sizes)) == 3
    done = report.take()
    assert sorted(done.offloaded.keys) == ["a", "b", "d"]
    failed = done.offload_failed
    assert {f.key for f in failed} == {"c", "e"}
    assert all(f.reason is OffloadFailure.NO_SPACE and f.retrying for f in failed)
    assert set(offloader.waiting) == {"c", "e"} and offloader.retry_at is not None
    assert "its SSD is full" in offloader.problem and str(backend.path) in offloader.problem
    # The master names them again (a flush): they go at once, and now they fit.
    backend.room = 10 * MiB
    offloader.request(["c", "e"], urgent=True)
    assert offloader.waiting == {}

    async def drain() -> None:
        while offloader.queue:
            await offloader.step()

    trio.run(drain)
    assert sorted(report.take().offloaded.keys) == ["c", "e"]
    assert offloader.problem is None
    assert sorted(r.key for r in backend.scan()) == list("abcde")


def test_a_changed_dram_copy_is_dropped_and_never_written(setup):
    offloader, backend, report, corrupt = setup
    backend.room = 10 * MiB
    _commit(offloader.dram, "good", 4096)
    _commit(offloader.dram, "bad", 4096)
    copy = offloader.dram.view(offloader.dram.get("bad"))
    copy[:4] = bytes(b ^ 0xFF for b in copy[:4])  # random data: never the bytes it held
    assert trio.run(offloader.write, ["good", "bad"]) == 1
    done = report.take()
    assert (done.dropped.keys, done.dropped.tiers) == (["bad"], [Tier.DRAM])
    (failure,) = done.offload_failed
    assert failure.reason is OffloadFailure.CORRUPT and not failure.retrying
    assert corrupt == ["bad"] and offloader.dram.get("bad") is None
    assert [r.key for r in backend.scan()] == ["good"]


def test_an_object_larger_than_the_backend_takes_is_a_final_failure(setup):
    offloader, backend, report, _ = setup
    backend.room = 10 * MiB
    _commit(offloader.dram, "huge", 3 * MiB)
    _commit(offloader.dram, "small", 4096)
    assert trio.run(offloader.write, ["huge", "small", "gone"]) == 1
    failures = {f.key: f for f in _failures(report)}
    assert failures["huge"].reason is OffloadFailure.TOO_LARGE
    assert "max_value_size" in failures["huge"].message
    assert failures["gone"].reason is OffloadFailure.GONE
    assert offloader.waiting == {}


def test_a_backend_that_raises_fails_the_batch_and_is_retried(setup):
    offloader, backend, report, _ = setup
    backend.room = 10 * MiB
    _commit(offloader.dram, "k", 4096)
    backend.raise_next = BackendIOError("write failed", errno=5, path=backend.path)
    assert trio.run(offloader.write, ["k"]) == 0
    (failure,) = _failures(report)
    assert failure.reason is OffloadFailure.IO_ERROR and failure.retrying
    assert offloader.metrics.background_errors.labels(task="offload")._value.get() == 1
    offloader.retry_at = 0.0  # the backoff has passed

    async def once() -> None:
        await offloader.step()  # moves the waiting key back to the queue
        while offloader.queue:
            await offloader.step()

    trio.run(once)
    offloaded = report.take().offloaded
    assert (offloaded.keys, offloaded.checksums) == (["k"], [offloader.dram.get("k").checksum])


def test_flush_all_writes_every_dram_only_object(setup):
    offloader, backend, _, _ = setup
    backend.room = 10 * MiB
    for i in range(5):
        _commit(offloader.dram, f"k{i}", 10_000)
    trio.run(offloader.write, ["k0"])
    assert len(offloader.not_on_ssd()) == 4
    trio.run(offloader.flush_all)
    assert offloader.not_on_ssd() == []
