"""The node table: who is in the cluster, how full each node is, and its task queue."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvstored.protocol.enums import NodePhase
from kvstored.protocol.master_api import (
    DropTask,
    NodeStats,
    NodeStatus,
    OffloadTask,
    PromoteTask,
    RegisterRequest,
    Registration,
    Task,
    TierUse,
)

#: The most promotions one node keeps waiting: past it the least recently read go (and
#: are counted in ``kvstored_promotions_skipped_total{reason="queue_full"}``).
MAX_PROMOTE_QUEUE = 65536


@dataclass(slots=True)
class NodeState:
    node_id: str
    #: What it said of itself when it registered, as it said it: how clients reach it
    #: (``contact``: its data server, its host, its DRAM segment), its capacities, its
    #: backend and the largest value that takes (``max_value_size``, 0: not checked).
    announced: RegisterRequest
    #: What its last heartbeat said it uses and has seen (none yet: all zero).
    stats: NodeStats = field(default_factory=lambda: NodeStats(0, 0, 0, 0, 0))
    last_heartbeat: float = 0.0
    registered: bool = False
    #: While it registers: the objects it said it holds, and how many it has sent.
    inventory: int = 0
    inventory_sent: int = 0
    alive: bool = True
    #: Shutting down: it serves reads, but takes no new puts.
    leaving: bool = False
    #: Bytes promised to puts placed here since the last heartbeat.
    pending_bytes: int = 0
    tasks: list[Task] = field(default_factory=list)
    offload_queued: set[str] = field(default_factory=set)
    #: SSD-only objects read often enough to promote, in the order of their last such
    #: read (the most recent last); :func:`~kvstored.master.policy.plan_node` takes them.
    promote_queued: dict[str, None] = field(default_factory=dict)
    #: DRAM replicas already given up (marked removing, their drop queued or waiting
    #: for a lease to end) that the node still holds: ``(key, offset) -> size``. Their
    #: bytes are still in ``dram_used``, but eviction must not free them a second time.
    dram_freeing: dict[tuple[str, int], int] = field(default_factory=dict)
    #: Keys whose DRAM copy goes as soon as their SSD copy lands (evict, not drop).
    evict_after_offload: set[str] = field(default_factory=set)
    #: The connection it registered over: only that one speaks for it, and while it is
    #: open (and the node alive) no other registration may take the name.
    session: object | None = None

    @property
    def host_id(self) -> str:
        return self.announced.contact.host_id

    def queue_promotion(self, key: str) -> int:
        """Queue ``key`` for promotion as the most recently read; returns how many of
        the least recently read were let go to keep the queue within its bound."""
        self.promote_queued.pop(key, None)
        self.promote_queued[key] = None
        over = len(self.promote_queued) - MAX_PROMOTE_QUEUE
        for _ in range(over):
            del self.promote_queued[next(iter(self.promote_queued))]
        return max(over, 0)

    def dram_given_up(self) -> int:
        """Bytes of DRAM replicas on their way out (:attr:`dram_freeing`)."""
        return sum(self.dram_freeing.values())

    def dram_free(self) -> int:
        return self.announced.dram_capacity - self.stats.dram_used - self.pending_bytes

    def dram_fraction(self) -> float:
        capacity = self.announced.dram_capacity
        return self.stats.dram_used / capacity if capacity else 1.0

    def queue(self, task: Task) -> None:
        """Queue ``task`` for the next heartbeat reply, merged into a queued task of the
        same kind where one can take it (one drop task per tier, say)."""
        for queued in self.tasks:
            if _merge(queued, task):
                return
        self.tasks.append(task)

    @property
    def phase(self) -> NodePhase:
        if not self.alive:
            return NodePhase.DEAD
        if not self.registered:
            return NodePhase.STARTING
        return NodePhase.LEAVING if self.leaving else NodePhase.READY

    def registration(self) -> Registration:
        """How far its registration has got (complete once it is registered)."""
        return Registration(sent=self.inventory_sent, objects=self.inventory)

    def take_tasks(self) -> list[Task]:
        tasks, self.tasks = self.tasks, []
        return tasks

    def status(self) -> NodeStatus:
        phase, told, stats = self.phase, self.announced, self.stats
        return NodeStatus(
            node=self.node_id, address=str(told.contact.endpoint), alive=self.alive,
            state=phase,
            registering=self.registration() if phase is NodePhase.STARTING else None,
            backend=told.backend, dram=TierUse(stats.dram_used, told.dram_capacity),
            ssd=TierUse(stats.ssd_used, told.ssd_capacity, stats.ssd_objects),
            corrupt_reads=stats.corrupt_reads, quarantined=stats.quarantined,
            queued_offloads=len(self.offload_queued), leaving=self.leaving,
            offload_problem=stats.offload_problem or None)


def _merge(queued: Task, task: Task) -> bool:
    """Fold ``task`` into ``queued`` if they are of one kind (and tier); urgent offloads
    and recoveries stay tasks of their own."""
    match queued, task:
        case OffloadTask(), OffloadTask() if not queued.urgent and not task.urgent:
            queued.keys.extend(task.keys)
        case DropTask(), DropTask() if queued.tier is task.tier:
            queued.keys.extend(task.keys)
            queued.versions.extend(task.versions)
        case PromoteTask(), PromoteTask():
            queued.keys.extend(task.keys)
        case _:
            return False
    return True
