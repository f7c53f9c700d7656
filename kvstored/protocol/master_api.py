"""The messages of the master's ops: what nodes register, commit and report, the tasks the
master hands them, and what clients ask about objects.

Per-key data travels as columns (one list per field, one entry per key). Which op
carries which message, and who may send it, is in :mod:`kvstored.protocol.ops`.
"""

from __future__ import annotations

from dataclasses import field
from typing import Annotated

from kvstored.protocol.enums import NodePhase, OffloadFailure, ReplicaState, TaskKind, Tier
from kvstored.protocol.messages import Message, message
from kvstored.protocol.shapes import (
    MAX_BATCH,
    Checksums,
    Int,
    Key,
    Keys,
    List,
    Name,
    Offsets,
    Opt,
    OptKeys,
    OptSize,
    Port,
    Seconds,
    Size,
    Sizes,
)

#: The longest wait a client may ask the master for (flush, recover).
MAX_WAIT_SECONDS = 24 * 3600.0

#: Which version of a key a drop means: the DRAM offset, or the SSD checksum.
Versions = Annotated[list[int], List(Int(0, 2**63 - 1))]
#: As :data:`Versions`; nil: whatever version the node holds.
AnyVersions = Annotated[list[int | None], List(Opt(Int(0, 2**63 - 1)))]
WaitSeconds = Annotated[float | None, Opt(Seconds(MAX_WAIT_SECONDS))]
Limit = Annotated[int | None, Opt(Int(1, 2**31))]
#: Who holds a lock: an identifier each client makes up (one per client instance).
Holder = Annotated[str, Name(128)]
OptHolder = Annotated[str | None, Opt(Name(128))]
#: A lock's length as asked; the master cuts it to master.max_lock_ttl.
LockSeconds = Annotated[float, Seconds(MAX_WAIT_SECONDS)]

#: Ends every namespace: a namespace is a key prefix that ends with it (see
#: :class:`NamespaceRequest`). The engine adapters join their key parts with it too.
NAMESPACE_SEPARATOR = "/"


@message
class Empty(Message):
    """A request with no arguments, or the reply of an op that has nothing to say but
    that it worked."""


@message
class KeysRequest(Message):
    """A request about some keys, and nothing else."""

    keys: Keys


@message
class NodeRequest(Message):
    """A request of a node about itself (it must speak over the connection it
    registered on)."""

    node: str


@message
class NodeKeysRequest(Message):
    """A node's report about some of its keys (``ssd_evicted``)."""

    node: str
    keys: Keys


# -- nodes ------------------------------------------------------------------------------

@message
class Endpoint(Message):
    """A TCP address to dial."""

    host: str
    port: Port

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


@message
class NodeContact(Message):
    """How a client reaches a node: its data server, and, from the same host, its DRAM
    segment (``host_id`` tells the host; ``segment_token`` the segment's instance)."""

    endpoint: Endpoint
    host_id: str
    segment: str
    segment_token: str


@message
class RegisterRequest(Message):
    node: str
    contact: NodeContact
    dram_capacity: Size
    ssd_capacity: Size
    backend: str = ""
    #: The SSD tier is readable from every node (3fs).
    shared: bool = False
    #: The largest value the backend takes (0: no limit told).
    max_value_size: Size = 0
    #: How many objects its register_objects will send (start-up progress in status).
    objects: Size = 0


@message
class RegisterReply(Message):
    heartbeat_interval: float
    #: The token the node's data server must check clients against (None: no auth).
    client_token: str | None = None
    #: policy.dram_only: nothing is offloaded.
    dram_only: bool = False
    #: How long after sending a heartbeat that the master answered the node may serve
    #: ``get_held`` (0: never). A node cut off from its master stops within this time,
    #: so a remove that could not reach it is safe once this much time has passed.
    direct_permit: float = 0.0


@message
class RegisterObjectsRequest(Message):
    """Part of a node's inventory, sent when it (re)connects."""

    SAME_LENGTH = ("keys", "sizes", "checksums", "tiers", "offsets")

    node: str
    keys: Keys
    sizes: Sizes
    checksums: Checksums
    tiers: list[Tier]
    offsets: Offsets


@message
class RegisterObjectsReply(Message):
    """Objects of the inventory that conflict with the cluster's copy (another version);
    the node drops its own."""

    SAME_LENGTH = ("keys", "tiers")

    keys: Keys = field(default_factory=list)
    tiers: list[Tier] = field(default_factory=list)


@message
class CommitRequest(Message):
    """DRAM objects a node received and checked: make them visible."""

    SAME_LENGTH = ("keys", "sizes", "checksums", "offsets")

    node: str
    keys: Keys
    sizes: Sizes
    checksums: Checksums
    offsets: Offsets


@message
class CommitReply(Message):
    #: Per key: committed, or refused (the key exists: objects are written once).
    results: list[bool]


@message
class UnregisterReply(Message):
    #: Objects that had no other copy and are gone with the node.
    dropped: int


# -- heartbeats: what a node reports, and the tasks it gets back -------------------------------

@message
class NodeStats(Message):
    dram_used: Size
    ssd_used: Size
    ssd_objects: Size
    corrupt_reads: Size
    quarantined: Size
    #: Why its offloads fail right now (a full SSD, say).
    offload_problem: str | None = None


@message
class Offloaded(Message):
    """SSD copies that are durable now, by the checksum of the version written."""

    SAME_LENGTH = ("keys", "checksums")

    keys: Keys = field(default_factory=list)
    checksums: Checksums = field(default_factory=list)


@message
class OffloadFailed(Message):
    """One object's failed offload attempt."""

    key: Key
    reason: OffloadFailure
    message: str

    @property
    def retrying(self) -> bool:
        return self.reason.retried


@message
class Dropped(Message):
    """Versions a node no longer holds (freed, found corrupt, lost in a recovery)."""

    SAME_LENGTH = ("keys", "tiers", "versions")

    keys: Keys = field(default_factory=list)
    tiers: list[Tier] = field(default_factory=list)
    versions: AnyVersions = field(default_factory=list)


@message
class Promoted(Message):
    """SSD objects copied into DRAM, at these offsets."""

    SAME_LENGTH = ("keys", "offsets", "checksums")

    keys: Keys = field(default_factory=list)
    offsets: Offsets = field(default_factory=list)
    checksums: Checksums = field(default_factory=list)


@message
class ProblemReport(Message):
    """One finding of a backend check (see :class:`kvstored.sdk.Problem`)."""

    kind: str
    detail: str
    key: str | None = None
    path: str | None = None
    #: What the check did about it, a :class:`kvstored.sdk.RepairAction` value (None:
    #: nothing; ``--repair`` would).
    action: str | None = None
    #: The specifics of ``action``: where the bytes went, what was rebuilt from what.
    action_detail: str | None = None


@message
class RecoveryReport(Message):
    """What a node's recovery task found; ``id`` is the task's."""

    id: int
    repaired: bool
    records_checked: Size
    problems: list[ProblemReport]


@message
class NodeReport(Message):
    """Task outcomes since the last heartbeat."""

    offloaded: Offloaded = field(default_factory=Offloaded)
    offload_failed: list[OffloadFailed] = field(default_factory=list)
    dropped: Dropped = field(default_factory=Dropped)
    ssd_evicted: Keys = field(default_factory=list)
    promoted: Promoted = field(default_factory=Promoted)
    #: Promotions the node found no DRAM room for (the master counts them).
    promote_failed: Keys = field(default_factory=list)
    recovered: list[RecoveryReport] = field(default_factory=list)


@message
class HeartbeatRequest(Message):
    node: str
    #: None when the node could not gather them this time.
    stats: NodeStats | None = None
    done: NodeReport = field(default_factory=NodeReport)
    #: Keys served to ``get_held`` since the last heartbeat: reads the master did not
    #: see, counted now for recency (eviction) and ``stat``'s reads.
    held_reads: Keys = field(default_factory=list)


@message
class OffloadTask(Message):
    """Write these DRAM objects to SSD (``urgent``: now, not when a batch is due)."""

    keys: Keys
    urgent: bool = False
    kind: TaskKind = TaskKind.OFFLOAD


@message
class DropTask(Message):
    """Free these versions of keys in ``tier`` (a late drop never frees a newer object
    written under the same key)."""

    SAME_LENGTH = ("keys", "versions")

    tier: Tier
    keys: Keys
    versions: Versions
    kind: TaskKind = TaskKind.DROP


@message
class PromoteTask(Message):
    """Copy these SSD objects into DRAM."""

    keys: Keys
    kind: TaskKind = TaskKind.PROMOTE


@message
class RecoverTask(Message):
    """Check (``repair``: and repair) the SSD tier; answer with a RecoveryReport."""

    id: int
    repair: bool = False
    kind: TaskKind = TaskKind.RECOVER


@message
class RevokeTask(Message):
    """Serve none of these keys to ``get_held`` any more (the master removed them and
    could not tell the node's data server directly); applied before the node renews its
    permit to serve ``get_held`` with this heartbeat."""

    keys: Keys
    kind: TaskKind = TaskKind.REVOKE


Task = OffloadTask | DropTask | PromoteTask | RecoverTask | RevokeTask


@message
class HeartbeatReply(Message):
    tasks: list[Task]


# -- clients: objects ------------------------------------------------------------------------

@message
class PutTargetRequest(Message):
    SAME_LENGTH = ("keys", "sizes")

    keys: Keys
    sizes: Sizes
    #: The client's host id: a node there is preferred.
    host: str | None = None


@message
class PutTargetReply(Message):
    #: Per key, the node to send it to; None: the key exists (or is being put).
    targets: list[str | None]
    nodes: dict[str, NodeContact]


@message
class LookupRequest(Message):
    keys: Keys
    #: Grant a read lease on what is found.
    lease: bool = True
    #: The client's lock holder: a leased lookup is the read that ends its locks on the
    #: keys it finds (the read lease covers the read from then on).
    holder: OptHolder = None


@message
class LockRequest(Message):
    """Look ``keys`` up and lock each one found against eviction for ``ttl`` seconds
    (cut to master.max_lock_ttl), in ``holder``'s name. ``leading``: stop at the first
    key not found (a prefix cache reads only the leading run of hits), and lock none
    after it. A lock ends at its expiry, at the holder's next leased lookup of the key
    (its read), or at its unlock, whichever comes first; locking again extends it."""

    keys: Keys
    holder: Holder
    ttl: LockSeconds
    leading: bool = False


@message
class LockReply(Message):
    #: Per key: found and locked now.
    locked: list[bool]
    #: How long the locks last (the ttl asked for, or master.max_lock_ttl if less).
    ttl: float


@message
class UnlockRequest(Message):
    keys: Keys
    holder: Holder


@message
class UnlockReply(Message):
    #: Per key: ``holder`` held a lock on it that had not expired.
    unlocked: list[bool]


@message
class Replicas(Message):
    """Readable replicas of the objects of a lookup, one entry each; ``of`` is the index
    of the key a replica belongs to. An object's DRAM copies come first."""

    SAME_LENGTH = ("of", "nodes", "tiers", "offsets")

    of: Annotated[list[int], List(Int(0, MAX_BATCH))] = field(default_factory=list)
    nodes: list[str] = field(default_factory=list)
    tiers: list[Tier] = field(default_factory=list)
    offsets: Offsets = field(default_factory=list)


@message
class LookupReply(Message):
    """Per key, the object's size and checksum (None: not found), and every readable
    replica of the objects found."""

    SAME_LENGTH = ("sizes", "checksums")

    sizes: list[int | None]
    checksums: list[int | None]
    replicas: Replicas
    lease_ttl: float
    nodes: dict[str, NodeContact]


@message
class ExistsReply(Message):
    exists: list[bool]


@message
class PrefixHitsReply(Message):
    #: How many leading keys exist.
    hits: int


@message
class StatRequest(Message):
    key: Key


@message
class ReplicaInfo(Message):
    node: str
    tier: Tier
    state: ReplicaState = ReplicaState.COMPLETE
    #: DRAM: the offset in the node's segment; SSD: -1.
    offset: int = -1


@message
class ObjectStat(Message):
    key: str
    size: int
    checksum: int
    reads: int
    age_seconds: float
    leased_seconds: float
    replicas: list[ReplicaInfo]
    #: How long the longest lookup-and-lock on it still holds it against eviction.
    locked_seconds: float = 0.0


@message
class StatReply(Message):
    object: ObjectStat


@message
class RemoveReply(Message):
    removed: list[bool]


@message
class RemovePrefixRequest(Message):
    """Remove every object whose key starts with ``prefix`` (never empty: that would be
    the whole store), and cancel the puts under it still in flight; ``dry_run``: only
    count them."""

    prefix: Key
    dry_run: bool = False


@message
class RemovePrefixReply(Message):
    """What went: objects and their logical bytes, and the puts in flight that were
    cancelled (they will not land: their put reports the object as not stored)."""

    removed: int
    bytes: int
    cancelled: int
    dry_run: bool = False


@message
class NamespaceRequest(Message):
    """Register a namespace: a key prefix that ends with NAMESPACE_SEPARATOR. A key
    belongs to the longest registered namespace it starts with; the master counts each
    namespace's objects and bytes per tier (``status``, metrics). Registrations live in
    the master's memory, as leases and locks do: a restarted master has none until its
    clients register again."""

    prefix: Key


@message
class NamespaceReply(Message):
    #: Objects the namespace holds now (0 for a new prefix).
    objects: int


@message
class ListRequest(Message):
    prefix: str | None = None
    #: Resume after this key.
    after: str | None = None
    limit: Limit = None
    #: Only objects with a complete replica on this node, and/or in this tier.
    node: str | None = None
    tier: Tier | None = None


@message
class ListReply(Message):
    """A page of keys in order, with each object's size and the tiers it is in.
    ``more``: resume from ``after`` (a filtered page may come back short, even empty)."""

    SAME_LENGTH = ("keys", "sizes", "tiers")

    keys: list[str]
    sizes: list[int]
    tiers: list[list[Tier]]
    more: bool
    after: str | None = None


# -- clients: administration ---------------------------------------------------------------

@message
class TierUse(Message):
    used: int
    capacity: int
    objects: int | None = None


@message
class Registration(Message):
    """How far a starting node has got sending the master the objects it holds."""

    sent: int
    objects: int

    def __str__(self) -> str:
        return f"registering its objects with the master: {self.sent:,} of {self.objects:,}"


@message
class NodeStatus(Message):
    node: str
    address: str
    alive: bool
    state: NodePhase
    backend: str
    dram: TierUse
    ssd: TierUse
    corrupt_reads: int
    quarantined: int
    queued_offloads: int
    leaving: bool
    offload_problem: str | None = None
    #: While it is starting: its registration's progress.
    registering: Registration | None = None


@message
class TierStatus(Message):
    objects: int
    logical_bytes: int
    used_bytes: int
    capacity_bytes: int


@message
class HitRate(Message):
    dram: float
    ssd: float
    total: float


@message
class TierCount(Message):
    """Complete replicas in one tier: how many, and their logical bytes."""

    objects: int
    bytes: int


@message
class NamespaceStatus(Message):
    """One namespace's share of the store: its objects, and per tier their replicas."""

    objects: int
    tiers: dict[str, TierCount]


@message
class StatusReply(Message):
    nodes: list[NodeStatus]
    tiers: dict[str, TierStatus]
    objects: int
    #: Lookups by result: ``miss``, ``hit_dram``, ``hit_ssd``.
    lookups: dict[str, int]
    hit_rate: HitRate
    #: Per registered namespace (its prefix), and ``""`` for the keys outside them all.
    namespaces: dict[str, NamespaceStatus] = field(default_factory=dict)


@message
class FlushRequest(Message):
    node: str | None = None
    #: Return once every copy is durable on SSD (or ``timeout`` passed).
    wait: bool = False
    timeout: WaitSeconds = None


@message
class FlushFailure(Message):
    key: str
    reason: str


@message
class FlushReply(Message):
    queued: int
    done: bool
    #: Objects whose latest offload attempt failed.
    failed: list[FlushFailure]
    #: Objects still not on SSD when the wait ended.
    remaining: int | None = None


@message
class EvictRequest(Message):
    tier: Tier
    #: Also drop last copies (their data is lost).
    drop: bool = False
    dry_run: bool = False
    keys: OptKeys = None
    prefix: str | None = None
    #: Least recently used first, this many bytes.
    bytes: OptSize = None


@message
class EvictReply(Message):
    evicted: list[str]
    #: DRAM-only objects that go to SSD first (and then leave DRAM).
    offloading: list[str]
    skipped_last_copy: list[str]
    bytes: int
    dry_run: bool


@message
class RecoverRequest(Message):
    node: str | None = None
    repair: bool = False
    timeout: WaitSeconds = None


@message
class RecoverReply(Message):
    reports: dict[str, RecoveryReport]
    #: Nodes that did not report back in time.
    missing: list[str]
