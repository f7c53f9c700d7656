"""Read streams: the machinery under :meth:`StorageBackend.read_stream`.

A read stream hands out each read's result as its group of reads completes, while the
next groups are already in flight, so that a caller going through many keys keeps the
disk's queue full across what would have been the end of one ``batch_read`` and the
start of the next. This module is the part every backend shares: cutting the keys into
groups, keeping up to ``ahead`` groups in flight, handing out each group's results, and
giving every group back (pins released, I/O drained) however the stream ends: finished,
closed early by the caller (``close()`` on the iterator, or dropping it), or failed.

It is not the I/O: a backend supplies :class:`ReadGroup` objects that start their reads
when made and wait for them in :meth:`ReadGroup.results`. The default of
:class:`~kvstored.sdk.StorageBackend` makes groups of ``batch_read`` calls with their
keys pinned (:class:`BatchReadGroup`), so every backend streams, without overlap; a
backend whose io engine can keep batches in flight across calls supplies its own.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Protocol

from kvstored.sdk.errors import InvalidRequestError
from kvstored.sdk.record import ReadOutcome
from kvstored.sdk.types import ReadStatus

#: One item of a read stream: ``(index, result)``, where ``index`` is the item's position
#: in the keys asked for and ``result`` is what ``batch_read`` gives for it (the value's
#: length, or a negative :class:`~kvstored.sdk.ReadStatus`).
StreamedRead = tuple[int, int]

#: Keys per group of the default stream: as many as a ``batch_read`` caller would send.
DEFAULT_GROUP_KEYS = 128
#: Keys per group, and groups in flight beyond the one handed out, of a stream whose
#: reads stay in flight across calls (bucket, offset): two groups of 64 keep a queue of 32
#: full while the caller handles a third.
STREAM_GROUP_KEYS = 64
STREAM_AHEAD = 2
#: Bytes per group of such a stream, at most (see :func:`stream_spans`).
STREAM_GROUP_BYTES = 2 << 20


def stream_group_keys(count: int) -> int:
    """Keys per group of such a stream of ``count`` keys: :data:`STREAM_GROUP_KEYS`, or
    fewer for a short stream, so that it still spans ``1 + STREAM_AHEAD`` groups, all in
    flight from the start (the same queue depth): its first results come back while the
    disk reads the rest. A node's get of 32 SSD objects was one group, with nothing to
    send until all 32 were in; in three, it sends while the others are read (64 KiB:
    0.27-0.30 -> 0.37-0.39 GB/s, 4 MiB: 0.59-0.64 -> 0.72-0.77, docs/benchmarks.md)."""
    return max(1, min(STREAM_GROUP_KEYS, -(-count // (1 + STREAM_AHEAD))))


def stream_spans(sizes: Sequence[int]) -> Iterator[range]:
    """The groups of such a stream into buffers of ``sizes`` bytes: at most
    :func:`stream_group_keys` keys each, and no more than :data:`STREAM_GROUP_BYTES`
    bytes unless one buffer alone is larger (a group holds at least one key).

    Cutting by bytes is what lets large values overlap: all reads in flight share the
    disk's bandwidth and finish together, so 32 reads of 1 MiB in three groups of 11
    landed at once after the whole 32 MiB was read, and a node sent nothing until then
    (its 1 MiB get-batch, O_DIRECT: p50 41-60 -> 28-29 ms in groups of 2 MiB). Large
    reads need no queue depth for bandwidth (fio here: 1 MiB at depth 2 and 4 MiB at
    depth 1 read as fast as at depth 32), so the smaller groups lose nothing; small
    values still go in groups of up to 64 keys."""
    keys = stream_group_keys(len(sizes))
    start = taken = 0
    for i, size in enumerate(sizes):
        if i > start and (i - start >= keys or taken + size > STREAM_GROUP_BYTES):
            yield range(start, i)
            start, taken = i, 0
        taken += size
    if start < len(sizes):
        yield range(start, len(sizes))


class ReadGroup(Protocol):
    """The reads of one group of a stream, started when the group was made.

    ``results`` waits for them (verified, as ``batch_read`` would) and returns one
    ``(index, result)`` for each of the group's items, every index of the group exactly
    once. ``release`` gives back what the group holds (its pins, its scratch memory), once
    the kernel is done with its buffers: it waits for reads still in flight first, so it
    is also how a group that will never be handed out is cancelled. ``release`` is
    called exactly once, after ``results`` or instead of it.
    """

    def results(self) -> Sequence[StreamedRead]: ...

    def release(self) -> None: ...


class Streaming(Protocol):
    """What a stream needs of its backend (a :class:`~kvstored.sdk.StorageBackend`)."""

    path: str

    @property
    def closed(self) -> bool: ...

    def _check_open(self) -> None: ...

    def pin(self, keys: Iterable[str]) -> AbstractContextManager[None]: ...

    def batch_read(self, keys: Sequence[str], buffers: Sequence[memoryview]) -> list[int]: ...


def byte_view(buffer: memoryview) -> memoryview:
    """``buffer`` as a flat view of bytes (itself when it is one already)."""
    if type(buffer) is memoryview and buffer.format == "B" and buffer.ndim == 1:
        return buffer
    return memoryview(buffer).cast("B")


def spans(count: int, group: int) -> Iterator[range]:
    """The indices ``0..count-1`` cut into ranges of ``group``."""
    return (range(first, min(first + group, count)) for first in range(0, count, group))


def stream_groups(backend: Streaming, groups: Iterator[range],
                  start: Callable[[range], ReadGroup], *, ahead: int
                  ) -> Generator[StreamedRead, None, None]:
    """Stream the reads of ``groups`` (ranges of indices), ``start``-ing each when
    there is room: up to ``ahead`` groups stay in flight while the caller looks at one
    group's results. Checks before every item that ``backend`` is open (after a close,
    the next step raises BackendClosedError) and that the thread is the one the stream
    began on (an io engine waits for a batch on the thread that started it)."""
    in_flight: collections.deque[ReadGroup] = collections.deque()
    thread = threading.get_ident()

    def check() -> None:
        backend._check_open()
        if threading.get_ident() != thread:
            raise InvalidRequestError(
                "a read stream is iterated by the thread that began it (its reads are "
                "waited for on that thread's io ring)", path=backend.path)

    get_ident = threading.get_ident

    def handed_out(group: ReadGroup) -> Generator[StreamedRead, None, None]:
        try:
            check()
            for item in group.results():
                yield item
                # The step that resumed here may come after a close, or from elsewhere
                # (inline: this runs for every item).
                if backend.closed or get_ident() != thread:
                    check()
        finally:
            group.release()

    try:
        for span in groups:
            backend._check_open()
            in_flight.append(start(span))
            if len(in_flight) > ahead:
                yield from handed_out(in_flight.popleft())
        while in_flight:
            yield from handed_out(in_flight.popleft())
    finally:
        # Closed early or failed: never hand buffers back while the kernel still fills
        # them, nor leave a pin behind.
        release_all(in_flight)


def release_all(groups: collections.deque[ReadGroup]) -> None:
    """Release every group of ``groups`` (emptying it), even when one fails; then raise
    the first failure."""
    failure: BaseException | None = None
    while groups:
        try:
            groups.popleft().release()
        except BaseException as exc:  # the others' pins must go all the same
            failure = failure or exc
    if failure is not None:
        raise failure


class BatchReadGroup:
    """A group of the default stream: its keys pinned when it is made, then read by one
    ``batch_read`` when its results are asked for (no reads overlap the caller's work:
    ``batch_read`` is all such a backend offers)."""

    __slots__ = ("backend", "buffers", "keys", "pins", "span")

    def __init__(self, backend: Streaming, keys: Sequence[str],
                 buffers: Sequence[memoryview], span: range) -> None:
        self.backend, self.span = backend, span
        self.keys = [keys[i] for i in span]
        self.buffers = [buffers[i] for i in span]
        self.pins = backend.pin(self.keys)
        self.pins.__enter__()

    def results(self) -> list[StreamedRead]:
        return list(zip(self.span, self.backend.batch_read(self.keys, self.buffers)))

    def release(self) -> None:
        self.pins.__exit__(None, None, None)


class IssuedReads(Protocol):
    """The reads of a group's records, started by a backend (through its io engine)."""

    def finish(self) -> tuple[list[int], dict[int, ReadOutcome]]:
        """Wait for the reads, each record verified, its value in its destination: what
        :func:`kvstored.sdk.record.verified_statuses` gives (a status per read, and the
        outcome of each that failed, by its place among the reads)."""
        ...

    def close(self) -> None:
        """Wait for any read still in flight, then give back the memory the reads used.
        Idempotent; called after :meth:`finish`, or instead of it."""
        ...


#: Outcomes a read path reports (counts, logs) as a failed read; a MISSING found on the
#: way (the record's file removed since the lookup) is an ordinary miss.
NOTED = frozenset({ReadStatus.CORRUPT, ReadStatus.IO_ERROR})


class RecordReadGroup:
    """A :class:`ReadGroup` of a backend that reads records: the items its lookup
    answered (``answered``: MISSING, BUFFER_TOO_SMALL), the others (``read_at``, in the
    order of ``reads``' outcomes) from ``reads``; each failed read is reported through
    ``note(k, outcome)`` (``k``: its place among ``reads``' outcomes), and ``unhold``
    lets go of what the lookup held (pins, readers of a file) once the group is
    released. ``batch_read`` is one such group,
    waited for at once, so a batch and a stream share every step."""

    __slots__ = ("answered", "note", "read_at", "reads", "released", "span", "unhold")

    def __init__(self, span: range, answered: list[int], read_at: Sequence[int],
                 reads: IssuedReads | None, note: Callable[[int, ReadOutcome], None],
                 unhold: Callable[[], None]) -> None:
        self.span, self.answered, self.read_at, self.reads = span, answered, read_at, reads
        self.note, self.unhold = note, unhold
        self.released = False

    def outcomes(self) -> list[int]:
        """Every item's result, in the group's order (what ``batch_read`` returns)."""
        reads = self.reads
        if reads is None:
            return self.answered
        try:
            statuses, failures = reads.finish()
        finally:
            reads.close()  # the values are in their destinations: the scratch can go
        answered, read_at = self.answered, self.read_at
        if len(read_at) == len(answered):  # every key was found: the usual case
            self.answered = answered = statuses
        else:
            for n, status in zip(read_at, statuses):
                answered[n] = status
        for k, outcome in failures.items():
            if outcome.status in NOTED:
                self.note(k, outcome)
        return answered

    def results(self) -> list[StreamedRead]:
        return list(zip(self.span, self.outcomes()))

    def release(self) -> None:
        if self.released:
            return
        self.released = True
        try:
            if self.reads is not None:
                self.reads.close()
        finally:
            self.unhold()
