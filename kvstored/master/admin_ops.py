"""The master's admin ops: status, flush, evict and recover (what ``kvstore`` drives).
Flush and recover wait on the nodes."""

from __future__ import annotations

import time

import trio

from kvstored.errors import NotFoundError
from kvstored.master.cluster import Cluster
from kvstored.master.revoke import Revoker
from kvstored.master.table import DRAM, SSD, ObjectMeta, Replica
from kvstored.master.waits import Waiter
from kvstored.protocol import ops
from kvstored.protocol.master_api import (
    Empty,
    EvictReply,
    EvictRequest,
    FlushFailure,
    FlushReply,
    FlushRequest,
    HitRate,
    NamespaceStatus,
    RecoverReply,
    RecoverRequest,
    RecoverTask,
    StatusReply,
    TierCount,
    TierStatus,
)
from kvstored.rpc import Binding, FramedSocket

#: How long a flush or recover waits when the client does not say.
DEFAULT_FLUSH_WAIT = 600.0
DEFAULT_RECOVER_WAIT = 3600.0


class AdminOps:
    """The handlers for operators (:meth:`bindings`)."""

    def __init__(self, cluster: Cluster, revoker: Revoker) -> None:
        self.cluster = cluster
        self.revoker = revoker

    def bindings(self) -> list[Binding]:
        return [Binding(ops.STATUS, self.status),
                Binding(ops.FLUSH, self.flush),
                Binding(ops.EVICT, self.evict),
                Binding(ops.RECOVER, self.recover)]

    async def status(self, conn: FramedSocket, request: Empty) -> StatusReply:
        cluster = self.cluster
        usage = cluster.table.usage()
        live = [n for n in cluster.nodes.values() if n.alive]
        tiers = {
            DRAM.value: TierStatus(usage[DRAM].objects, usage[DRAM].bytes,
                                   sum(n.stats.dram_used for n in live),
                                   sum(n.announced.dram_capacity for n in live)),
            SSD.value: TierStatus(usage[SSD].objects, usage[SSD].bytes,
                                  sum(n.stats.ssd_used for n in live),
                                  sum(n.announced.ssd_capacity for n in live))}
        lookups = cluster.metrics.lookup_counts()
        total = sum(lookups.values()) or 1
        dram, ssd = lookups.get("hit_dram", 0) / total, lookups.get("hit_ssd", 0) / total
        namespaces = {
            ns: NamespaceStatus(u.objects, {t.value: TierCount(c.objects, c.bytes)
                                            for t, c in u.usage().items()})
            for ns, u in cluster.table.namespaces.items()}
        return StatusReply(nodes=[n.status() for n in cluster.nodes.values()], tiers=tiers,
                           objects=len(cluster.table.objects), lookups=lookups,
                           hit_rate=HitRate(dram, ssd, dram + ssd), namespaces=namespaces)

    async def flush(self, conn: FramedSocket, request: FlushRequest) -> FlushReply:
        cluster = self.cluster
        only = request.node
        targets = [n for n in cluster.live_nodes() if only in (None, n.node_id)]
        if only is not None and not targets:
            raise NotFoundError(f"no live node named {only!r}")
        waiter = Waiter(set())
        for node in targets:
            keys = [key for key in cluster.table.dram_keys_oldest_first(node.node_id)
                    if cluster.table.objects[key].replica(node.node_id, SSD) is None]
            waiter.pending.update((node.node_id, k) for k in keys)
            # Named again even if queued: objects waiting for a retry go now.
            cluster.queue_offload(node, keys, urgent=True, again=True)
        queued = len(waiter.pending)
        if not request.wait or not waiter.pending:
            return FlushReply(queued, done=not waiter.pending, failed=[])
        cluster.flushes.append(waiter)
        try:
            with trio.move_on_after(_or(request.timeout, DEFAULT_FLUSH_WAIT)):
                await waiter.event.wait()
        finally:
            cluster.flushes.remove(waiter)
        # Only what still fails: an attempt that failed and was then retried and
        # written is not reported.
        return FlushReply(queued, done=not waiter.pending,
                          failed=[FlushFailure(k, why) for k, why in waiter.failed.items()],
                          remaining=len(waiter.pending))

    async def evict(self, conn: FramedSocket, request: EvictRequest) -> EvictReply:
        cluster = self.cluster
        tier = request.tier
        now = time.monotonic()
        evicted: list[str] = []
        dropped: list[ObjectMeta] = []  # last copies: the object is gone, as by a remove
        offloading: list[str] = []
        skipped: list[str] = []
        freed = 0
        for meta, replica in self._candidates(request):
            if request.bytes is not None and freed >= request.bytes:
                break
            node = cluster.nodes.get(replica.node)
            last_copy = not meta.has_other_copy(replica.node, tier)
            if last_copy and not request.drop:
                if tier is DRAM and node is not None and not cluster.policy.dram_only:
                    offloading.append(meta.key)
                    if not request.dry_run:
                        node.evict_after_offload.add(meta.key)
                        cluster.queue_offload(node, [meta.key], urgent=True)
                    freed += meta.size
                else:
                    skipped.append(meta.key)
                continue
            evicted.append(meta.key)
            freed += meta.size
            if not request.dry_run:
                cluster.metrics.evictions.labels(tier=tier).inc()
                cluster.drop_when_unleased(meta.key, replica.node, tier, now)
                if last_copy:
                    gone = cluster.table.remove(meta.key)
                    if gone is not None:
                        dropped.append(gone)
        # Not before the nodes stop serving them to get_held: a client that cached where
        # a dropped key was would read the dropped bytes there, even once the key is put
        # again with another value (the node keeps them while a reader's lease runs).
        await self.revoker.revoke(dropped)
        return EvictReply(evicted, offloading, skipped, freed, request.dry_run)

    def _candidates(self, request: EvictRequest) -> list[tuple[ObjectMeta, Replica]]:
        """The complete replicas in the request's tier of the objects it names (keys, a
        prefix, or all of them, least recently used first)."""
        objects = self.cluster.table.objects
        if request.keys is not None:
            # A key named twice is one object: listed, counted and dropped once.
            metas = [objects[k] for k in dict.fromkeys(request.keys) if k in objects]
        elif request.prefix is not None:
            prefix = request.prefix
            metas = [m for k, m in objects.items() if k.startswith(prefix)]
        else:
            metas = sorted(objects.values(), key=lambda m: m.last_access)
        return [(meta, replica) for meta in metas for replica in meta.readable()
                if replica.tier is request.tier]

    async def recover(self, conn: FramedSocket, request: RecoverRequest) -> RecoverReply:
        cluster = self.cluster
        only = request.node
        targets = [n for n in cluster.live_nodes() if only in (None, n.node_id)]
        if not targets:
            raise NotFoundError(f"no live node named {only!r}" if only else "no live node")
        ident = cluster.next_id()
        waiter = Waiter({(n.node_id, "") for n in targets})
        cluster.recoveries[ident] = waiter
        for node in targets:
            node.queue(RecoverTask(ident, repair=request.repair))
        try:
            with trio.move_on_after(_or(request.timeout, DEFAULT_RECOVER_WAIT)):
                await waiter.event.wait()
        finally:
            del cluster.recoveries[ident]
        return RecoverReply(reports=waiter.reports,
                            missing=sorted(n for n, _ in waiter.pending))



def _or(seconds: float | None, default: float) -> float:
    return default if seconds is None else seconds
