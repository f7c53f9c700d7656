"""SSD reads of a node's gets: the gets waiting are joined into one backend read, and each
item is handed back the moment its read completes.

A get of SSD objects starts a :class:`Reading` of its ``(key, destination)`` items
(:meth:`SsdReads.start`). The items of every get waiting join the next backend call,
``read_stream`` on one of the node's reader threads: one deep submission, so the disk
sees the queue depth of all of them at once. Each ``(index, result)`` the backend yields
goes to the trio thread at once (``TrioToken.run_sync_soon``: the reader does not wait
for it) and into the channel of the get it belongs to, which sends that item while the
disk is still reading the others (see kvstored.node.dataserver). Reading a batch in
chunks to overlap the send instead lowered the queue depth by as much as the overlap
saved (docs/benchmarks.md).

Joining concurrent gets matters as it did for whole batches (kvstored.node.coalesce):
the hand-off to a thread costs the event loop more than a small read.

Not here: what a get sends (the data server), or the backend's own reading.
"""

from __future__ import annotations

import collections
import math
import queue
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

    def next_nowait(self) -> tuple[int, int] | None:
        """As :meth:`next`, if the next item has landed: raises ``trio.WouldBlock`` if
        not. Taking what is there without a pass through the scheduler lets a get send a
        whole group's items in one ``sendmsg`` instead of one item per pass."""
        try:
            return self._receive.receive_nowait()
        except trio.EndOfChannel:
            return None


class SsdReads:
    """Starts :class:`Reading` s and makes the backend calls for them on reader threads of
    its own (:meth:`run`, a background task), at most ``in_flight`` calls at a time.

    The threads are the node's, not trio's thread cache: :meth:`start` puts a get's
    reads straight on the threads' queue, so a waiting thread starts the disk at once,
    while the get's task goes on to send its reply's header. Through a trio task and
    ``trio.to_thread`` the reads began only after that task next yielded, and a scheduler
    pass and a thread hand-off later (0.3-0.5 ms of a 64 KiB get of 32 objects whose
    disk time is about 2.5 ms, docs/benchmarks.md)."""

    def __init__(self, read_stream: ReadStream, *, in_flight: int = 1,
                 observe: Callable[[float], None] = lambda seconds: None) -> None:
        self.read_stream = read_stream
        self.in_flight = in_flight
        #: Told how long each backend call took.
        self.observe = observe
        #: Readings not yet taken by a thread, and None: a thread's cue to stop.
        self._queue: queue.SimpleQueue[Reading | None] = queue.SimpleQueue()

    def start(self, items: list[tuple[str, memoryview]]) -> Reading:
        """Queue ``items`` for the next backend call; their results come through the
        Reading returned."""
        send, receive = trio.open_memory_channel[tuple[int, int]](math.inf)
        reading = Reading(items, send, receive)
        if not items:
            send.close()
            reading.done.set()
            return reading
        self._queue.put(reading)
        return reading

    async def run(self) -> None:
        """Run the reader threads until cancelled. A backend call that fails with what
        is not a StoreError (a bug) is raised here once the threads have stopped, for
        the supervisor to log and run this again. Reads still waiting when it ends are
        ended unread, so that no get waits for them (a get waits for its reads' end
        before it gives its buffers back)."""
        token = trio.lowlevel.current_trio_token()
        failed = trio.Event()
        failures: list[BaseException] = []

        def bug(exc: BaseException) -> None:  # in the trio thread
            failures.append(exc)
            failed.set()

        threads: list[threading.Thread] = []  # those started
        try:
            for n in range(self.in_flight):
                thread = threading.Thread(target=self._reader, args=(token, bug),
                                          daemon=True, name=f"kvstored ssd-read {n}")
                thread.start()  # may fail (no threads left): the others still stop
                threads.append(thread)
            await failed.wait()
            raise failures[0]
        finally:
            # Readings no thread took yet end unread; then every thread is told to stop
            # once its call is over, and waited for: its destinations must not be
            # written after a get has given them back.
            self._end_waiting()
            for _ in threads:
                self._queue.put(None)
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(_join, threads)
            self._end_waiting()  # queued meanwhile, and a failed thread's unused cue

    def _end_waiting(self) -> None:
        waiting = []
        while True:
            try:
                reading = self._queue.get_nowait()
            except queue.Empty:
                break
            if reading is not None:
                waiting.append(reading)
        _end(waiting, UnreachableError("the node stopped reading from SSD (shutting "
                                       "down, or its reader failed)"))

    def _reader(self, token: trio.lowlevel.TrioToken,
                bug: Callable[[BaseException], None]) -> None:
        """A reader thread: each call takes every reading waiting, until told to stop
        (or a call fails with a bug, which it reports through ``bug``)."""
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch, stop = [first], False
            while True:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    stop = True  # this thread's cue: after this call
                    break
                batch.append(more)
            failure = self._call(token, batch)
            if failure is not None:
                try:
                    token.run_sync_soon(bug, failure)
                except trio.RunFinishedError:
                    pass
                return
            if stop:
                return

    def _call(self, token: trio.lowlevel.TrioToken, batch: list[Reading]
              ) -> BaseException | None:
        """One backend call for the items of ``batch``, on this reader thread; returns
        what it raised if that was not a StoreError."""
        owners = [(reading, i) for reading in batch for i in range(len(reading.items))]
        keys = [key for reading in batch for key, _ in reading.items]
        views = [view for reading in batch for _, view in reading.items]
        failure: list[BaseException] = []

        def deliver(item: tuple[int, int] | None) -> None:  # in the trio thread
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

        # Every result and then the end (None) go through the one handoff, in order: a
        # get sees all its results before the end of its stream.
        handoff = _Handoff(token, deliver)
        started = time.perf_counter()
        try:
            for item in self.read_stream(keys, views):
                handoff.post(item)
        except BaseException as exc:  # the gets must hear of it, whatever it was
            failure.append(exc)
        finally:
            self.observe(time.perf_counter() - started)
            handoff.post(None)
        if failure and not isinstance(failure[0], StoreError):
            return failure[0]
        return None


def _join(threads: list[threading.Thread]) -> None:
    for thread in threads:
        thread.join()


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
