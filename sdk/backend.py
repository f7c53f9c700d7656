"""The :class:`StorageBackend` ABC: the contract between kvstored and an SSD backend.

A backend stores immutable objects (a UTF-8 key, a byte value) under one directory or
on one device. kvstored keeps the cluster's metadata itself; a backend only has to keep
its own objects safe and findable. Read this page as the contract the conformance kit
(:mod:`kvstored.sdk.testing`) checks.

Blocking and threads
    Every method blocks until its work is done and is safe to call from several threads
    at once. Async code calls a backend through a worker thread (``trio.to_thread``).

Atomicity and durability
    Each item of :meth:`~StorageBackend.batch_write` either becomes durable and visible,
    or is reported failed and leaves nothing visible, not even after a crash. "Durable"
    means the bytes and whatever index points at them are on stable storage (fsync'd,
    and so is the directory of every file created, renamed or unlinked) before the call
    returns. A process killed, or the power cut, in the middle of a batch leaves every
    object of that batch either complete and correct or absent. The kit checks both: it
    kills processes, and it cuts the power under a file system that loses every write
    not made durable (docs/sdk.md, "Power loss").

Write-once
    Objects are immutable. Writing a key that exists reports
    :attr:`~kvstored.sdk.WriteOutcome.EXISTS` and leaves the stored value as it was.

Integrity
    Values carry a CRC-32C checked on every read. A mismatch is reported as
    :attr:`~kvstored.sdk.ReadStatus.CORRUPT`; bytes that failed their checksum are
    never presented as a value.

Deletes
    A deleted key is gone for good: it must not reappear after a close, a reopen, a
    crash, a power cut or a recovery scan.

Capacity and eviction
    A backend opened with ``capacity`` never occupies more than that many bytes of disk
    (:attr:`~kvstored.sdk.Usage.physical_bytes`). When a write does not fit, the backend
    evicts by its own policy (calling ``on_evict`` first) or fails the item with
    :class:`~kvstored.sdk.CapacityError`. Eviction never removes an object while a read
    of it is in progress or a :meth:`~StorageBackend.pin` holds it.

Opening, and who else may
    A backend is opened in one of three modes (:class:`~kvstored.sdk.OpenMode`, the
    common ``mode`` option): read-write (the default), read-only (writes nothing: the
    offline tools use it to look at a stopped node's directory) and repair (rebuild
    damaged metadata from the records instead of refusing). A backend lists the modes it
    supports in :attr:`StorageBackend.open_modes`. One store has one writer: a read-write
    open takes an exclusive lock (:class:`kvstored.sdk.lock.StoreLock`) that a second
    open, read-write or read-only, is refused with
    :class:`~kvstored.sdk.BackendBusyError`.

Never destroy what cannot be read
    No open, in any mode, creates, formats or truncates a store over existing data it
    cannot parse: a damaged stamp, superblock or index is refused with an error naming
    the file and what to do, or (in repair mode) set aside into the quarantine first.

Privacy
    Stored values are users' data: everything a backend creates is private to its user,
    directories 0700 and files 0600 (:mod:`kvstored.sdk.files`).

Errors
    Programming errors (a bad key, an oversized value, a closed backend) raise
    :class:`~kvstored.sdk.InvalidRequestError` at once, before any item is done. Per-item
    failures of batch calls are reported in the results, not raised, so that one bad
    item never hides the others. See :mod:`kvstored.sdk.errors`.

Writing a backend
    Subclass :class:`StorageBackend`, call ``super().__init__(path, ...)`` from your
    ``__init__``, implement the abstract methods, and run the conformance kit:
    ``python -m kvstored.sdk.testing your.module:YourBackend``. ``docs/sdk.md`` walks
    through one.
"""

from __future__ import annotations

import abc
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import ClassVar, Self

from kvstored.sdk.errors import (
    BackendClosedError,
    InvalidRequestError,
    ReadOnlyError,
    ValueTooLargeError,
)
from kvstored.sdk.pins import ReadPins
from kvstored.sdk.types import (
    DEFAULT_MAX_VALUE_SIZE,
    Buffer,
    Capabilities,
    CheckReport,
    Location,
    ObjectRecord,
    OpenMode,
    ReadStatus,
    Usage,
    WriteBatchHint,
    WriteResult,
    encode_key,
)

#: Called with the keys an eviction removes, after they stopped being visible and
#: before their space can be reused. It must not call back into the backend.
EvictionCallback = Callable[[list[str]], None]


class StorageBackend(abc.ABC):
    """An SSD tier: immutable objects under one directory or on one device.

    Construct through :func:`kvstored.sdk.registry.open_backend` or the subclass's
    :meth:`open`. Every backend accepts these options, plus its own:

    ``capacity``
        Bytes of disk the backend may occupy, or None to be bounded only by the file
        system.
    ``max_value_size``
        The largest value accepted (default 256 MiB).
    ``on_evict``
        An :data:`EvictionCallback` for evictions the backend does on its own (when a
        write needs room); :meth:`evict` takes its own callback.
    ``mode``
        An :class:`~kvstored.sdk.OpenMode` (default read-write). A backend that supports
        more than read-write says so in :attr:`open_modes`; the registry
        (:func:`kvstored.sdk.registry.open_backend`) refuses a mode it does not list, and
        passes ``mode`` only when it is not the default, so a backend that knows only
        read-write needs no ``mode`` parameter.
    """

    #: The registry name, such as ``"bucket"``.
    name: ClassVar[str] = ""
    #: The open modes this backend implements.
    open_modes: ClassVar[frozenset[OpenMode]] = frozenset({OpenMode.READ_WRITE})

    def __init__(self, path: str | os.PathLike, *, capacity: int | None = None,
                 max_value_size: int = DEFAULT_MAX_VALUE_SIZE,
                 on_evict: EvictionCallback | None = None,
                 mode: OpenMode = OpenMode.READ_WRITE) -> None:
        if capacity is not None and capacity <= 0:
            raise InvalidRequestError(f"capacity must be positive, not {capacity}", path=path)
        if max_value_size < 0:
            raise InvalidRequestError(f"max_value_size must be >= 0, not {max_value_size}")
        self.path = os.fspath(path)
        self.capacity = capacity
        self.max_value_size = max_value_size
        self.on_evict = on_evict
        mode = OpenMode(mode)
        if mode not in self.open_modes:
            raise ReadOnlyError(
                f"the {self.name or type(self).__name__} backend cannot be opened "
                f"{mode.value}; it supports {', '.join(sorted(m.value for m in self.open_modes))}",
                path=path)
        self.mode = mode
        self._pins = ReadPins()
        self._closed = False
        self._close_lock = threading.Lock()

    # -- lifecycle -------------------------------------------------------------------

    @classmethod
    def open(cls, path: str | os.PathLike, **options) -> Self:
        """Open (creating it if needed, read-write) the backend at ``path``.

        Blocks while recovery runs: an interrupted write is rolled back, and objects
        whose records do not check are left out (and reported by :meth:`check`).
        Read-only, nothing is rolled back or created: what recovery would tidy is
        left in place and reported by :meth:`check`.

        Raises:
            BackendBusyError: another process has the store open.
            MissingStoreError: read-only, and there is no store at ``path``.
            CorruptionError: the store's own metadata cannot be read (the message says
                what to do; repair mode rebuilds it).
            CapacityError: a store that preallocates its space does not fit.
        """
        return cls(path, **options)

    def close(self) -> None:
        """Release files, locks and memory. Idempotent: a second call does nothing.

        Everything acknowledged stays durable. On return the store's lock is released,
        so that another process (or this one) can open it at once. Any other call
        afterwards raises :class:`~kvstored.sdk.BackendClosedError`.
        """
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        self._close()

    @abc.abstractmethod
    def _close(self) -> None:
        """Release resources; called once, by :meth:`close`."""

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise BackendClosedError(f"the {self.name or type(self).__name__} backend is closed",
                                     path=self.path)

    @property
    def read_only(self) -> bool:
        return self.mode is OpenMode.READ_ONLY

    def _check_writable(self) -> None:
        """Raise unless the backend is open and may change the store: every changing
        call (writes, deletes, evictions, repairs) starts with it."""
        self._check_open()
        if self.mode is OpenMode.READ_ONLY:
            raise ReadOnlyError(f"the {self.name or type(self).__name__} backend was opened "
                                "read-only; open it read-write to change the store",
                                path=self.path)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    # -- capabilities ----------------------------------------------------------------

    @property
    @abc.abstractmethod
    def capabilities(self) -> Capabilities:
        """What this instance can do (see :class:`~kvstored.sdk.Capabilities`)."""

    # -- data ------------------------------------------------------------------------

    @abc.abstractmethod
    def batch_write(self, items: Sequence[tuple[str, Buffer]]) -> list[WriteResult]:
        """Store each ``(key, value)`` pair; return one :class:`WriteResult` per item,
        in order.

        On return every item is durable and visible (``WRITTEN``), was already stored
        (``EXISTS``: a key seen earlier in the same batch counts as stored), or failed
        (``FAILED``, with the error) and left nothing visible. Raises
        :class:`InvalidRequestError` before writing anything if a key is invalid or a
        value exceeds ``max_value_size``. The caller may reuse the buffers on return.
        """

    @abc.abstractmethod
    def batch_read(self, keys: Sequence[str], buffers: Sequence[memoryview]) -> list[int]:
        """Read each key's value into the matching writable buffer.

        Returns one int per key: the value's length (the bytes are in
        ``buffer[:length]``), or a negative :class:`ReadStatus`. A corrupt value is
        reported, never returned. Keys being read are pinned for the duration, so
        eviction cannot remove them underneath the read.
        """

    @abc.abstractmethod
    def batch_delete(self, keys: Sequence[str]) -> list[bool]:
        """Delete each key; True where it existed. Idempotent.

        A deleted key is invisible on return and never comes back, not even after a
        crash. Space held by a read in progress is reused only when that read ends.
        """

    @abc.abstractmethod
    def batch_contains(self, keys: Sequence[str]) -> list[bool]:
        """Whether each key is stored. Answers from memory; does no disk I/O."""

    @abc.abstractmethod
    def stat(self, key: str) -> ObjectRecord | None:
        """The record of ``key``, or None. Answers from memory."""

    @abc.abstractmethod
    def scan(self, *, verify: bool = False) -> Iterator[ObjectRecord]:
        """Iterate over every stored object whose record checks.

        With ``verify=True`` each value is read and its checksum checked too, and
        values that fail are skipped (:meth:`check` reports them). The iteration
        reflects a snapshot; objects written meanwhile may or may not appear.
        """

    @abc.abstractmethod
    def usage(self) -> Usage:
        """Current capacity figures. Equal before and after a close and reopen."""

    @abc.abstractmethod
    def evict(self, nbytes: int, on_evict: EvictionCallback | None = None) -> list[str]:
        """Free at least ``nbytes`` of disk if possible, by the backend's policy.

        Pinned keys (reads in progress) are skipped. ``on_evict`` is called with the
        victims after they became invisible and before their space can be reused; the
        same keys are returned. A backend that evicts by bucket removes whole buckets.
        Returns fewer bytes' worth than asked when nothing more can be evicted.
        """

    @abc.abstractmethod
    def locate(self, key: str) -> Location | None:
        """Where ``key``'s bytes are on disk, or None if it is not stored."""

    @abc.abstractmethod
    def check(self, repair: bool = False) -> CheckReport:
        """Examine every record and index; report corrupt records, orphans, torn
        writes and index mismatches.

        With ``repair=True`` fix what was found: bad records are moved to a
        quarantine folder (never simply deleted, so the evidence survives) and dropped
        from the index. A second ``check()`` after a repair finds nothing.

        On a backend opened read-only, ``check()`` reads and changes nothing, and
        ``repair=True`` raises :class:`~kvstored.sdk.ReadOnlyError`.
        """

    # -- optional, with defaults -------------------------------------------------------

    def write_batch_hint(self) -> WriteBatchHint:
        """How callers should batch writes (see :class:`WriteBatchHint`). Override it
        when the layout prefers other sizes, as a bucket backend does."""
        return WriteBatchHint()

    # -- conveniences built on the abstract methods ------------------------------------

    def pin(self, keys: Iterable[str]) -> AbstractContextManager[None]:
        """Hold ``keys`` against eviction while the context is open (a read lease)."""
        self._check_open()
        return self._pins.hold(keys)

    def contains(self, key: str) -> bool:
        return self.batch_contains([key])[0]

    def write(self, key: str, value: Buffer) -> WriteResult:
        return self.batch_write([(key, value)])[0]

    def read(self, key: str) -> bytes | None:
        """The value of ``key``, or None if missing. Raises CorruptionError if corrupt."""
        from kvstored.sdk.errors import BackendIOError, CorruptionError

        while True:
            record = self.stat(key)
            if record is None:
                return None
            buf = bytearray(record.size)
            got = self.batch_read([key], [memoryview(buf)])[0]
            if got >= 0:
                return bytes(buf[:got])
            if got == ReadStatus.MISSING:
                return None
            if got == ReadStatus.CORRUPT:
                raise CorruptionError("the stored value failed its checksum", key=key,
                                      path=self.path)
            if got == ReadStatus.IO_ERROR:
                raise BackendIOError("reading failed", errno=5, key=key, path=self.path)
            # BUFFER_TOO_SMALL cannot happen for an immutable object; loop defensively.

    def delete(self, key: str) -> bool:
        return self.batch_delete([key])[0]

    def _check_value_sizes(self, items: Sequence[tuple[str, Buffer]]) -> list[bytes]:
        """Validate a write batch up front; return the encoded keys."""
        encoded = []
        for key, value in items:
            encoded.append(encode_key(key))
            size = memoryview(value).nbytes
            if size > self.max_value_size:
                raise ValueTooLargeError(
                    f"value of {size} bytes exceeds max_value_size={self.max_value_size}; "
                    "raise the backend's max_value_size option or split the object",
                    key=key, path=self.path)
        return encoded

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<{type(self).__name__} {self.name!r} at {self.path!r} ({state})>"
