"""The protocol's enumerations: who a peer is, which op it calls, and the words of the
cluster's bookkeeping (tiers, replica states, node phases, per-item outcomes, task
kinds).

Each is a ``StrEnum`` whose values are what travels on the wire (msgpack packs them as
strings); :mod:`kvstored.protocol.messages` decodes them back into members.
"""

from __future__ import annotations

import enum


class Role(enum.StrEnum):
    """Who a connection speaks for, established by its hello.

    A client reads and writes objects and runs the admin ops (status, flush, evict,
    recover). A node also registers, commits and reports; it holds the node token.
    A node may call client ops too.
    """

    CLIENT = "client"
    NODE = "node"

    def may_call(self, required: Role) -> bool:
        return self is Role.NODE or required is Role.CLIENT


class Op(enum.StrEnum):
    """Every op of the master and of a node's data server (:mod:`kvstored.protocol.ops`
    says who may call each and what it carries)."""

    HELLO = "hello"
    # The master, for nodes.
    REGISTER = "register"
    REGISTER_OBJECTS = "register_objects"
    REGISTER_DONE = "register_done"
    COMMIT = "commit"
    HEARTBEAT = "heartbeat"
    SSD_EVICTED = "ssd_evicted"
    LEAVING = "leaving"
    UNREGISTER = "unregister"
    # The master, for clients.
    PUT_TARGET = "put_target"
    PUT_ABORT = "put_abort"
    LOOKUP = "lookup"
    EXISTS = "exists"
    PREFIX_HITS = "prefix_hits"
    STAT = "stat"
    REMOVE = "remove"
    LIST = "list"
    LOCK = "lock"
    UNLOCK = "unlock"
    REMOVE_PREFIX = "remove_prefix"
    ADD_NAMESPACE = "add_namespace"
    STATUS = "status"
    FLUSH = "flush"
    EVICT = "evict"
    RECOVER = "recover"
    # A node's data server.
    PUT = "put"
    ALLOC = "alloc"
    SEAL = "seal"
    ABORT = "abort"
    GET = "get"
    GET_HELD = "get_held"
    LOCATE = "locate"
    REPORT_CORRUPT = "report_corrupt"
    REGISTER_MEMORY = "register_memory"
    COPY_IN = "copy_in"
    COPY_OUT = "copy_out"
    REVOKE = "revoke"


class Tier(enum.StrEnum):
    DRAM = "dram"
    SSD = "ssd"


class ReplicaState(enum.StrEnum):
    #: Readable.
    COMPLETE = "complete"
    #: No new leases; its node frees it once every lease on the object has expired.
    REMOVING = "removing"


class NodePhase(enum.StrEnum):
    """Where a node is in its life, as ``kvstore status`` shows it."""

    #: Registered its name, still sending the objects it holds: takes no puts yet.
    STARTING = "starting"
    READY = "ready"
    #: Shutting down: serves reads, takes no new puts.
    LEAVING = "leaving"
    #: Missed its heartbeats for master.node_ttl: its replicas were dropped.
    DEAD = "dead"


class PutStatus(enum.StrEnum):
    """What a node did with one object of a put (or a seal)."""

    #: Stored and committed: visible now.
    OK = "ok"
    #: The key exists (committed, or another put of it is in flight): nothing written.
    EXISTS = "exists"
    #: No DRAM room on the node right now; the client may try again.
    NO_SPACE = "no_space"
    #: The bytes the node received fail the object's CRC-32C: nothing stored.
    CORRUPT = "corrupt"
    #: A seal of a key that nothing was allocated for (or whose allocation expired).
    MISSING = "missing"


class TaskKind(enum.StrEnum):
    """Work the master hands a node in a heartbeat reply."""

    OFFLOAD = "offload"
    DROP = "drop"
    PROMOTE = "promote"
    RECOVER = "recover"
    REVOKE = "revoke"


class OffloadFailure(enum.StrEnum):
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
