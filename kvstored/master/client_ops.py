"""The master's data-path ops for clients: placement of puts, lookups with leases,
lookup-and-lock, existence, removal (of keys or of a prefix), namespaces and listing."""

from __future__ import annotations

import time

import trio

from kvstored.errors import BadRequestError, NoSpaceError, NotFoundError, UnreachableError
from kvstored.master.cluster import Cluster
from kvstored.master.nodes import NodeState
from kvstored.master.policy import count_ssd_read
from kvstored.master.revoke import Revoker
from kvstored.master.table import DRAM, SSD
from kvstored.protocol import NodePhase, Tier, ops
from kvstored.protocol.master_api import (
    NAMESPACE_SEPARATOR,
    Empty,
    ExistsReply,
    KeysRequest,
    ListReply,
    ListRequest,
    LockReply,
    LockRequest,
    LookupReply,
    LookupRequest,
    NamespaceReply,
    NamespaceRequest,
    NodeContact,
    ObjectStat,
    PrefixHitsReply,
    PutTargetReply,
    PutTargetRequest,
    RemovePrefixReply,
    RemovePrefixRequest,
    RemoveReply,
    ReplicaInfo,
    Replicas,
    StatReply,
    StatRequest,
    UnlockReply,
    UnlockRequest,
)
from kvstored.rpc import Binding, FramedSocket
from kvstored.sdk.units import format_size

#: The most keys one list page holds, and how many pages' worth a filtered page examines.
LIST_LIMIT = 10000
LIST_SCAN_PAGES = 20
#: Keys a removal of a prefix removes between two looks at other requests: a prefix of
#: millions of keys must not stall every client's lookups for seconds.
REMOVE_PREFIX_CHUNK = 4096
#: Registered namespaces at most (each is a label value of the master's metrics).
MAX_NAMESPACES = 1024


#: The lookups counter's result for a hit, by the tier of the first readable copy.
_HIT = {tier: f"hit_{tier.value}" for tier in Tier}


async def between_chunks() -> None:
    """Where a removal of a prefix lets other requests run (a checkpoint)."""
    await trio.sleep(0)


class ClientOps:
    """The handlers clients call on every put and get (:meth:`bindings`)."""

    def __init__(self, cluster: Cluster, revoker: Revoker) -> None:
        self.cluster = cluster
        self.revoker = revoker

    def bindings(self) -> list[Binding]:
        return [Binding(ops.PUT_TARGET, self.put_target),
                Binding(ops.PUT_ABORT, self.put_abort),
                Binding(ops.LOOKUP, self.lookup),
                Binding(ops.EXISTS, self.exists),
                Binding(ops.PREFIX_HITS, self.prefix_hits),
                Binding(ops.STAT, self.stat),
                Binding(ops.REMOVE, self.remove),
                Binding(ops.LIST, self.list),
                Binding(ops.LOCK, self.lock),
                Binding(ops.UNLOCK, self.unlock),
                Binding(ops.REMOVE_PREFIX, self.remove_prefix),
                Binding(ops.ADD_NAMESPACE, self.add_namespace)]

    def _contacts(self, names: set[str]) -> dict[str, NodeContact]:
        return {n: self.cluster.nodes[n].announced.contact for n in names}

    # -- puts ------------------------------------------------------------------------------

    async def put_target(self, conn: FramedSocket, request: PutTargetRequest
                         ) -> PutTargetReply:
        await self.revoker.settle()
        cluster = self.cluster
        live = cluster.live_nodes()
        nodes = [n for n in live if not n.leaving]
        if not nodes:
            starting = [n for n in cluster.nodes.values() if n.phase is NodePhase.STARTING]
            if live:
                why = "every storage node is shutting down; retry once one is back"
            elif starting:
                why = (f"node {starting[0].node_id} is starting ({starting[0].registration()}"
                       "); retry once `kvstore status` shows it ready")
            else:
                why = ("no storage node is registered; start one with `kvstored node` (or "
                       "use `kvstored up`)")
            raise UnreachableError(why)
        # Every object is checked before any is reserved: a batch is refused whole.
        candidates = [self._nodes_for(nodes, key, size)
                      for key, size in zip(request.keys, request.sizes)]
        now = time.monotonic()
        targets: list[str | None] = []
        for key, size, fits in zip(request.keys, request.sizes, candidates):
            node = self._place(fits, size, request.host)
            if cluster.table.reserve(key, node.node_id, size, now, cluster.settings.put_timeout):
                node.pending_bytes += size
                targets.append(node.node_id)
            else:
                targets.append(None)
        return PutTargetReply(targets, self._contacts({t for t in targets if t is not None}))

    def _nodes_for(self, nodes: list[NodeState], key: str, size: int) -> list[NodeState]:
        """The nodes that can ever hold an object of ``size`` bytes: it must fit in their
        DRAM tier, and (unless the store is DRAM-only) in their SSD backend, or it would
        be lost the first time it is evicted. Refuses, naming the limit, if none can."""
        roomy = [n for n in nodes if n.announced.dram_capacity >= size]
        if not roomy:
            largest = max(n.announced.dram_capacity for n in nodes)
            raise NoSpaceError(
                f"the object is {format_size(size)}, larger than the whole DRAM tier of "
                f"every node (the largest is {format_size(largest)}); split it, or give a "
                "node more DRAM (node.dram)", key=key)
        if self.cluster.policy.dram_only:
            return roomy
        # A max_value_size of 0: the node did not say, so it is not checked.
        placeable = [n for n in roomy
                     if not n.announced.max_value_size or n.announced.max_value_size >= size]
        if not placeable:
            best = max((n.announced for n in roomy), key=lambda told: told.max_value_size)
            raise NoSpaceError(
                f"the object is {format_size(size)}, larger than the SSD tier takes "
                f"({format_size(best.max_value_size)}, the {best.backend} backend's "
                "max_value_size), so it could never be offloaded; split it, or raise "
                "max_value_size in [node.backend_options]", key=key)
        return placeable

    @staticmethod
    def _place(nodes: list[NodeState], size: int, host: str | None) -> NodeState:
        """The client's own host if it has room (no network hop), else the emptiest."""
        local = [n for n in nodes if n.host_id == host and n.dram_free() >= size]
        if local:
            return max(local, key=NodeState.dram_free)
        return max(nodes, key=NodeState.dram_free)

    async def put_abort(self, conn: FramedSocket, request: KeysRequest) -> Empty:
        """A client gave up on puts it was told to place: release the reservations."""
        cluster = self.cluster
        for key in request.keys:
            pending = cluster.table.pending.pop(key, None)
            node = cluster.nodes.get(pending.node) if pending else None
            if pending is not None and node is not None:
                node.pending_bytes = max(0, node.pending_bytes - pending.size)
        return Empty()

    # -- reads -----------------------------------------------------------------------------

    async def lookup(self, conn: FramedSocket, request: LookupRequest) -> LookupReply:
        cluster = self.cluster
        table, nodes, metrics = cluster.table, cluster.nodes, cluster.metrics
        now = time.monotonic()
        lease_ttl = cluster.settings.lease_ttl
        sizes: list[int | None] = []
        checksums: list[int | None] = []
        replicas = Replicas()
        referenced: set[str] = set()
        # Counted per result once per batch: a labelled counter's update costs a few
        # microseconds, which per key was a third of a 32-key lookup.
        results: dict[str, int] = {}
        for i, key in enumerate(request.keys):
            meta = table.lookup(key, now, lease_ttl, request.holder) if request.lease \
                else table.objects.get(key)
            readable = [] if meta is None else [
                r for r in meta.readable() if (n := nodes.get(r.node)) is not None and n.alive]
            if meta is None or not readable:
                sizes.append(None)
                checksums.append(None)
                results["miss"] = results.get("miss", 0) + 1
                continue
            readable.sort(key=lambda r: r.tier is not DRAM)  # DRAM copies first
            first = readable[0]
            result = _HIT[first.tier]
            results[result] = results.get(result, 0) + 1
            if first.tier is SSD and count_ssd_read(meta, cluster.policy, now):
                let_go = nodes[first.node].queue_promotion(key)
                if let_go:
                    metrics.promotions_skipped.labels(reason="queue_full").inc(let_go)
            sizes.append(meta.size)
            checksums.append(meta.checksum)
            for replica in readable:
                replicas.of.append(i)
                replicas.nodes.append(replica.node)
                replicas.tiers.append(replica.tier)
                replicas.offsets.append(replica.offset)
                referenced.add(replica.node)
        for result, count in results.items():
            metrics.lookups.labels(result=result).inc(count)
        return LookupReply(sizes, checksums, replicas, lease_ttl, self._contacts(referenced))

    async def lock(self, conn: FramedSocket, request: LockRequest) -> LockReply:
        """Lookup-and-lock: each key found is locked against eviction (see LockRequest).
        Eviction skips a locked object, so its DRAM copy stays until the lock ends, and
        the holder's read finds it where the lookup did."""
        cluster = self.cluster
        table, metrics = cluster.table, cluster.metrics
        ttl = min(request.ttl, cluster.settings.max_lock_ttl)
        now = time.monotonic()
        locked: list[bool] = []
        for key in request.keys:
            found = ttl > 0 and table.lock(key, request.holder, now, ttl) is not None
            locked.append(found)
            if not found and request.leading:
                break
        hits = sum(locked)
        metrics.locks.labels(result="locked").inc(hits)
        metrics.locks.labels(result="miss").inc(len(locked) - hits)
        locked += [False] * (len(request.keys) - len(locked))
        return LockReply(locked, ttl)

    async def unlock(self, conn: FramedSocket, request: UnlockRequest) -> UnlockReply:
        now = time.monotonic()
        return UnlockReply([self.cluster.table.unlock(k, request.holder, now)
                            for k in request.keys])

    async def exists(self, conn: FramedSocket, request: KeysRequest) -> ExistsReply:
        return ExistsReply([self.cluster.table.exists(k) for k in request.keys])

    async def prefix_hits(self, conn: FramedSocket, request: KeysRequest) -> PrefixHitsReply:
        hits = 0
        for key in request.keys:
            if not self.cluster.table.exists(key):
                break
            hits += 1
        return PrefixHitsReply(hits)

    async def stat(self, conn: FramedSocket, request: StatRequest) -> StatReply:
        meta = self.cluster.table.objects.get(request.key)
        if meta is None:
            raise NotFoundError("no such object", key=request.key)
        now = time.monotonic()
        return StatReply(ObjectStat(
            key=meta.key, size=meta.size, checksum=meta.checksum, reads=meta.reads,
            age_seconds=now - meta.created, leased_seconds=max(0.0, meta.lease_until - now),
            replicas=[ReplicaInfo(r.node, r.tier, r.state, r.offset) for r in meta.replicas],
            locked_seconds=max(0.0, *(meta.locks or {}).values()) - now
            if meta.locked(now) else 0.0))

    # -- removal and listing ---------------------------------------------------------------

    async def remove(self, conn: FramedSocket, request: KeysRequest) -> RemoveReply:
        cluster = self.cluster
        removed = []
        gone = []
        now = time.monotonic()
        for key in request.keys:
            meta = cluster.table.remove(key)
            removed.append(meta is not None)
            if meta is None:
                continue
            gone.append(meta)
            for r in meta.replicas:
                # A full housekeeping pass per remove cost as much as the lookups did.
                cluster.free_when_unleased(meta, r.node, r.tier, r.offset, now, removed=True)
        # Not before the nodes holding them stop serving them to get_held.
        await self.revoker.revoke(gone)
        return RemoveReply(removed)

    async def remove_prefix(self, conn: FramedSocket, request: RemovePrefixRequest
                            ) -> RemovePrefixReply:
        """Remove every object under the prefix whose put started before this call, and
        cancel the puts under it in flight now (their commits are refused), so that
        nothing this removal saw resurrects; puts that start during or after it are
        kept. Works in chunks, letting other requests run between them: the fence (a
        number of the table's sequence) decides what goes, not the moment a chunk runs."""
        cluster = self.cluster
        table = cluster.table
        prefix = request.prefix
        fence = table.next_seq()
        cancelled = 0 if request.dry_run else table.cancel_pending(prefix)
        removed = nbytes = 0
        after: str | None = None
        while True:
            keys = table.keys_with_prefix(prefix, after, REMOVE_PREFIX_CHUNK)
            if not keys:
                break
            after = keys[-1]
            now = time.monotonic()
            gone_here = []
            for key in keys:
                meta = table.objects.get(key)
                if meta is None or meta.seq >= fence:
                    continue
                removed += 1
                nbytes += meta.size
                if request.dry_run:
                    continue
                gone = table.remove(key)
                assert gone is not None
                gone_here.append(gone)
                for r in gone.replicas:
                    cluster.free_when_unleased(gone, r.node, r.tier, r.offset, now,
                                               removed=True)
            # Each chunk before the next: a key put again meanwhile is never shadowed.
            await self.revoker.revoke(gone_here)
            if len(keys) < REMOVE_PREFIX_CHUNK:
                break
            await between_chunks()
        if not request.dry_run:
            cluster.metrics.prefix_removals.inc(removed)
        return RemovePrefixReply(removed, nbytes, cancelled, request.dry_run)

    async def add_namespace(self, conn: FramedSocket, request: NamespaceRequest
                            ) -> NamespaceReply:
        prefix = request.prefix
        table = self.cluster.table
        if not prefix.endswith(NAMESPACE_SEPARATOR):
            raise BadRequestError(f"a namespace is a key prefix ending in "
                                  f"{NAMESPACE_SEPARATOR!r}; {prefix!r:.80} does not")
        if prefix not in table.namespaces and len(table.namespaces) > MAX_NAMESPACES:
            raise BadRequestError(f"the master counts at most {MAX_NAMESPACES} namespaces "
                                  "and has that many; use fewer, broader prefixes")
        return NamespaceReply(table.add_namespace(prefix))

    async def list(self, conn: FramedSocket, request: ListRequest) -> ListReply:
        """Keys in order after ``after``; with ``node`` and/or ``tier``, only those with a
        complete replica there. A filtered page examines at most LIST_SCAN_PAGES pages'
        worth of keys, so it may come back short (even empty) with ``more``: resume from
        ``after``."""
        table = self.cluster.table
        limit = min(request.limit or 1000, LIST_LIMIT)
        node, tier = request.node, request.tier
        unfiltered = node is None and tier is None
        budget = limit if unfiltered else LIST_SCAN_PAGES * limit
        keys = table.keys_with_prefix(request.prefix or "", request.after, budget + 1)
        listed: list[str] = []
        sizes: list[int] = []
        tiers: list[list[Tier]] = []
        more, cursor = len(keys) > budget, request.after
        for key in keys[:budget]:
            if len(listed) == limit:
                more = True
                break
            cursor = key
            readable = table.objects[key].readable()
            if unfiltered or any(node in (None, r.node) and tier in (None, r.tier)
                                 for r in readable):
                listed.append(key)
                sizes.append(table.objects[key].size)
                tiers.append(sorted({r.tier for r in readable}))
        return ListReply(listed, sizes, tiers, more, after=cursor)
