"""Plain value types that cross the SDK boundary: results, records, usage, reports.

They are frozen dataclasses (or int enums on the hot read path), so a backend can build
them cheaply and a caller can keep them without aliasing surprises.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import NamedTuple

from kvstored.sdk.errors import BackendError, InvalidKeyError

#: What a value may be passed as: anything exposing a contiguous byte buffer.
Buffer = bytes | bytearray | memoryview

#: Keys are UTF-8 strings of at most this many bytes once encoded.
MAX_KEY_BYTES = 1024
#: The default for the ``max_value_size`` option every backend accepts.
DEFAULT_MAX_VALUE_SIZE = 256 * 1024 * 1024


def encode_key(key: str) -> bytes:
    """Return the UTF-8 bytes of ``key``, or raise :class:`InvalidKeyError`.

    Any non-empty string encodable as UTF-8 in at most :data:`MAX_KEY_BYTES` bytes is a
    valid key: ``/``, ``..``, NUL, spaces and non-ASCII characters included. Backends
    must never use a key as a path.
    """
    if not isinstance(key, str):
        raise InvalidKeyError(f"a key must be a str, not {type(key).__name__}")
    if not key:
        raise InvalidKeyError("a key must not be empty")
    try:
        raw = key.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidKeyError(f"a key must be valid UTF-8 ({exc.reason})", key=key) from None
    if len(raw) > MAX_KEY_BYTES:
        raise InvalidKeyError(
            f"a key may be at most {MAX_KEY_BYTES} bytes of UTF-8; this one is {len(raw)}",
            key=key[:64] + "…",
        )
    return raw


class WriteOutcome(enum.Enum):
    #: The object is now durable and visible.
    WRITTEN = "written"
    #: The key already existed; objects are written once, so nothing was written.
    EXISTS = "exists"
    #: Nothing of the object is visible; ``WriteResult.error`` says why.
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class WriteResult:
    """The result of one item of :meth:`StorageBackend.batch_write`."""

    key: str
    outcome: WriteOutcome
    error: BackendError | None = None

    @property
    def ok(self) -> bool:
        """True when the key is stored after the call (written now, or before)."""
        return self.outcome is not WriteOutcome.FAILED


class ReadStatus(enum.IntEnum):
    """Negative results of :meth:`StorageBackend.batch_read`; a result >= 0 is a length.

    Plain ints keep the read path cheap; compare with these names.
    """

    #: No such key (never written, deleted, or evicted).
    MISSING = -1
    #: The stored bytes failed their checksum. Nothing was copied into the buffer
    #: that the caller may trust; treat it as a miss.
    CORRUPT = -2
    #: The caller's buffer is shorter than the value; nothing was read.
    BUFFER_TOO_SMALL = -3
    #: The operating system failed the read (EIO and the like).
    IO_ERROR = -4


@dataclass(frozen=True, slots=True)
class Location:
    """Where an object's bytes sit, for debugging and for shared backends.

    ``path`` is a file or a block device (``device`` tells which); ``offset`` and
    ``length`` delimit the value; ``record_offset`` and ``record_length`` delimit the
    whole on-disk record (header, key, value, padding) when the backend has one.
    """

    path: str
    offset: int
    length: int
    record_offset: int | None = None
    record_length: int | None = None
    device: bool = False

    def __str__(self) -> str:
        kind = "device" if self.device else "file"
        return f"{kind} {self.path} @ {self.offset} (+{self.length})"


@dataclass(frozen=True, slots=True)
class ObjectRecord:
    """One stored object, as :meth:`StorageBackend.scan` and ``stat`` report it."""

    key: str
    size: int
    #: CRC-32C (Castagnoli) of the value.
    checksum: int
    location: Location
    #: Seconds since the epoch when the object was written.
    write_time: float
    #: The backend's write sequence number: larger means written later.
    seq: int


class StoredVersion(NamedTuple):
    """Which version of a key is stored: its value's size and checksum, the two fields
    of :class:`ObjectRecord` a reader needs to plan its buffers and tell versions
    apart (:meth:`StorageBackend.batch_versions`)."""

    size: int
    #: CRC-32C (Castagnoli) of the value.
    checksum: int


@dataclass(frozen=True, slots=True)
class Usage:
    """Capacity figures. ``capacity_bytes`` is None when only the file system bounds it."""

    #: Sum of the value sizes of visible objects.
    logical_bytes: int
    #: Bytes the backend occupies on disk (headers, padding, index files included).
    physical_bytes: int
    objects: int
    capacity_bytes: int | None


class OpenMode(enum.Enum):
    """How a backend is opened (the common ``mode`` option)."""

    #: The normal open: recovery may tidy the store (roll back an unfinished write,
    #: set aside what does not check); a new store is created where there is none.
    READ_WRITE = "read-write"
    #: Write nothing at all: no recovery writes, no new file or directory, no stamp.
    #: What recovery would tidy is left in place and reported by ``check()``. Refuses a
    #: store that a read-write open holds, and a path that holds no store
    #: (MissingStoreError). Changing calls raise ReadOnlyError.
    READ_ONLY = "read-only"
    #: Read-write, and where the store's own metadata is damaged beyond what a normal
    #: open accepts (an unreadable stamp, superblock or journal), set the damaged part
    #: aside and rebuild it from the records that still check, instead of refusing.
    REPAIR = "repair"


class EvictionGranularity(enum.Enum):
    #: Each object can be evicted on its own.
    OBJECT = "object"
    #: Objects are evicted a bucket (a group written together) at a time.
    BUCKET = "bucket"
    #: The backend never evicts; a full backend fails writes with CapacityError.
    NONE = "none"


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a backend can do; the daemon plans around these."""

    #: Every node can read every object directly (a shared file system such as 3FS).
    shared: bool
    eviction: EvictionGranularity
    #: Values start on 4 KiB boundaries in their file, so O_DIRECT reads need no bounce.
    aligned_values: bool
    #: Objects survive close and reopen (and a process kill, once acknowledged).
    persistent: bool
    #: The largest value this instance accepts.
    max_value_size: int
    #: The backend can be opened with ``mode=OpenMode.READ_ONLY`` (it writes nothing then).
    read_only_open: bool = False


@dataclass(frozen=True, slots=True)
class WriteBatchHint:
    """How a caller should group writes for this backend.

    The node's offloader accumulates objects and calls ``batch_write`` once it has
    ``max_bytes`` or ``max_keys`` of them, or the oldest has waited ``max_age``
    seconds, whichever comes first. The age bound is what gets a trickle of small
    objects to disk.
    """

    max_bytes: int = 64 * 1024 * 1024
    max_keys: int = 256
    max_age: float = 0.5


class ProblemKind(enum.Enum):
    #: A record whose header, key or value fails its checksum, or is malformed.
    CORRUPT_RECORD = "corrupt-record"
    #: A file the backend did not write, or a record no index points at.
    ORPHAN = "orphan"
    #: The index and the records disagree (a missing file, a wrong size or key).
    INDEX_MISMATCH = "index-mismatch"
    #: A write that did not finish (a temporary file, a short record).
    TORN_WRITE = "torn-write"
    #: The capacity accounting disagrees with what is on disk.
    ACCOUNTING = "accounting"


class RepairAction(enum.Enum):
    """What was done about a :class:`Problem` (``Problem.action``); ``action_detail``
    says the specifics (where the evidence went, what was rebuilt from what)."""

    #: The bytes were set aside in the quarantine folder (copied or moved there:
    #: ``action_detail`` is where), and the object, if any, dropped from the index.
    QUARANTINED = "quarantined"
    #: The entry was taken out of the index; nothing was left on disk worth keeping
    #: (its file was gone, or the record lay past the end of a truncated file).
    DROPPED_FROM_INDEX = "dropped-from-index"
    #: A valid record that nothing indexed was added to the index.
    ADDED_TO_INDEX = "added-to-index"
    #: Damaged or missing metadata (an index, a stamp, a superblock, a checkpoint, a
    #: journal) was written anew from what still checks; a damaged copy, if there was
    #: one, is in the quarantine.
    REBUILT = "rebuilt"
    #: A write that never finished, hence was never acknowledged, was removed: nothing
    #: of value was lost.
    REMOVED = "removed"
    #: An accounting figure was corrected to what is on disk.
    CORRECTED = "corrected"
    #: The store was opened read-only, so nothing was changed: the next read-write open
    #: tidies it (an unfinished write it will remove).
    LEFT_FOR_NEXT_OPEN = "left-for-next-open"


@dataclass(frozen=True, slots=True)
class Problem:
    """One finding of :meth:`StorageBackend.check`."""

    kind: ProblemKind
    detail: str
    key: str | None = None
    path: str | None = None
    #: What repair (or an open) did about it, if anything yet.
    action: RepairAction | None = None
    #: The specifics of ``action``: where the bytes went, what was rebuilt from what.
    action_detail: str | None = None

    def as_dict(self) -> dict[str, str | None]:
        """The plain form a report travels in (JSON, msgpack): enums as their values."""
        return {"kind": self.kind.value, "detail": self.detail, "key": self.key,
                "path": self.path, "action": self.action.value if self.action else None,
                "action_detail": self.action_detail}

    def describe_action(self) -> str | None:
        """``action`` and its detail in words, for a person (``quarantined: /…``)."""
        if self.action is None:
            return None
        return f"{self.action.value}: {self.action_detail}" if self.action_detail \
            else self.action.value


@dataclass(slots=True)
class CheckReport:
    """What :meth:`StorageBackend.check` found and, with ``repair=True``, fixed."""

    problems: list[Problem] = field(default_factory=list)
    repaired: bool = False
    #: Records examined, so that "no problems" can be told from "looked at nothing".
    records_checked: int = 0

    @property
    def ok(self) -> bool:
        """True when nothing was found, or everything found was repaired."""
        return not self.problems or (self.repaired and all(p.action is not None
                                                           for p in self.problems))

    def count(self, kind: ProblemKind) -> int:
        return sum(1 for p in self.problems if p.kind is kind)
