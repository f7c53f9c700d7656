"""SSD reads of gets (kvstored.node.ssdreads): the gets waiting share one backend call on a
real backend, each gets its own items as they complete (in whatever order the backend
hands them out), and a call that fails ends the stream of exactly the gets it carried,
with the error."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import trio
import trio.testing

from kvstored.errors import InternalError, UnreachableError
from kvstored.node.ssdreads import SsdReads
from kvstored.sdk import ReadStatus
from kvstored.sdk.registry import open_backend


async def _all(reading) -> list[tuple[int, int]]:
    out = []
    while (item := await reading.next()) is not None:
        out.append(item)
    return out


def test_gets_waiting_share_one_call_and_each_gets_its_items_in_any_order(tmp_path):
    backend = open_backend("file-per-key", tmp_path / "ssd", capacity=1 << 24)
    values = {f"k{i}": bytes([i]) * (1000 + i) for i in range(5)}
    backend.batch_write(list(values.items()))
    calls: list[list[str]] = []
    gate = threading.Event()

    def reversed_stream(keys: list[str], buffers: list[memoryview]
                        ) -> Iterator[tuple[int, int]]:
        calls.append(list(keys))
        gate.wait(10)  # the first call holds the worker while the next gets queue up
        return reversed(list(backend.read_stream(keys, buffers)))

    async def main() -> None:
        reads = SsdReads(reversed_stream)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(reads.run)
            first = reads.start([("k0", memoryview(bytearray(2000)))])
            await trio.testing.wait_all_tasks_blocked()
            buffers = [memoryview(bytearray(2000)) for _ in range(4)]
            second = reads.start([("k1", buffers[0]), ("gone", buffers[1])])
            third = reads.start([("k3", buffers[2]), ("k4", buffers[3])])
            gate.set()
            assert await _all(first) == [(0, 1000)]
            assert sorted(await _all(second)) == [(0, 1001), (1, ReadStatus.MISSING)]
            assert await _all(third) == [(1, 1004), (0, 1003)]  # as the backend gave them
            for reading in (first, second, third):
                assert reading.done.is_set() and reading.error is None
            assert calls == [["k0"], ["k1", "gone", "k3", "k4"]]
            assert bytes(buffers[0][:1001]) == values["k1"]
            assert bytes(buffers[3][:1004]) == values["k4"]
            assert reads.start([]).done.is_set()
            nursery.cancel_scope.cancel()

    trio.run(main)
    backend.close()


def _failing(error: BaseException):
    def stream(keys: list[str], buffers: list[memoryview]) -> Iterator[tuple[int, int]]:
        yield 1, 10
        raise error
    return stream


def _two_items() -> list[tuple[str, memoryview]]:
    return [("a", memoryview(bytearray(10))), ("b", memoryview(bytearray(10)))]


def test_a_call_failing_with_a_store_error_ends_its_gets_streams_with_it():
    error = UnreachableError("the disk is gone")

    async def main() -> None:
        reads = SsdReads(_failing(error))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(reads.run)
            reading = reads.start(_two_items())
            assert await _all(reading) == [(1, 10)]  # what came before the failure
            await reading.done.wait()
            assert reading.error is error
            later = reads.start(_two_items())  # the reads go on
            assert await _all(later) == [(1, 10)]
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_a_call_failing_with_a_bug_fails_its_gets_and_raises_for_the_supervisor():
    reads = SsdReads(_failing(OSError(5, "Input/output error")))
    seen = []

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(reads.run)
            reading = reads.start(_two_items())
            assert await _all(reading) == [(1, 10)]
            # The stream ended: the error is there (run() may raise from now on).
            assert reading.done.is_set()
            seen.append(reading.error)
            await trio.sleep_forever()  # until run() raises

    with pytest.raises(BaseExceptionGroup) as raised:
        trio.run(main)
    assert raised.value.subgroup(OSError) is not None
    assert isinstance(seen[0], InternalError) and "Input/output" in seen[0].message


def test_reads_left_waiting_when_the_reader_stops_end_unread_and_its_call_ends_first():
    """A get waits for its reads' end before giving its buffers back: reads no reader
    thread took when the reader stops (at shutdown) must end too, or the get waits
    forever; a call under way is waited for, since it writes its destinations."""
    entered, gate = threading.Event(), threading.Event()

    def held_stream(keys: list[str], buffers: list[memoryview]) -> Iterator[tuple[int, int]]:
        entered.set()
        gate.wait(10)
        return iter([(0, 10), (1, 10)])

    async def main() -> None:
        reads = SsdReads(held_stream)
        reader = trio.CancelScope()
        stopped = trio.Event()

        async def run() -> None:
            with reader:
                await reads.run()
            stopped.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run)
            first = reads.start(_two_items())
            await trio.to_thread.run_sync(entered.wait)  # the one thread is in its call
            second = reads.start(_two_items())
            reader.cancel()
            await second.done.wait()
            assert await second.next() is None
            assert isinstance(second.error, UnreachableError)
            assert not stopped.is_set()  # the call under way is still waited for
            gate.set()
        assert stopped.is_set()
        assert await _all(first) == [(0, 10), (1, 10)] and first.error is None

    trio.run(main)
