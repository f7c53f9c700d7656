"""The storage-backend SDK: the stable interface between kvstored and an SSD backend.

Start with :class:`StorageBackend` (the contract), the value types below, and the error
taxonomy in :mod:`kvstored.sdk.errors`. Prove a backend with the conformance kit,
:mod:`kvstored.sdk.testing`. ``docs/sdk.md`` is the tutorial.
"""

from kvstored.sdk.backend import EvictionCallback, StorageBackend
from kvstored.sdk.errors import (
    BackendClosedError,
    BackendError,
    BackendIOError,
    CapacityError,
    CorruptionError,
    InvalidKeyError,
    InvalidRequestError,
    UnknownBackendError,
    ValueTooLargeError,
)
from kvstored.sdk.types import (
    DEFAULT_MAX_VALUE_SIZE,
    MAX_KEY_BYTES,
    Buffer,
    Capabilities,
    CheckReport,
    EvictionGranularity,
    Location,
    ObjectRecord,
    Problem,
    ProblemKind,
    ReadStatus,
    Usage,
    WriteBatchHint,
    WriteOutcome,
    WriteResult,
    encode_key,
)

__all__ = [
    "DEFAULT_MAX_VALUE_SIZE",
    "MAX_KEY_BYTES",
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
    "ObjectRecord",
    "Problem",
    "ProblemKind",
    "ReadStatus",
    "StorageBackend",
    "UnknownBackendError",
    "Usage",
    "ValueTooLargeError",
    "WriteBatchHint",
    "WriteOutcome",
    "WriteResult",
    "encode_key",
]
