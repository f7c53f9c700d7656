"""Things the master waits on: replicas to free once leases expire, and admin calls
waiting for nodes to report back."""

from __future__ import annotations

from dataclasses import dataclass, field

import trio

from kvstored.protocol import Tier
from kvstored.protocol.master_api import RecoveryReport


@dataclass(slots=True)
class Deferred:
    """A replica to free once ``not_before`` has passed (its object's last lease)."""

    not_before: float
    node: str
    tier: Tier
    key: str
    #: Which version: the DRAM offset, or the SSD checksum (see the node's drop).
    version: int
    #: The object was removed (so no newer lease can hold this version any more).
    removed: bool


@dataclass
class Waiter:
    """A flush or recover call waiting for nodes to report back: ``pending`` holds
    ``(node, key)`` pairs (a recovery's key is ``""``)."""

    pending: set[tuple[str, str]]
    event: trio.Event = field(default_factory=trio.Event)
    #: Flush: key -> why its latest offload attempt failed; a later success removes it.
    failed: dict[str, str] = field(default_factory=dict)
    #: Recover: node -> its report.
    reports: dict[str, RecoveryReport] = field(default_factory=dict)
