"""Typed messages of the master/node protocol that several modules share.

Today this holds what a node reports about an offload that did not land
(:class:`OffloadFailure`, :class:`OffloadFailed`). It is where the rest of the protocol's
op names, task kinds and statuses move as they get types (issue 10); it imports nothing
of the daemon, so every layer may use it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any


class OffloadFailure(enum.Enum):
    """Why an object did not reach the node's SSD tier."""

    #: The SSD (its capacity, or the file system under it) is full. Retried with backoff.
    NO_SPACE = "no_space"
    #: Larger than the backend's ``max_value_size``: it can never be offloaded.
    TOO_LARGE = "too_large"
    #: The backend or the operating system refused. Retried with backoff.
    IO_ERROR = "io_error"
    #: The object left DRAM (removed or evicted) before it was written.
    GONE = "gone"
    #: Its DRAM copy failed its checksum (a same-host writer changed it after its seal);
    #: the copy was dropped, never written.
    CORRUPT = "corrupt"

    @property
    def retried(self) -> bool:
        """The node tries again by itself (the condition may clear)."""
        return self in (OffloadFailure.NO_SPACE, OffloadFailure.IO_ERROR)


@dataclass(frozen=True, slots=True)
class OffloadFailed:
    """One object's failed offload attempt, as the node reports it in a heartbeat."""

    key: str
    reason: OffloadFailure
    message: str

    @property
    def retrying(self) -> bool:
        return self.reason.retried

    def to_wire(self) -> list[Any]:
        return [self.key, self.reason.value, self.message]

    @classmethod
    def from_wire(cls, item: list[Any]) -> OffloadFailed:
        key, reason, message = item
        return cls(str(key), OffloadFailure(reason), str(message))
