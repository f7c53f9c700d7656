"""The node table: who is in the cluster, how full each node is, and its task queue."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class NodePhase(enum.Enum):
    """Where a node is in its life, as ``kvstore status`` shows it."""

    #: Registered its name, still sending the objects it holds: takes no puts yet.
    STARTING = "starting"
    READY = "ready"
    #: Shutting down: serves reads, takes no new puts.
    LEAVING = "leaving"
    #: Missed its heartbeats for master.node_ttl: its replicas were dropped.
    DEAD = "dead"


@dataclass(slots=True)
class NodeState:
    node_id: str
    #: The node's data server, as clients should dial it.
    address: tuple[str, int]
    #: Identifies the machine, so that a client on the same host can map the segment.
    host_id: str
    segment: str
    segment_token: str
    dram_capacity: int
    ssd_capacity: int
    backend: str = ""
    shared_ssd: bool = False
    #: The largest value its backend accepts (0: not told, so not checked).
    max_value_size: int = 0
    dram_used: int = 0
    ssd_used: int = 0
    ssd_objects: int = 0
    corrupt_reads: int = 0
    quarantined: int = 0
    last_heartbeat: float = 0.0
    registered: bool = False
    #: While it registers: the objects it said it holds, and how many it has sent.
    inventory: int = 0
    inventory_sent: int = 0
    alive: bool = True
    #: Shutting down: it serves reads, but takes no new puts.
    leaving: bool = False
    #: Why its offloads fail right now (a full SSD, say), as the node reported it.
    offload_problem: str | None = None
    #: Bytes promised to puts placed here since the last heartbeat.
    pending_bytes: int = 0
    tasks: list[dict[str, Any]] = field(default_factory=list)
    offload_queued: set[str] = field(default_factory=set)
    promote_queued: set[str] = field(default_factory=set)
    #: Keys whose DRAM copy goes as soon as their SSD copy lands (evict, not drop).
    evict_after_offload: set[str] = field(default_factory=set)
    #: The connection it registered over: only that one speaks for it, and while it is
    #: open (and the node alive) no other registration may take the name.
    session: object | None = None

    def dram_free(self) -> int:
        return self.dram_capacity - self.dram_used - self.pending_bytes

    def dram_fraction(self) -> float:
        return self.dram_used / self.dram_capacity if self.dram_capacity else 1.0

    def public(self) -> dict[str, Any]:
        """What a client needs to reach this node."""
        return {"addr": list(self.address), "host": self.host_id, "segment": self.segment,
                "token": self.segment_token}

    @property
    def phase(self) -> NodePhase:
        if not self.alive:
            return NodePhase.DEAD
        if not self.registered:
            return NodePhase.STARTING
        return NodePhase.LEAVING if self.leaving else NodePhase.READY

    def starting_detail(self) -> str:
        """How far a starting node's registration has got."""
        return (f"registering its objects with the master: {self.inventory_sent:,} of "
                f"{self.inventory:,}")

    def status(self) -> dict[str, Any]:
        phase = self.phase
        return {"node": self.node_id, "address": f"{self.address[0]}:{self.address[1]}",
                "alive": self.alive, "state": phase.value,
                "registering": {"sent": self.inventory_sent, "objects": self.inventory}
                if phase is NodePhase.STARTING else None,
                "backend": self.backend,
                "dram": {"used": self.dram_used, "capacity": self.dram_capacity},
                "ssd": {"used": self.ssd_used, "capacity": self.ssd_capacity,
                        "objects": self.ssd_objects},
                "corrupt_reads": self.corrupt_reads, "quarantined": self.quarantined,
                "queued_offloads": len(self.offload_queued), "leaving": self.leaving,
                "offload_problem": self.offload_problem}
