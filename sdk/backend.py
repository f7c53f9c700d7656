"""The :class:`StorageBackend` ABC: the contract between kvstored and an SSD backend.

A backend stores immutable objects (a UTF-8 key, a byte value) under one directory or
on one device. kvstored keeps the cluster's metadata itself; a backend only has to keep
its own objects safe and findable. Read this page as the contract the conformance kit
(:mod:`kvstored.sdk.testing`) checks: each heading below is a clause, and every check of
the kit names the clause it proves (docs/sdk.md lists them). Nothing a backend does may
contradict a clause; where a clause leaves a choice, it says so.

Keys
    A key is any non-empty ``str`` that encodes as UTF-8 in at most 1024 bytes
    (:data:`~kvstored.sdk.MAX_KEY_BYTES`); ``/``, ``..``, NUL, spaces and non-ASCII are
    ordinary characters. Two keys are the same object exactly when their UTF-8 bytes are
    equal: no case folding, no normalisation, no truncation (two 1024-byte keys that
    differ in their last byte are two objects). A backend never uses a key as a path,
    nor a prefix of it as a name. An invalid key raises
    :class:`~kvstored.sdk.InvalidKeyError` before any item of the batch is done.

Buffers
    Writes: ``batch_write`` copies or persists each value before it returns; the caller
    may reuse or change its buffers at once, and nothing stored changes with them. A
    backend keeps no reference to a caller's buffer. Reads: each key gets one writable
    buffer; a read-only buffer, or a different number of buffers than keys, raises
    :class:`~kvstored.sdk.InvalidRequestError` before any item is read
    (:meth:`StorageBackend._check_read_buffers`). A buffer shorter than the value gets
    ``BUFFER_TOO_SMALL`` and is not written to. After any negative result (``MISSING``,
    ``CORRUPT``, ``BUFFER_TOO_SMALL``, ``IO_ERROR``) the buffer holds nothing of the
    stored bytes: it is as the caller left it, or zeroed.

Blocking and threads
    Every method is safe to call from several threads at once. ``batch_*`` (except
    ``batch_contains`` and ``batch_versions``), ``scan``, ``evict``, ``check``, ``open``
    and ``close`` may block on disk; async code calls them through a worker thread
    (``trio.to_thread``). ``batch_contains``, ``batch_versions``, ``stat``, ``locate``,
    ``usage``, ``capabilities``, ``write_batch_hint`` and ``pin`` answer from memory: no
    read or write system call, no path looked up (the node calls them on its event
    loop). Two batches naming the same keys in any order never deadlock
    (:class:`~kvstored.sdk.WriteClaims`).

Atomicity and durability
    Each item of :meth:`~StorageBackend.batch_write` either becomes durable and visible,
    or is reported failed and leaves nothing visible, not even after a crash. "Durable"
    means the bytes and whatever index points at them are on stable storage (fsync'd,
    fdatasync'd, or written O_DIRECT and flushed, and so is the directory of every file
    created, renamed or unlinked) before the call returns. A process killed, or the
    power cut, in the middle of a batch leaves every object of that batch either
    complete and correct or absent, and every acknowledged object readable. The kit
    checks both: it kills real child processes with SIGKILL, and it cuts the power under
    a file system that loses every write not made durable (docs/sdk.md, "Power loss").

Write-once
    Objects are immutable. Writing a key that exists reports
    :attr:`~kvstored.sdk.WriteOutcome.EXISTS` and leaves the stored value as it was; a
    key repeated within one batch is written once, the first value wins.

Batch failures
    Failure is per item, always: one item's failure never fails, hides or undoes
    another's. Capacity is judged item by item: an item that could never fit (larger
    than the whole capacity) fails alone with :class:`~kvstored.sdk.CapacityError`,
    and the items beside it are written. A backend may fail several items together
    only for a cause that hits the unit they are written in (an I/O error or ENOSPC on
    the bucket or journal write that carries them); it says so by giving each of them
    ``FAILED`` with the same error. Programming errors are not per item: see Errors.

Integrity
    Values carry a CRC-32C checked on every read, the hundredth as much as the first
    (no "already verified" shortcut). A mismatch is reported as
    :attr:`~kvstored.sdk.ReadStatus.CORRUPT`; bytes that failed their checksum are
    never presented as a value.

Read streams
    :meth:`~StorageBackend.read_stream` reads the same as ``batch_read`` and hands out
    each ``(index, result)`` as its read completes, while later reads are in flight:
    every index of the keys exactly once, in no promised order; ``result`` is what
    ``batch_read`` would give (the same checksum on every read, the same corrupt reads
    reported, nothing of a failed read's stored bytes in its buffer). A key is looked up
    and pinned when its read starts and stays pinned until its item has been yielded;
    closing the iterator early (``close()``, or dropping it) waits for the reads in
    flight and releases every pin. Bad buffers raise at the call, as for ``batch_read``.

Records that check
    At open, a record is admitted into the index only if its header checksum holds,
    its key and length are those the header says, the whole value (its full length)
    is present on disk, and its ``seq`` does not conflict with a newer record of the
    key; its value checksum is checked on every read (and by ``scan(verify=True)`` and
    ``check()``). A record cut short at the tail, or otherwise failing, is left out:
    ``contains()`` denies it, ``scan()`` does not list it, a read reports ``MISSING``.

Deletes
    A deleted key is gone for good, durably when ``batch_delete`` returns: it must not
    reappear after a close, a reopen, a process killed right after the call, a power
    cut, or a recovery scan. The same holds for keys ``evict`` removed. A key deleted
    or evicted and written again reads its new bytes, never the old ones.

Capacity
    A backend opened with ``capacity`` never occupies more than that many bytes of disk,
    as measured by the blocks of its files (``st_blocks``), not only as it counts them:
    :attr:`~kvstored.sdk.Usage.physical_bytes` counts the disk its objects and metadata
    take (records with their headers and padding, indexes, journals), so that whatever
    its files grow by is counted; a backend that preallocates a volume counts the part
    in use, and the volume itself fits in the capacity. Small fixed files (the stamp,
    the lock) are the only disk outside both (the kit allows them 16 KiB).
    When a write does not fit, the backend evicts by its own policy (calling
    ``on_evict`` first) or fails the item with :class:`~kvstored.sdk.CapacityError`.

Eviction
    ``evict(nbytes)`` frees at least ``nbytes`` of ``physical_bytes`` when that much is
    evictable, and at most ``nbytes`` plus one eviction unit (one object for
    :attr:`~kvstored.sdk.EvictionGranularity.OBJECT`; one bucket, at most
    ``write_batch_hint().max_bytes`` of values, for ``BUCKET``); it returns fewer bytes'
    worth only when nothing more can go. Victims stop being visible, then ``on_evict``
    is called with them, then their space may be reused; the same keys are returned.

Pins
    No eviction removes a pinned key (a read in progress, or a :meth:`~StorageBackend.pin`
    held): not :meth:`~StorageBackend.evict`, not the eviction a write does to make room,
    for every pinned key, not only the first.

Usage
    :meth:`~StorageBackend.usage` is exact: ``objects`` and ``logical_bytes`` are the
    count and value bytes of the visible objects, after writes, deletes, evictions of
    both kinds and concurrent writers alike, and the same before and after a reopen.

Scan
    :meth:`~StorageBackend.scan` yields every object that is live for the whole scan
    exactly once, in whatever order and page size the backend likes, and never an object
    deleted before the scan began; objects written or deleted while it runs may or may
    not appear, but never twice. Between two steps it holds no lock that a write or a
    delete needs.

Sequence numbers
    ``ObjectRecord.seq`` rises with every write (a later write has a larger seq), is
    kept by a reopen, and a write after a reopen gets a seq above every stored
    object's. The seq of an object deleted before a reopen may be reused after it.

Check and repair
    :meth:`~StorageBackend.check` reports every record that does not check, every
    orphan and torn write, and everything the last open left out or rebuilt: an open
    that dropped an acknowledged record never looks clean. Repair moves bad records to
    a quarantine (:class:`~kvstored.sdk.Quarantine`); it never deletes the evidence.

After close
    :meth:`~StorageBackend.close` is idempotent. Afterwards every other method and
    property raises :class:`~kvstored.sdk.BackendClosedError`: the batch calls,
    ``stat``, ``locate``, ``scan``, ``usage``, ``evict``, ``check``, ``pin``,
    ``capabilities`` and ``write_batch_hint``, and the next step of a ``scan()`` or a
    ``read_stream()`` iterator begun before the close (the SDK guards the capabilities,
    ``write_batch_hint`` and ``scan`` of every subclass, and every step of a stream made
    by :func:`kvstored.sdk.streams.stream_groups`).

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

Sharing
    A backend whose ``capabilities.shared`` is True lets every node read every object
    directly: the bytes at :meth:`~StorageBackend.locate` are the value, readable by
    another process with plain file I/O. Backends that are not shared are not checked
    for it (the kit reports those checks not applicable).

Capabilities
    ``capabilities`` is a :class:`~kvstored.sdk.Capabilities` of typed fields that
    describe this instance (``max_value_size`` is the one it was opened with), and
    ``locate()`` points at the value's real bytes.

Errors
    Programming errors (a bad key, an oversized value, a bad buffer, a closed backend)
    raise :class:`~kvstored.sdk.InvalidRequestError` at once, before any item is done,
    wherever the bad item sits in the batch and however long the batch. Per-item
    failures of batch calls are reported in the results, not raised, so that one bad
    item never hides the others. See :mod:`kvstored.sdk.errors`.

Versions
    A backend declares the SDK version it targets in :attr:`StorageBackend.sdk_version`
    (``"MAJOR.MINOR"``, :data:`kvstored.sdk.SDK_VERSION`). A minor bump only adds; a
    major bump may change the contract (:mod:`kvstored.sdk.version`, docs/sdk.md).

Writing a backend
    Subclass :class:`StorageBackend`, set ``name`` and ``sdk_version``, call
    ``super().__init__(path, ...)`` from your ``__init__``, implement the abstract
    methods, and run the conformance kit: ``python -m kvstored.sdk.testing
    your.module:YourBackend`` (or :func:`kvstored.sdk.testing.check_backend`).
    ``docs/sdk.md`` walks through one.
"""

from __future__ import annotations

import abc
import functools
import os
import threading
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import ClassVar, Self

from kvstored.sdk.errors import (
    BackendClosedError,
    BackendIOError,
    CorruptionError,
    InvalidRequestError,
    ReadOnlyError,
    ValueTooLargeError,
)
from kvstored.sdk.pins import ReadPins
from kvstored.sdk.streams import (
    DEFAULT_GROUP_KEYS,
    BatchReadGroup,
    StreamedRead,
    spans,
    stream_groups,
)
from kvstored.sdk.types import (
    DEFAULT_MAX_VALUE_SIZE,
    Buffer,
    Capabilities,
    CheckReport,
    Location,
    ObjectRecord,
    OpenMode,
    ReadStatus,
    StoredVersion,
    Usage,
    WriteBatchHint,
    WriteResult,
    encode_key,
)


def _is_guarded(function: Callable) -> bool:
    return getattr(function, "_refused_when_closed", False)


def _refused_when_closed(function: Callable) -> Callable:
    """``function`` (a method), raising BackendClosedError once the backend is closed."""

    @functools.wraps(function)
    def guarded(self: StorageBackend, *args, **kwargs):
        self._check_open()
        return function(self, *args, **kwargs)

    guarded._refused_when_closed = True  # type: ignore[attr-defined]
    return guarded


def _scan_refused_when_closed(scan: Callable) -> Callable:
    """``scan``, refused once closed, whose iterator raises BackendClosedError at the
    first step after a close."""

    @functools.wraps(scan)
    def guarded(self: StorageBackend, *args, **kwargs) -> Iterator[ObjectRecord]:
        self._check_open()
        return _while_open(self, scan(self, *args, **kwargs))

    guarded._refused_when_closed = True  # type: ignore[attr-defined]
    return guarded


def _while_open(backend: StorageBackend,
                records: Iterator[ObjectRecord]) -> Iterator[ObjectRecord]:
    for record in records:
        backend._check_open()
        yield record


#: Called with the keys an eviction removes, after they stopped being visible and
#: before their space can be reused. It must not call back into the backend.
EvictionCallback = Callable[[list[str]], None]
#: Called as ``progress(done, total, unit)`` (``12, 400, "buckets"``) from the thread
#: that opens a backend, while its open-time recovery runs; it must return quickly.
OpenProgress = Callable[[int, int, str], None]


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

    A backend whose open takes long (it reads many indexes) may also accept
    ``progress``, an :data:`OpenProgress`; the registry passes it only to a constructor
    that names it, so that a starting node can say how far recovery has got.
    """

    #: The registry name, such as ``"bucket"``.
    name: ClassVar[str] = ""
    #: The open modes this backend implements.
    open_modes: ClassVar[frozenset[OpenMode]] = frozenset({OpenMode.READ_WRITE})
    #: The SDK version (``"MAJOR.MINOR"``, :data:`kvstored.sdk.SDK_VERSION`) this backend
    #: was written for. Every backend declares it; the kit fails one that does not, or
    #: whose version this SDK cannot run (docs/sdk.md, "Versions").
    sdk_version: ClassVar[str | None] = None

    def __init_subclass__(cls, **kwargs: object) -> None:
        """Make the clause "after close() every call raises BackendClosedError" hold for
        the calls a backend cannot easily guard itself: the ``capabilities`` property and
        ``write_batch_hint`` (usually one-line answers), and every step of a ``scan()``
        iterator, which may have begun before the close."""
        super().__init_subclass__(**kwargs)
        found = cls.__dict__.get("capabilities")
        if isinstance(found, property) and found.fget and not _is_guarded(found.fget):
            cls.capabilities = property(_refused_when_closed(found.fget),  # type: ignore[method-assign]
                                        doc=found.__doc__)
        for name, guard in (("write_batch_hint", _refused_when_closed),
                            ("scan", _scan_refused_when_closed)):
            method = cls.__dict__.get(name)
            if callable(method) and not _is_guarded(method):
                setattr(cls, name, guard(method))

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

    def _check_checkable(self, repair: bool) -> None:
        """Raise unless :meth:`check` may run: the backend open and, to repair, writable
        (read-only, a check reads and changes nothing). Every ``check`` starts with it."""
        if repair:
            self._check_writable()
        else:
            self._check_open()

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
        (``FAILED``, with the error) and left nothing visible; failure is per item (see
        "Batch failures"). Raises :class:`InvalidRequestError` before writing anything
        if any key is invalid or any value exceeds ``max_value_size``, wherever it sits
        in the batch. The caller may reuse the buffers on return. May block on disk.
        """

    @abc.abstractmethod
    def batch_read(self, keys: Sequence[str], buffers: Sequence[memoryview]) -> list[int]:
        """Read each key's value into the matching writable buffer.

        Returns one int per key: the value's length (the bytes are in
        ``buffer[:length]``), or a negative :class:`ReadStatus`, after which the buffer
        holds nothing of the stored bytes. Every read checks the value's CRC-32C; a
        corrupt value is reported, never returned. Keys being read are pinned for the
        duration, so eviction cannot remove them underneath the read. A read-only
        buffer, or a count of buffers other than of keys, raises InvalidRequestError.
        """

    def read_stream(self, keys: Sequence[str], buffers: Sequence[memoryview]
                    ) -> Generator[StreamedRead, None, None]:
        """Read each key's value into the matching writable buffer, as ``batch_read``
        does, handing out ``(index, result)`` as the reads complete while later ones are
        in flight, so that a caller going through many keys keeps the disk busy while it
        handles what came back.

        Every index of ``keys`` is yielded exactly once, in no promised order; ``result``
        is what ``batch_read`` gives for that key: the value's length (the bytes are in
        ``buffers[index][:length]`` when the item is yielded), or a negative
        :class:`ReadStatus`, after which that buffer holds nothing of the stored bytes.
        Every value's CRC-32C is checked before its item is yielded; a corrupt value is
        reported (and counted, logged) as by ``batch_read``, never handed out. A key is
        looked up and pinned when its read starts (a key deleted before then reads
        ``MISSING``) and stays pinned until its item was yielded. ``buffers[index]`` is
        the backend's until its item is yielded; buffers must not overlap.

        Closing the iterator before its end (``close()``, leaving a ``for`` loop,
        dropping it) waits for the reads in flight and releases every pin: nothing is
        written into a buffer afterwards. Iterate on one thread: the thread that took
        the first item (the reads in flight are that thread's io ring's).

        Raises:
            InvalidRequestError: at the call, before any read (not at the first step):
                a read-only buffer, or a count of buffers other than of keys; at a step
                taken on another thread than the first, which ends the stream (its pins
                released; reads already in flight finish on the first thread's ring,
                into their buffers: do not do that).
            BackendClosedError: at the call, or at the next step after :meth:`close`.

        The default reads group after group with ``batch_read`` (its keys pinned,
        :class:`~kvstored.sdk.streams.BatchReadGroup`): correct for every backend, with
        no reads overlapping the caller's work. A backend whose I/O can stay in flight
        across calls overrides :meth:`_stream_reads` (bucket and offset do).
        """
        self._check_open()
        self._check_read_buffers(keys, buffers)
        return self._stream_reads(keys, buffers)

    def _stream_reads(self, keys: Sequence[str], buffers: Sequence[memoryview]
                      ) -> Generator[StreamedRead, None, None]:
        """The iterator of :meth:`read_stream`, its arguments already checked. Override
        it with :func:`kvstored.sdk.streams.stream_groups` and groups of your own."""
        return stream_groups(self, spans(len(keys), DEFAULT_GROUP_KEYS),
                             lambda span: BatchReadGroup(self, keys, buffers, span),
                             ahead=0)

    @abc.abstractmethod
    def batch_delete(self, keys: Sequence[str]) -> list[bool]:
        """Delete each key; True where it existed. Idempotent.

        A deleted key is invisible on return and never comes back, not even after a
        process is killed right after the call: the delete is durable on return, not at
        close or later. Space held by a read in progress is reused only when that read
        ends.
        """

    @abc.abstractmethod
    def batch_contains(self, keys: Sequence[str]) -> list[bool]:
        """Whether each key is stored. Answers from memory: no system call."""

    @abc.abstractmethod
    def stat(self, key: str) -> ObjectRecord | None:
        """The record of ``key``, or None. Answers from memory: no system call."""

    def batch_versions(self, keys: Sequence[str]) -> list[StoredVersion | None]:
        """The size and checksum of each key's stored value, or None where it is not
        stored: what ``stat`` says of each, without the rest of its record. Answers
        from memory: no system call.

        A reader planning buffers for many keys at once (a node's batched get of SSD
        objects) asks this once per batch. The default asks ``stat`` per key; an index
        that can answer for all the keys under one lock, without building a record per
        key, overrides it (:class:`~kvstored.sdk.IndexedBackend` does)."""
        versions: list[StoredVersion | None] = []
        for key in keys:
            record = self.stat(key)
            versions.append(None if record is None
                            else StoredVersion(record.size, record.checksum))
        return versions

    @abc.abstractmethod
    def scan(self, *, verify: bool = False) -> Iterator[ObjectRecord]:
        """Iterate over every stored object whose record checks, each exactly once.

        With ``verify=True`` each value is read and its checksum checked too, and
        values that fail are skipped (:meth:`check` reports them). Objects written or
        deleted while the scan runs may or may not appear, never twice; every object
        live throughout appears. After :meth:`close`, the next step raises
        BackendClosedError.
        """

    @abc.abstractmethod
    def usage(self) -> Usage:
        """Current capacity figures, exact (see "Usage" and "Capacity"). Answers from
        memory: no system call. Equal before and after a close and reopen."""

    @abc.abstractmethod
    def evict(self, nbytes: int, on_evict: EvictionCallback | None = None) -> list[str]:
        """Free at least ``nbytes`` of disk, and at most ``nbytes`` plus one eviction
        unit, by the backend's policy.

        Pinned keys (reads in progress, :meth:`pin`) are skipped. ``on_evict`` is called
        with the victims after they became invisible and before their space can be
        reused; the same keys are returned. A backend that evicts by bucket removes
        whole buckets. Returns fewer bytes' worth than asked only when nothing more can
        be evicted. Evictions are durable on return, as deletes are.
        """

    @abc.abstractmethod
    def locate(self, key: str) -> Location | None:
        """Where ``key``'s bytes are on disk, or None if it is not stored. Answers from
        memory."""

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
        self._check_open()
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

    def _check_read_buffers(self, keys: Sequence[str], buffers: Sequence[memoryview]) -> None:
        """Validate a read batch up front: one writable buffer per key."""
        if len(keys) != len(buffers):
            raise InvalidRequestError(f"{len(keys)} keys but {len(buffers)} buffers",
                                      path=self.path)
        for key, buf in zip(keys, buffers):
            if memoryview(buf).readonly:
                raise InvalidRequestError("a read buffer must be writable (a bytearray or a "
                                          "writable memoryview), not read-only", key=key,
                                          path=self.path)

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
