"""A backend that reads records in groups: ``batch_read`` and ``read_stream`` as one path.

A backend whose reads go through an io engine that keeps batches in flight across calls
makes each group of keys (looked up, held, and its reads started) in one method,
``_start_group``, returning a :class:`~kvstored.sdk.streams.RecordReadGroup`.
``batch_read`` is then one group waited for at once, and ``read_stream`` a
:func:`~kvstored.sdk.streams.stream_groups` of them with the next groups in flight: the
lookups, pins, verification and failure reports of both are the same code.
"""

from __future__ import annotations

import abc
from collections.abc import Generator, Sequence

from kvstored.sdk.backend import StorageBackend
from kvstored.sdk.streams import (
    STREAM_AHEAD,
    RecordReadGroup,
    StreamedRead,
    byte_view,
    stream_groups,
    stream_spans,
)


class GroupReadBackend(StorageBackend):
    """A :class:`StorageBackend` whose reads are groups made by :meth:`_start_group`."""

    @abc.abstractmethod
    def _start_group(self, keys: Sequence[str], buffers: Sequence[memoryview], span: range,
                     *, wait: bool = False) -> RecordReadGroup:
        """Look up and hold the keys ``keys[i]`` of ``span`` and start reading them into
        ``buffers[i]`` (checked already: writable, one per key). With ``wait`` the reads
        are done on return, through the thread's own scratch (a ``batch_read``); without,
        they stay in flight (a stream's group) until the group's ``results``. What the
        lookup held goes when the group is released."""

    def batch_read(self, keys: Sequence[str], buffers: Sequence[memoryview]) -> list[int]:
        self._check_open()
        self._check_read_buffers(keys, buffers)
        group = self._start_group(keys, buffers, range(len(keys)), wait=True)
        try:
            return group.outcomes()
        finally:
            group.release()

    def _stream_reads(self, keys: Sequence[str], buffers: Sequence[memoryview]
                      ) -> Generator[StreamedRead, None, None]:
        return stream_groups(self, stream_spans([byte_view(b).nbytes for b in buffers]),
                             lambda span: self._start_group(keys, buffers, span),
                             ahead=STREAM_AHEAD)
