"""The storage-backend SDK: the stable interface between kvstored and an SSD backend.

Start with :class:`StorageBackend` (the contract), the value types below, and the error
taxonomy in :mod:`kvstored.sdk.errors`. The mechanisms every backend needs and is easy to
get wrong are here too, ready to use: :class:`WriteClaims` (two writers of one key,
without deadlock), :class:`StoreLock` (one process per store), :class:`Quarantine`
(evidence set aside, never deleted), :mod:`kvstored.sdk.files` (private, durable
files), :mod:`kvstored.sdk.record` (a self-describing record, and the one way to verify
one read back), :class:`ObjectIndex` and :class:`IndexedBackend` (the in-memory index
and the calls answered from it), :class:`EvictionPolicy` (fifo and lru, in one table),
:mod:`kvstored.sdk.check` (the record pass of ``check``) and :mod:`kvstored.sdk.stamp`
(claiming a directory). Prove a backend with the conformance kit,
:mod:`kvstored.sdk.testing`. ``docs/sdk.md`` is the tutorial.
"""

from kvstored.sdk.backend import EvictionCallback, OpenProgress, StorageBackend
from kvstored.sdk.claims import WriteClaims
from kvstored.sdk.errors import (
    BackendBusyError,
    BackendClosedError,
    BackendError,
    BackendIOError,
    CapacityError,
    CorruptionError,
    InvalidKeyError,
    InvalidRequestError,
    MissingStoreError,
    ReadOnlyError,
    UnknownBackendError,
    ValueTooLargeError,
)
from kvstored.sdk.eviction import EvictionOrder, EvictionPolicy
from kvstored.sdk.group_reads import GroupReadBackend
from kvstored.sdk.index import IndexedBackend, ObjectIndex
from kvstored.sdk.lock import StoreLock
from kvstored.sdk.quarantine import Quarantine
from kvstored.sdk.types import (
    DEFAULT_MAX_VALUE_SIZE,
    MAX_KEY_BYTES,
    Buffer,
    Capabilities,
    CheckReport,
    EvictionGranularity,
    Location,
    ObjectRecord,
    OpenMode,
    Problem,
    ProblemKind,
    ReadStatus,
    RepairAction,
    StoredVersion,
    Usage,
    WriteBatchHint,
    WriteOutcome,
    WriteResult,
    encode_key,
)
from kvstored.sdk.version import SDK_VERSION

__all__ = [
    "DEFAULT_MAX_VALUE_SIZE",
    "MAX_KEY_BYTES",
    "SDK_VERSION",
    "BackendBusyError",
    "BackendClosedError",
    "BackendError",
    "BackendIOError",
    "Buffer",
    "Capabilities",
    "CapacityError",
    "CheckReport",
    "CorruptionError",
    "EvictionCallback",
    "EvictionGranularity",
    "EvictionOrder",
    "EvictionPolicy",
    "GroupReadBackend",
    "IndexedBackend",
    "InvalidKeyError",
    "InvalidRequestError",
    "Location",
    "MissingStoreError",
    "ObjectIndex",
    "ObjectRecord",
    "OpenMode",
    "OpenProgress",
    "Problem",
    "ProblemKind",
    "Quarantine",
    "ReadOnlyError",
    "ReadStatus",
    "RepairAction",
    "StorageBackend",
    "StoreLock",
    "StoredVersion",
    "UnknownBackendError",
    "Usage",
    "ValueTooLargeError",
    "WriteBatchHint",
    "WriteClaims",
    "WriteOutcome",
    "WriteResult",
    "encode_key",
]
