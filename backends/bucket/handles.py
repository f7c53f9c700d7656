"""Read handles of bucket data files, kept open between reads, a bounded number of them.

Opening a file costs a system call per bucket per batch, which shows on batches of small
random reads; keeping every bucket's file open would run a store of many buckets out of
descriptors. So the most recently read :data:`MAX_OPEN_FILES` buckets keep theirs.

A handle is closed only when no read holds its bucket (``Bucket.readers``), so that a
read in flight never finds its descriptor closed under it; a removed bucket's handle is
closed by the last read to end. All calls here must hold the backend's lock, except
:meth:`ReadHandles.open_missing`, which opens files without it.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Iterable

from kvstored.backends.bucket.state import Bucket
from kvstored.native import IoEngine, IoFile

#: Buckets whose data file stays open; more than this reopen theirs on their next read.
MAX_OPEN_FILES = 256


class ReadHandles:
    """The open read handles, least recently used first."""

    def __init__(self, engine: IoEngine, limit: int = MAX_OPEN_FILES) -> None:
        self.engine = engine
        self.limit = limit
        self._open: OrderedDict[int, Bucket] = OrderedDict()

    def open_missing(self, buckets: Iterable[Bucket]) -> dict[int, IoFile | OSError]:
        """Open the data file of each bucket that has no handle (without the lock)."""
        opened: dict[int, IoFile | OSError] = {}
        for bucket in buckets:
            if bucket.file is None:
                try:
                    opened[bucket.id] = self.engine.open(bucket.data_path, os.O_RDONLY)
                except OSError as exc:
                    opened[bucket.id] = exc
        return opened

    def adopt_locked(self, buckets: Iterable[Bucket], opened: dict[int, IoFile | OSError],
                     closing: list[IoFile]) -> dict[int, IoFile | OSError]:
        """Install what :meth:`open_missing` opened and return each bucket's handle, or
        the error opening it (FileNotFoundError once the bucket's files are gone).

        Handles to close (duplicates, and idle ones over the limit) go to ``closing``,
        for the caller to close after releasing the lock.
        """
        files: dict[int, IoFile | OSError] = {}
        for bucket in buckets:
            fresh = opened.get(bucket.id)
            if isinstance(fresh, IoFile):
                if bucket.file is None and not bucket.files_gone:
                    bucket.file = fresh
                else:
                    closing.append(fresh)  # another thread was quicker, or it is gone
            if bucket.file is not None:
                files[bucket.id] = bucket.file
                self._open[bucket.id] = bucket
                self._open.move_to_end(bucket.id)
            elif isinstance(fresh, OSError):
                files[bucket.id] = fresh
            else:
                files[bucket.id] = FileNotFoundError(2, "the bucket was removed",
                                                     bucket.data_path)
        if len(self._open) > self.limit:
            for bucket_id in list(self._open):
                if len(self._open) <= self.limit:
                    break
                idle = self._open[bucket_id]
                if idle.readers == 0:
                    self.drop_locked(idle, closing)
        return files

    def drop_locked(self, bucket: Bucket, closing: list[IoFile]) -> None:
        """Forget ``bucket``'s handle (no read may hold the bucket); close it later."""
        if bucket.file is not None:
            closing.append(bucket.file)
            bucket.file = None
        self._open.pop(bucket.id, None)

    def close_all_locked(self) -> None:
        for bucket in self._open.values():
            if bucket.file is not None:
                bucket.file.close()
                bucket.file = None
        self._open.clear()
