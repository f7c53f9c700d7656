"""The storage-backend SDK: the stable interface between kvstored and an SSD backend.

Start with :class:`StorageBackend` (the contract), the value types below, and the error
taxonomy in :mod:`kvstored.sdk.errors`. The mechanisms every backend needs and is easy to
get wrong are here too, ready to use: :class:`WriteClaims` (two writers of one key,
without deadlock), :class:`StoreLock` (one process per store), :class:`Quarantine`
(evidence set aside, never deleted) and :mod:`kvstored.sdk.files` (private, durable
files). Prove a backend with the conformance kit, :mod:`kvstored.sdk.testing`.
``docs/sdk.md`` is the tutorial.
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
    "InvalidKeyError",
    "InvalidRequestError",
    "Location",
    "MissingStoreError",
    "ObjectRecord",
    "OpenMode",
    "OpenProgress",
    "Problem",
    "ProblemKind",
    "Quarantine",
    "ReadOnlyError",
    "ReadStatus",
    "StorageBackend",
    "StoreLock",
    "UnknownBackendError",
    "Usage",
    "ValueTooLargeError",
    "WriteBatchHint",
    "WriteClaims",
    "WriteOutcome",
    "WriteResult",
    "encode_key",
]
