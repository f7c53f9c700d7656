"""Things the master waits on: replicas to free once leases expire, and admin calls
waiting for nodes to report back."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import trio


@dataclass(slots=True)
class Deferred:
    """A replica to free once ``not_before`` has passed (its object's last lease)."""

    not_before: float
    node: str
    tier: str
    key: str
    #: Which version: the DRAM offset, or the SSD checksum (see the node's _drop).
    ident: int
    #: The object was removed (so no newer lease can hold this version any more).
    removed: bool


@dataclass
class Waiter:
    """A flush or recover call waiting for nodes to report back."""

    pending: set[tuple[str, str]]
    event: trio.Event = field(default_factory=trio.Event)
    #: Flush: key -> why its latest offload attempt failed; a later success removes it.
    failed: dict[str, str] = field(default_factory=dict)
    reports: dict[str, Any] = field(default_factory=dict)
