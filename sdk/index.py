"""The in-memory index a backend keeps of its visible objects, and the calls answered
from it.

Most backends know every visible object in memory: which key, where its record is, and
what the record must say. :class:`ObjectIndex` is that map, with the sum of the values'
sizes kept as entries come and go, and it answers ``stat``, ``locate`` and
``batch_contains`` from memory, as the contract requires (the node calls them on its
event loop). :class:`IndexedBackend` is a :class:`StorageBackend` whose ``stat``,
``locate``, ``batch_contains`` and ``scan`` are those answers, written once here.

An entry is the backend's own object (a dataclass, a slotted class) with at least
``size``, ``checksum`` (the value's CRC-32C), ``seq`` and ``write_ns``; the backend says
where its bytes are with the ``locate`` function it gives the index.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Generic, Protocol, TypeVar

from kvstored.sdk.backend import StorageBackend
from kvstored.sdk.record import ReadOutcome
from kvstored.sdk.types import Location, ObjectRecord, ReadStatus, StoredVersion

log = logging.getLogger(__name__)

#: Records read per batch by ``scan(verify=True)``, and the most value bytes per batch.
SCAN_BATCH = 64
SCAN_BATCH_BYTES = 32 << 20


class IndexEntry(Protocol):
    """What an index entry must tell about its object."""

    @property
    def size(self) -> int: ...
    @property
    def checksum(self) -> int: ...
    @property
    def seq(self) -> int: ...
    @property
    def write_ns(self) -> int: ...


E = TypeVar("E", bound=IndexEntry)
#: Reads ``keys`` into ``buffers``: a backend's ``batch_read``.
BatchRead = Callable[[Sequence[str], Sequence[memoryview]], list[int]]


class ObjectIndex(Generic[E]):
    """Key -> entry for every visible object, and ``logical_bytes``, the sum of their
    value sizes.

    ``lock`` is the lock that guards the index; the backend takes it around every change,
    together with whatever else must change with the index. The methods that answer
    questions (:meth:`contains`, :meth:`stat`, :meth:`location`, :meth:`snapshot`,
    :meth:`is_current`) take it themselves; the others expect the caller to hold it.
    """

    def __init__(self, locate: Callable[[E], Location],
                 lock: threading.Lock | threading.RLock | None = None) -> None:
        self.lock = lock if lock is not None else threading.Lock()
        self._locate = locate
        self._entries: dict[str, E] = {}
        self.logical_bytes = 0

    # -- answers from memory (these take the lock) ----------------------------------------

    def contains(self, keys: Iterable[str]) -> list[bool]:
        with self.lock:
            return [key in self._entries for key in keys]

    def stat(self, key: str) -> ObjectRecord | None:
        with self.lock:
            entry = self._entries.get(key)
        return None if entry is None else self.record(key, entry)

    def versions(self, keys: Iterable[str]) -> list[StoredVersion | None]:
        """Each key's size and checksum (None if absent), under one lock."""
        get = self._entries.get
        with self.lock:
            entries = [get(key) for key in keys]
        return [None if entry is None else StoredVersion(entry.size, entry.checksum)
                for entry in entries]

    def location(self, key: str) -> Location | None:
        with self.lock:
            entry = self._entries.get(key)
        return None if entry is None else self._locate(entry)

    def snapshot(self) -> list[tuple[str, E]]:
        """Every entry now, in the order they were added."""
        with self.lock:
            return list(self._entries.items())

    def is_current(self, key: str, entry: E) -> bool:
        """Whether ``key`` is still indexed as ``entry`` (not deleted, nor rewritten)."""
        with self.lock:
            return self._entries.get(key) is entry

    def record(self, key: str, entry: E) -> ObjectRecord:
        """The :class:`ObjectRecord` that ``stat`` and ``scan`` report for an entry."""
        return ObjectRecord(key, entry.size, entry.checksum, self._locate(entry),
                            entry.write_ns / 1e9, entry.seq)

    def locate(self, entry: E) -> Location:
        return self._locate(entry)

    # -- changes (the caller holds the lock) ----------------------------------------------

    def get(self, key: str) -> E | None:
        return self._entries.get(key)

    def get_many(self, keys: Iterable[str]) -> list[E | None]:
        """``get`` of each key, in one call (a read path looks up a group of keys)."""
        return list(map(self._entries.get, keys))

    def __getitem__(self, key: str) -> E:
        return self._entries[key]

    def add(self, key: str, entry: E) -> E | None:
        """Index ``entry`` under ``key``; returns the entry it replaced, if any."""
        old = self._entries.get(key)
        if old is not None:
            self.logical_bytes -= old.size
        self._entries[key] = entry
        self.logical_bytes += entry.size
        return old

    def pop(self, key: str) -> E | None:
        """Forget ``key``; its entry, or None if it was not indexed."""
        entry = self._entries.pop(key, None)
        if entry is not None:
            self.logical_bytes -= entry.size
        return entry

    def items(self) -> list[tuple[str, E]]:
        return list(self._entries.items())

    def clear(self) -> None:
        self._entries.clear()
        self.logical_bytes = 0

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    # -- scan --------------------------------------------------------------------------

    def scan(self, read: BatchRead | None = None) -> Iterator[ObjectRecord]:
        """The record of every entry of a snapshot. With ``read`` (the backend's
        ``batch_read``), each value is read back first, in batches, and only the entries
        whose read returned the whole value are reported (``scan(verify=True)``)."""
        snapshot = self.snapshot()
        if read is None:
            for key, entry in snapshot:
                yield self.record(key, entry)
            return
        batch: list[tuple[str, E]] = []
        size = 0
        for item in snapshot:
            if batch and (len(batch) >= SCAN_BATCH or size + item[1].size > SCAN_BATCH_BYTES):
                yield from self._verified(batch, read)
                batch, size = [], 0
            batch.append(item)
            size += item[1].size
        if batch:
            yield from self._verified(batch, read)

    def _verified(self, batch: list[tuple[str, E]], read: BatchRead) -> Iterator[ObjectRecord]:
        buffers = [memoryview(bytearray(entry.size)) for _, entry in batch]
        for (key, entry), got in zip(batch, read([key for key, _ in batch], buffers)):
            if got == entry.size:
                yield self.record(key, entry)


class IndexedBackend(StorageBackend):
    """A :class:`StorageBackend` whose visible objects are all in an :class:`ObjectIndex`,
    :attr:`index`: ``batch_contains``, ``stat``, ``locate`` and ``scan`` are answered from
    it (the first three from memory only). Set ``self.index`` in ``__init__``.

    Its read path reports each read that did not verify with :meth:`_note_failed_read`,
    which counts it in :attr:`corrupt_reads` and logs it once, the same way for every
    backend.
    """

    index: ObjectIndex[Any]
    #: Reads that failed their checks since open.
    corrupt_reads: int = 0

    def _note_failed_read(self, key: str, where: str, outcome: ReadOutcome) -> None:
        """A read of ``key`` (at ``where``: a file, an offset) did not verify and was
        reported as ``outcome.status``: count it if corrupt, and say why in the log."""
        name = self.name or type(self).__name__
        if outcome.status == ReadStatus.CORRUPT:
            self.corrupt_reads += 1
            log.warning("%s: %r in %s failed its check (%s); reported as a miss (run "
                        "check(repair=True) to quarantine it)", name, key, where,
                        outcome.reason)
        else:
            log.warning("%s: reading %r in %s failed (%s); reported as %s", name, key,
                        where, outcome.reason, ReadStatus(outcome.status).name)

    def batch_contains(self, keys: Sequence[str]) -> list[bool]:
        self._check_open()
        return self.index.contains(keys)

    def stat(self, key: str) -> ObjectRecord | None:
        self._check_open()
        return self.index.stat(key)

    def batch_versions(self, keys: Sequence[str]) -> list[StoredVersion | None]:
        self._check_open()
        return self.index.versions(keys)

    def locate(self, key: str) -> Location | None:
        self._check_open()
        return self.index.location(key)

    def scan(self, *, verify: bool = False) -> Iterator[ObjectRecord]:
        self._check_open()
        return self.index.scan(self.batch_read if verify else None)
