"""The object table: key -> size, checksum and replicas, plus leases and pending puts.

Pure bookkeeping with no I/O, so that it can be tested exhaustively and its invariants
checked after every mutation (:meth:`ObjectTable.check`). Times are ``time.monotonic()``
seconds passed in by the caller.

An object becomes visible when its first replica is committed. A replica is
``complete`` (readable) or ``removing`` (no new leases; the node frees it once every
lease on the object has expired). An object with no replica left is gone.

Besides read leases (which only delay the free of a replica already given up), an
object may carry *locks*: a client's lookup-and-lock holds it against eviction for a
bounded time, in the name of a holder, until that holder's next leased lookup of it (the
read the lock was for), its unlock, or its expiry. Eviction never picks a locked object.

Every reservation and every new object takes the next number of one sequence
(``seq``): a removal of a prefix takes one too, and removes only what is numbered
before it, so that puts that started after it survive it and puts in flight when it ran
are cancelled (:meth:`ObjectTable.cancel_pending`), never resurrected by a late commit.

Keys are counted by *namespace* (a registered key prefix ending in
:data:`~kvstored.protocol.master_api.NAMESPACE_SEPARATOR`; a key belongs to the longest
one it starts with, or to ``""``): objects, and per tier complete replicas and their
logical bytes, kept up to date on every change as the tier totals are.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field

from sortedcontainers import SortedList

from kvstored.protocol import ReplicaState, Tier
from kvstored.protocol.master_api import NAMESPACE_SEPARATOR

DRAM, SSD = Tier.DRAM, Tier.SSD
COMPLETE, REMOVING = ReplicaState.COMPLETE, ReplicaState.REMOVING


@dataclass(slots=True)
class Replica:
    node: str
    tier: Tier
    #: DRAM: the offset in the node's segment (for same-host readers); SSD: -1.
    offset: int = -1
    state: ReplicaState = COMPLETE


@dataclass(slots=True)
class ObjectMeta:
    key: str
    size: int
    checksum: int
    created: float
    replicas: list[Replica] = field(default_factory=list)
    lease_until: float = 0.0
    reads: int = 0
    last_access: float = 0.0
    # SSD-only reads inside the current promotion window.
    window_start: float = 0.0
    window_reads: int = 0
    #: Locks against eviction: holder -> until when (None: none; most objects).
    locks: dict[str, float] | None = None
    #: Its place in the table's sequence (see the module docstring).
    seq: int = 0
    #: The registered namespace it belongs to ("": none).
    namespace: str = ""

    def replica(self, node: str, tier: Tier) -> Replica | None:
        for r in self.replicas:
            if r.node == node and r.tier == tier:
                return r
        return None

    def readable(self) -> list[Replica]:
        return [r for r in self.replicas if r.state == COMPLETE]

    def has_other_copy(self, node: str, tier: Tier) -> bool:
        return any(r.state == COMPLETE and (r.node, r.tier) != (node, tier)
                   for r in self.replicas)

    def leased(self, now: float) -> bool:
        return self.lease_until > now

    def locked(self, now: float) -> bool:
        """Some holder's lock on it has not expired (expired ones are forgotten here)."""
        locks = self.locks
        if not locks:
            return False
        for holder in [h for h, until in locks.items() if until <= now]:
            del locks[holder]
        if not locks:
            self.locks = None
            return False
        return True

    def release(self, holder: str, now: float) -> bool:
        """End ``holder``'s lock; True if it held one that had not expired."""
        locks = self.locks
        if not locks or holder not in locks:
            return False
        live = locks.pop(holder) > now
        if not locks:
            self.locks = None
        return live


@dataclass(frozen=True, slots=True)
class TierUsage:
    """Complete replicas in one tier: how many, and their logical bytes."""

    objects: int
    bytes: int


@dataclass(slots=True)
class NamespaceUsage:
    """One namespace's objects, and per tier its complete replicas and their bytes."""

    objects: int = 0
    tier_objects: dict[Tier, int] = field(default_factory=lambda: dict.fromkeys(Tier, 0))
    tier_bytes: dict[Tier, int] = field(default_factory=lambda: dict.fromkeys(Tier, 0))

    def usage(self) -> dict[Tier, TierUsage]:
        return {t: TierUsage(self.tier_objects[t], self.tier_bytes[t]) for t in Tier}


@dataclass(slots=True)
class Pending:
    node: str
    size: int
    deadline: float
    seq: int = 0
    #: A removal of its prefix ran while it was in flight: its commit is refused.
    cancelled: bool = False


class ObjectTable:
    """All objects of the cluster, with the indexes the policies and listings need.

    Besides ``objects`` it keeps, updated on every replica change so that no periodic
    pass has to scan the table: per-node DRAM recency (``dram_lru``), the keys each node
    holds per tier (``tier_keys``, so that what one node holds in one tier costs what it
    returns: a flush walks a node's few DRAM objects, not its million SSD ones), per-tier
    totals of complete replicas (``usage``), and the keys in sorted order (for listings
    that stream page by page while puts go on).
    """

    def __init__(self) -> None:
        self.objects: dict[str, ObjectMeta] = {}
        self.pending: dict[str, Pending] = {}
        # node -> keys with a complete DRAM replica there, least recently used first.
        self.dram_lru: dict[str, OrderedDict[str, None]] = {}
        # node -> tier -> keys with a replica (complete or removing) in that tier there.
        self.tier_keys: dict[str, dict[Tier, set[str]]] = {}
        self.sorted_keys: SortedList = SortedList()
        self._tier_objects = dict.fromkeys(Tier, 0)
        self._tier_bytes = dict.fromkeys(Tier, 0)
        #: Registered namespaces by prefix, and "" for the keys outside all of them.
        self.namespaces: dict[str, NamespaceUsage] = {"": NamespaceUsage()}
        self._namespace_lengths: list[int] = []
        self._seq = 0

    def next_seq(self) -> int:
        self._seq += 1
        return self._seq

    # -- bookkeeping of every replica change ---------------------------------------------

    def _counted(self, meta: ObjectMeta, replica: Replica, sign: int) -> None:
        """Enter (+1) or leave (-1) the indexes that track complete replicas."""
        self._tier_objects[replica.tier] += sign
        self._tier_bytes[replica.tier] += sign * meta.size
        ns = self.namespaces[meta.namespace]
        ns.tier_objects[replica.tier] += sign
        ns.tier_bytes[replica.tier] += sign * meta.size
        if replica.tier == DRAM:
            lru = self.dram_lru.setdefault(replica.node, OrderedDict())
            if sign > 0:
                lru[meta.key] = None
            else:
                lru.pop(meta.key, None)

    def _attach(self, meta: ObjectMeta, replica: Replica) -> None:
        meta.replicas.append(replica)
        tiers = self.tier_keys.get(replica.node)
        if tiers is None:
            tiers = self.tier_keys[replica.node] = {t: set() for t in Tier}
        tiers[replica.tier].add(meta.key)
        if replica.state == COMPLETE:
            self._counted(meta, replica, +1)

    def _detach(self, meta: ObjectMeta, replica: Replica) -> None:
        meta.replicas.remove(replica)
        if replica.state == COMPLETE:
            self._counted(meta, replica, -1)
        # A replica is unique per (node, tier) (check() asserts it).
        tiers = self.tier_keys.get(replica.node)
        if tiers is not None:
            tiers[replica.tier].discard(meta.key)

    def _forget(self, meta: ObjectMeta) -> None:
        for replica in list(meta.replicas):
            self._detach(meta, replica)
        del self.objects[meta.key]
        self.sorted_keys.remove(meta.key)
        self.namespaces[meta.namespace].objects -= 1

    def _create(self, key: str, size: int, checksum: int, now: float, seq: int) -> ObjectMeta:
        meta = ObjectMeta(key, size, checksum, created=now, last_access=now, seq=seq,
                          namespace=self.namespace_of(key))
        self.objects[key] = meta
        self.sorted_keys.add(key)
        self.namespaces[meta.namespace].objects += 1
        return meta

    # -- puts ------------------------------------------------------------------------

    def reserve(self, key: str, node: str, size: int, now: float, timeout: float) -> bool:
        """Hold ``key`` for a put on ``node``; False if it exists or is being put."""
        if key in self.objects:
            return False
        held = self.pending.get(key)
        if held is not None and held.deadline > now:
            return False
        self.pending[key] = Pending(node, size, now + timeout, self.next_seq())
        return True

    def expire_pending(self, now: float) -> list[str]:
        """Forget reservations whose put was abandoned; returns their keys."""
        stale = [k for k, p in self.pending.items() if p.deadline <= now]
        for key in stale:
            del self.pending[key]
        return stale

    def commit(self, key: str, node: str, tier: Tier, size: int, checksum: int, offset: int,
               now: float) -> bool:
        """Make a replica visible. False (and nothing changes) if another put of the key
        already committed (objects are written once), or if a removal of its prefix
        cancelled this put while it was in flight."""
        pending = self.pending.pop(key, None)
        if pending is not None and pending.cancelled:
            return False
        meta = self.objects.get(key)
        if meta is not None:
            if meta.size != size or meta.checksum != checksum:
                return False
            if meta.replica(node, tier) is None:
                self._attach(meta, Replica(node, tier, offset))
                return True
            return False
        meta = self._create(key, size, checksum, now,
                            pending.seq if pending is not None else self.next_seq())
        self._attach(meta, Replica(node, tier, offset))
        return True

    def add_replica(self, key: str, node: str, tier: Tier, offset: int = -1) -> bool:
        """Record a copy made by offload or promotion; False if the object is gone."""
        meta = self.objects.get(key)
        if meta is None:
            return False
        existing = meta.replica(node, tier)
        if existing is None:
            self._attach(meta, Replica(node, tier, offset))
            return True
        if existing.state != COMPLETE:
            existing.state = COMPLETE
            self._counted(meta, existing, +1)
        existing.offset = offset
        return True

    # -- reads -------------------------------------------------------------------------

    def lookup(self, key: str, now: float, lease_ttl: float,
               holder: str | None = None) -> ObjectMeta | None:
        """The object if it has a readable replica; grants a lease and counts the read,
        which ends ``holder``'s lock on it (the lease covers the read from here)."""
        meta = self.objects.get(key)
        if meta is None or not meta.readable():
            return None
        meta.lease_until = max(meta.lease_until, now + lease_ttl)
        meta.reads += 1
        if holder is not None and meta.locks:
            meta.release(holder, now)
        self._touch(meta, now)
        return meta

    def read_elsewhere(self, key: str, now: float) -> ObjectMeta | None:
        """A node served ``key`` without a lookup here (get_held): count the read and its
        recency, as a lookup would (no lease: the node pinned the copy it sent); the
        object, if it still exists."""
        meta = self.objects.get(key)
        if meta is not None:
            meta.reads += 1
            self._touch(meta, now)
        return meta

    def _touch(self, meta: ObjectMeta, now: float) -> None:
        """``meta`` was just used: the most recently used of its DRAM copies' nodes."""
        meta.last_access = now
        for r in meta.replicas:
            if r.tier == DRAM and r.state == COMPLETE:
                self.dram_lru[r.node].move_to_end(meta.key)

    def lock(self, key: str, holder: str, now: float, ttl: float) -> ObjectMeta | None:
        """Lock the object against eviction for ``ttl`` seconds in ``holder``'s name (a
        lock of the same holder is extended, never shortened); None if it is not
        readable. Counts as a use for recency: its read is coming."""
        meta = self.objects.get(key)
        if meta is None or not meta.readable():
            return None
        if meta.locks is None:
            meta.locks = {}
        meta.locks[holder] = max(meta.locks.get(holder, 0.0), now + ttl)
        self._touch(meta, now)
        return meta

    def unlock(self, key: str, holder: str, now: float) -> bool:
        meta = self.objects.get(key)
        return meta is not None and meta.release(holder, now)

    def exists(self, key: str) -> bool:
        meta = self.objects.get(key)
        return meta is not None and any(r.state == COMPLETE for r in meta.replicas)

    # -- removal -----------------------------------------------------------------------

    def mark_removing(self, key: str, node: str, tier: Tier) -> Replica | None:
        """Stop new leases on one replica; the caller frees it once unleased."""
        meta = self.objects.get(key)
        replica = meta.replica(node, tier) if meta is not None else None
        if meta is None or replica is None:
            return None
        if replica.state == COMPLETE:
            replica.state = REMOVING
            self._counted(meta, replica, -1)
        return replica

    def drop_replica(self, key: str, node: str, tier: Tier, ident: int | None = None) -> bool:
        """Forget one replica (freed by its node); the object goes with its last one.

        ``ident`` names the version the node freed (the DRAM offset, or the SSD
        checksum); a replica of another version (the key was removed and written again
        meanwhile) is kept. Returns True if the object is now gone."""
        meta = self.objects.get(key)
        replica = meta.replica(node, tier) if meta is not None else None
        if meta is None or replica is None:
            return False
        if ident is not None and ident != (replica.offset if tier == DRAM else meta.checksum):
            return False
        self._detach(meta, replica)
        if not meta.replicas:
            self._forget(meta)
            return True
        return False

    def remove(self, key: str) -> ObjectMeta | None:
        """Make ``key`` invisible now; returns it (with its replicas, which the caller
        frees) or None."""
        meta = self.objects.get(key)
        if meta is None:
            return None
        replicas = list(meta.replicas)
        self._forget(meta)
        meta.replicas = replicas
        return meta

    def cancel_pending(self, prefix: str) -> int:
        """Cancel the puts in flight under ``prefix``: their commits will be refused, and
        the keys stay reserved (a new put of one is refused as "being put") until then,
        or until the reservation expires. Returns how many were cancelled."""
        cancelled = 0
        for key, pending in self.pending.items():
            if key.startswith(prefix) and not pending.cancelled:
                pending.cancelled = True
                cancelled += 1
        return cancelled

    def drop_node(self, node: str) -> list[str]:
        """Forget every replica on ``node``; returns the keys that vanished with it.

        The master's loop runs nothing else meanwhile, and a node may hold millions of
        objects, most of them only there: those leave in bulk (their counts subtracted
        once per tier and namespace, the sorted keys rebuilt once when many go), at
        about a tenth of the cost of forgetting them one replica at a time."""
        gone = []
        objects, namespaces = self.objects, self.namespaces
        # (namespace, tier) -> [complete replicas, their bytes] leaving with sole copies.
        leaving: dict[tuple[str, Tier], list[int]] = {}
        for key in self.keys_on(node):
            meta = objects[key]
            if all(r.node == node for r in meta.replicas):
                for r in meta.replicas:
                    if r.state == COMPLETE:
                        tally = leaving.setdefault((meta.namespace, r.tier), [0, 0])
                        tally[0] += 1
                        tally[1] += meta.size
                del objects[key]
                namespaces[meta.namespace].objects -= 1
                gone.append(key)
                continue
            for replica in [r for r in meta.replicas if r.node == node]:
                self._detach(meta, replica)
        for (namespace, tier), (count, size) in leaving.items():
            self._tier_objects[tier] -= count
            self._tier_bytes[tier] -= size
            namespaces[namespace].tier_objects[tier] -= count
            namespaces[namespace].tier_bytes[tier] -= size
        self._unsort(gone)
        # Its DRAM LRU and per-tier keys go whole: no other node's entries are in them.
        self.tier_keys.pop(node, None)
        self.dram_lru.pop(node, None)
        for key in [k for k, p in self.pending.items() if p.node == node]:
            del self.pending[key]
        return gone

    def _unsort(self, gone: list[str]) -> None:
        """Take ``gone`` (keys no longer in ``objects``) out of the sorted keys: one by
        one when they are few, else by one rebuild (a removal costs a bisection and a
        shift, a rebuild a pass over keys already in order)."""
        if len(gone) * 16 < len(self.sorted_keys):
            for key in gone:
                self.sorted_keys.remove(key)
            return
        objects = self.objects
        self.sorted_keys = SortedList(k for k in self.sorted_keys if k in objects)

    # -- queries -----------------------------------------------------------------------

    def keys_with_prefix(self, prefix: str, after: str | None, limit: int) -> list[str]:
        """Up to ``limit`` keys starting with ``prefix``, in order, after ``after``."""
        out = []
        start = after if after is not None and after >= prefix else prefix
        for key in self.sorted_keys.irange(minimum=start, inclusive=(after is None, True)):
            if not key.startswith(prefix):
                break
            out.append(key)
            if len(out) >= limit:
                break
        return out

    def keys_on(self, node: str, tier: Tier | None = None) -> list[str]:
        """The keys with a replica (complete or removing) on ``node``, in ``tier`` or in
        any; a copy, so the caller may change the table while it walks them. Costs what
        it returns."""
        tiers = self.tier_keys.get(node)
        if tiers is None:
            return []
        if tier is not None:
            return list(tiers[tier])
        return list(set().union(*tiers.values()))

    def dram_keys_oldest_first(self, node: str) -> list[str]:
        """The keys with a DRAM replica on ``node``, least recently used first (those
        whose replica is being removed last). Offloading in this order writes objects
        put together next to each other on SSD, where a batched get of them later reads
        adjacent records, which the kernel merges (fio, 64 KiB at depth 32: 843 MB/s at
        random offsets, 1097 MB/s adjacent); a set's order scattered a batch of 32 over
        17 bucket files."""
        lru = self.dram_lru.get(node) or {}
        tiers = self.tier_keys.get(node)
        removing = [] if tiers is None else [k for k in tiers[DRAM] if k not in lru]
        return [*lru, *removing]

    def count_on(self, node: str) -> int:
        """How many objects have a replica on ``node``."""
        tiers = self.tier_keys.get(node)
        if tiers is None:
            return 0
        dram, ssd = tiers[DRAM], tiers[SSD]
        small, large = (dram, ssd) if len(dram) <= len(ssd) else (ssd, dram)
        return len(large) + sum(1 for key in small if key not in large)

    def on_node(self, node: str, tier: Tier | None = None) -> Iterator[ObjectMeta]:
        for key in self.keys_on(node, tier):
            yield self.objects[key]

    # -- namespaces --------------------------------------------------------------------

    def namespace_of(self, key: str) -> str:
        """The longest registered namespace ``key`` starts with, or "". One look per
        distinct namespace length, longest first (an engine's namespaces differ in their
        rank, not their length, so this is one or two looks per commit)."""
        namespaces = self.namespaces
        for length in self._namespace_lengths:
            if key[length - 1:length] == NAMESPACE_SEPARATOR and key[:length] in namespaces:
                return key[:length]
        return ""

    def add_namespace(self, prefix: str) -> int:
        """Register ``prefix`` (ending in the separator) as a namespace, and count the
        objects under it that no longer registered namespace holds; how many it has."""
        assert prefix.endswith(NAMESPACE_SEPARATOR)
        usage = self.namespaces.get(prefix)
        if usage is not None:
            return usage.objects
        usage = self.namespaces[prefix] = NamespaceUsage()
        self._namespace_lengths = sorted({len(ns) for ns in self.namespaces if ns},
                                         reverse=True)
        for key in self.sorted_keys.irange(minimum=prefix):
            if not key.startswith(prefix):
                break
            meta = self.objects[key]
            # A key already in a longer (nested) namespace stays there.
            if len(meta.namespace) < len(prefix):
                self._move(meta, prefix)
        return usage.objects

    def _move(self, meta: ObjectMeta, namespace: str) -> None:
        old, new = self.namespaces[meta.namespace], self.namespaces[namespace]
        old.objects -= 1
        new.objects += 1
        for r in meta.replicas:
            if r.state == COMPLETE:
                old.tier_objects[r.tier] -= 1
                old.tier_bytes[r.tier] -= meta.size
                new.tier_objects[r.tier] += 1
                new.tier_bytes[r.tier] += meta.size
        meta.namespace = namespace

    def usage(self) -> dict[Tier, TierUsage]:
        """Per tier: objects and logical bytes of complete replicas (kept up to date, not
        computed: the master reports them ten times a second)."""
        return {tier: TierUsage(self._tier_objects[tier], self._tier_bytes[tier])
                for tier in Tier}

    def check(self) -> None:
        """Assert the table's invariants (tests call this after every mutation)."""
        for key, meta in self.objects.items():
            assert meta.key == key
            assert meta.replicas, f"{key!r} has no replica"
            seen = {(r.node, r.tier) for r in meta.replicas}
            assert len(seen) == len(meta.replicas), f"{key!r} has duplicate replicas"
            for r in meta.replicas:
                assert type(r.tier) is Tier and type(r.state) is ReplicaState
                in_lru = key in self.dram_lru.get(r.node, {})
                if r.tier == DRAM:
                    assert in_lru == (r.state == COMPLETE), f"{key!r} LRU mismatch on {r.node}"
        for node, lru in self.dram_lru.items():
            for key in lru:
                meta = self.objects.get(key)
                assert meta is not None and meta.replica(node, DRAM) is not None, \
                    f"LRU of {node} lists {key!r} without a DRAM replica"
        for key in self.pending:
            assert key not in self.objects, f"{key!r} is both pending and committed"
        holders: dict[tuple[str, Tier], set[str]] = {}
        objects, sizes = dict.fromkeys(Tier, 0), dict.fromkeys(Tier, 0)
        for key, meta in self.objects.items():
            for r in meta.replicas:
                holders.setdefault((r.node, r.tier), set()).add(key)
                if r.state == COMPLETE:
                    objects[r.tier] += 1
                    sizes[r.tier] += meta.size
        indexed = {(n, t): keys for n, tiers in self.tier_keys.items()
                   for t, keys in tiers.items() if keys}
        assert indexed == holders, "tier_keys drifted"
        spaces = {ns: NamespaceUsage() for ns in self.namespaces}
        for key, meta in self.objects.items():
            assert meta.namespace == self.namespace_of(key), f"{key!r} in the wrong namespace"
            ns = spaces[meta.namespace]
            ns.objects += 1
            for r in meta.replicas:
                if r.state == COMPLETE:
                    ns.tier_objects[r.tier] += 1
                    ns.tier_bytes[r.tier] += meta.size
        assert spaces == self.namespaces, "namespace usage drifted"
        assert self.usage() == {t: TierUsage(objects[t], sizes[t]) for t in Tier}
        assert list(self.sorted_keys) == sorted(self.objects), "sorted_keys drifted"
