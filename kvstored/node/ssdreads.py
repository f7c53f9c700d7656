"""SSD reads of a node's gets: the gets waiting are joined into one backend read, and each
item is handed back the moment its read completes.

A get of SSD objects starts a :class:`Reading` of its ``(key, destination)`` items
(:meth:`SsdReads.start`). The items of every get waiting join the next backend call,
``read_stream`` on a worker thread: one deep submission, so the disk sees the queue
depth of all of them at once. Each ``(index, result)`` the backend yields goes to the
trio thread at once (``TrioToken.run_sync_soon``: the worker does not wait for it) and
into the channel of the get it belongs to, which sends that item while the disk is still
reading the others (see kvstored.node.dataserver). Reading a batch in chunks to overlap
the send instead lowered the queue depth by as much as the overlap saved
(docs/benchmarks.md).

Joining concurrent gets matters as it did for whole batches (kvstored.node.coalesce):
the hand-off to a worker thread costs the event loop more than a small read.

Not here: what a get sends (the data server), or the backend's own reading.
"""

from __future__ import annotations

import collections
import math
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import trio

from kvstored.errors import InternalError, StoreError, UnreachableError

#: Reads ``keys`` into ``buffers``; yields ``(index, result)`` as each completes, every
#: index once, in any order (:meth:`kvstored.sdk.StorageBackend.read_stream`).
ReadStream = Callable[[list[str], list[memoryview]], Iterator[tuple[int, int]]]


@dataclass(eq=False, slots=True)
class Reading:
    """One get's reads in flight. :meth:`next` gives ``(index, result)`` as each lands;
    :attr:`done` is set once the backend call carrying them has ended, so that their
    destinations are no longer written (wait for it before reusing them)."""

    items: list[tuple[str, memoryview]]
    _send: trio.MemorySendChannel[tuple[int, int]]
    _receive: trio.MemoryReceiveChannel[tuple[int, int]]
    done: trio.Event = field(default_factory=trio.Event)
    #: Why the call ended before every item came back (the rest are not read).
    error: StoreError | None = None

    async def next(self) -> tuple[int, int] | None:
        """The next ``(index, result)``, or None when no more will come (see
        :attr:`error` for why, if some are missing)."""
        try:
            return await self._receive.receive()
        except trio.EndOfChannel:
            return None


class SsdReads:
    """Starts :class:`Reading` s and makes the backend calls for them (:meth:`run`, a
    background task), at most ``in_flight`` at a time."""

    def __init__(self, read_stream: ReadStream, *, in_flight: int = 1,
                 observe: Callable[[float], None] = lambda seconds: None) -> None:
        self.read_stream = read_stream
        self.in_flight = in_flight
        #: Told how long each backend call took.
        self.observe = observe
        self._waiting: list[Reading] = []
        self._ready = trio.Event()

    def start(self, items: list[tuple[str, memoryview]]) -> Reading:
        """Queue ``items`` for the next backend call; their results come through the
        Reading returned."""
        send, receive = trio.open_memory_channel[tuple[int, int]](math.inf)
        reading = Reading(items, send, receive)
        if not items:
            send.close()
            reading.done.set()
            return reading
        self._waiting.append(reading)
        self._ready.set()
        return reading

    async def run(self) -> None:
        """Make the calls until cancelled. Reads still waiting when it ends are ended
        unread, so that no get waits for them (a get waits for its reads' end before
        it gives its buffers back)."""
        try:
            async with trio.open_nursery() as nursery:
                for _ in range(self.in_flight):
                    nursery.start_soon(self._caller)
        finally:
            waiting, self._waiting = self._waiting, []
            _end(waiting, UnreachableError("the node stopped reading from SSD (shutting "
                                           "down, or its reader failed)"))

    async def _caller(self) -> None:
        token = trio.lowlevel.current_trio_token()
        while True:
            while not self._waiting:
                self._ready = trio.Event()
                await self._ready.wait()
            batch, self._waiting = self._waiting, []
            await self._call(token, batch)

    async def _call(self, token: trio.lowlevel.TrioToken, batch: list[Reading]) -> None:
        """One backend call for the items of ``batch``."""
        owners = [(reading, i) for reading in batch for i in range(len(reading.items))]
        keys = [key for reading in batch for key, _ in reading.items]
        views = [view for reading in batch for _, view in reading.items]
        failure: list[BaseException] = []

        def deliver(item: tuple[int, int] | None) -> None:
            if item is not None:
                reading, i = owners[item[0]]
                reading._send.send_nowait((i, item[1]))
                return
            error = None
            if failure:
                exc = failure[0]
                error = exc if isinstance(exc, StoreError) else InternalError(
                    f"an SSD read of {len(keys)} item(s) failed: {exc!r}")
            _end(batch, error)

        handoff = _Handoff(token, deliver)

        def work() -> None:
            # Every result and then the end (None) go through the one handoff, in order:
            # a get sees all its results before the end of its stream.
            started = time.perf_counter()
            ran.append(True)
            try:
                for item in self.read_stream(keys, views):
                    handoff.post(item)
            except BaseException as exc:  # the gets must hear of it, whatever it was
                failure.append(exc)
            finally:
                self.observe(time.perf_counter() - started)
                handoff.post(None)

        ran: list[bool] = []
        try:
            await trio.to_thread.run_sync(work)
        finally:
            if not ran:  # cancelled before the thread started: nothing was read
                _end(batch, UnreachableError("the node stopped reading from SSD"))
        if failure and not isinstance(failure[0], StoreError):
            raise failure[0]  # the node's supervisor logs and counts it


def _end(readings: list[Reading], error: StoreError | None) -> None:
    """End the streams of ``readings`` (what was not delivered is not coming)."""
    for reading in readings:
        if not reading.done.is_set():
            reading.error = error
            reading._send.close()
            reading.done.set()


class _Handoff:
    """Items from a worker thread to the trio thread, in order, with one wakeup of trio
    per burst rather than per item: each ``run_sync_soon`` writes to trio's wakeup
    socket, about 20 µs under load, and a batch of 32 small reads yields 32 items at
    once (py-spy: 8% of the daemon's time in those writes at 64 KiB)."""

    def __init__(self, token: trio.lowlevel.TrioToken,
                 deliver: Callable[[tuple[int, int] | None], None]) -> None:
        self._token = token
        self._deliver = deliver
        self._items: collections.deque[tuple[int, int] | None] = collections.deque()
        self._lock = threading.Lock()
        self._scheduled = False

    def post(self, item: tuple[int, int] | None) -> None:
        """From the worker thread."""
        self._items.append(item)
        with self._lock:
            if self._scheduled:  # a drain is due, and will take this item too
                return
            self._scheduled = True
        self._token.run_sync_soon(self._drain)

    def _drain(self) -> None:
        with self._lock:
            self._scheduled = False  # what is posted from now on schedules another drain
        while self._items:
            self._deliver(self._items.popleft())
