"""What the master knows, and the bookkeeping its ops share.

:class:`Cluster` holds the object table, the node table, the replicas waiting for their
leases to expire before they are freed, and the admin calls waiting on nodes; its
methods are the steps several ops take (queue a task for a node, free a replica once it
is unleased, forget a node that died or left, wake a flush). The ops themselves are in
:mod:`~kvstored.master.node_ops`, :mod:`~kvstored.master.client_ops` and
:mod:`~kvstored.master.admin_ops`; :mod:`~kvstored.master.service` ties them to the
protocol and runs housekeeping.

No I/O: handlers touch these tables and return. Times are ``time.monotonic()`` seconds
passed in by the caller.
"""

from __future__ import annotations

import itertools
import logging

from kvstored.config import MasterSettings, PolicySettings
from kvstored.master.nodes import NodeState
from kvstored.master.table import DRAM, SSD, ObjectMeta, ObjectTable
from kvstored.master.waits import Deferred, Waiter
from kvstored.metrics import MasterMetrics
from kvstored.protocol import Tier
from kvstored.protocol.master_api import DropTask, OffloadTask

log = logging.getLogger(__name__)


class Cluster:
    def __init__(self, policy: PolicySettings, settings: MasterSettings,
                 metrics: MasterMetrics) -> None:
        self.policy = policy
        #: The ``master.*`` settings: its clocks (leases, put and node timeouts, the
        #: heartbeat interval, the longest lock).
        self.settings = settings
        self.metrics = metrics
        self.table = ObjectTable()
        self.nodes: dict[str, NodeState] = {}
        #: Replicas waiting for their object's leases to expire before they are freed.
        self.deferred: list[Deferred] = []
        self.flushes: list[Waiter] = []
        self.recoveries: dict[int, Waiter] = {}
        self._ids = itertools.count(1)

    def next_id(self) -> int:
        return next(self._ids)

    def live_nodes(self) -> list[NodeState]:
        return [n for n in self.nodes.values() if n.alive and n.registered]

    @property
    def eager_offload(self) -> bool:
        return not self.policy.dram_only and self.policy.offload == "eager"

    # -- tasks ---------------------------------------------------------------------------

    def queue_offload(self, node: NodeState, keys: list[str], *, urgent: bool = False,
                      again: bool = False) -> None:
        """Ask ``node`` to offload ``keys``. Keys already queued there are not sent again
        (the node retries its own failures), unless ``again``: a flush names every key,
        so that the node retries those waiting for a backoff at once."""
        fresh = list(keys) if again else [k for k in keys if k not in node.offload_queued]
        if fresh or urgent:
            node.offload_queued.update(fresh)
            node.queue(OffloadTask(fresh, urgent=urgent))

    @staticmethod
    def queue_drop(node: NodeState, tier: Tier, keys: list[str], versions: list[int]) -> None:
        """Ask ``node`` to free versions of keys (the DRAM offset, or the SSD checksum), so
        that a late drop never frees a newer object of the same key."""
        node.queue(DropTask(tier, list(keys), list(versions)))

    @staticmethod
    def version(meta: ObjectMeta, tier: Tier, offset: int) -> int:
        """Which version of ``meta`` a replica in ``tier`` at ``offset`` holds."""
        return offset if tier is DRAM else meta.checksum

    def drop_when_unleased(self, key: str, node_id: str, tier: Tier, now: float) -> None:
        """Stop new leases on one replica and free it once the current ones expire."""
        meta = self.table.objects.get(key)
        replica = self.table.mark_removing(key, node_id, tier) if meta else None
        if meta is None or replica is None:
            return
        self.free_when_unleased(meta, node_id, tier, replica.offset, now, removed=False)

    def free_when_unleased(self, meta: ObjectMeta, node_id: str, tier: Tier, offset: int,
                           now: float, *, removed: bool) -> None:
        """Free a replica now if its object is unleased (the next heartbeat carries the
        drop), else once the last lease expires. ``removed``: the object is gone from the
        table, so no newer lease can hold this version."""
        version = self.version(meta, tier, offset)
        node = self.nodes.get(node_id)
        if node is not None and tier is DRAM:
            node.dram_freeing[(meta.key, offset)] = meta.size
        if meta.lease_until <= now and node is not None:
            self.queue_drop(node, tier, [meta.key], [version])
        else:
            self.deferred.append(Deferred(meta.lease_until, node_id, tier, meta.key,
                                          version, removed))

    def evict_dram(self, node: NodeState, keys: list[str], now: float) -> None:
        """Free the DRAM replicas on ``node`` that its plan marked removing: the unleased
        in one drop now, each leased one once its lease ends. Counted as evictions."""
        unleased: list[str] = []
        offsets: list[int] = []
        for key in keys:
            meta = self.table.objects[key]
            replica = meta.replica(node.node_id, DRAM)
            assert replica is not None  # the plan marked it removing just now
            if meta.leased(now):
                self.free_when_unleased(meta, node.node_id, DRAM, replica.offset, now,
                                        removed=False)
                continue
            node.dram_freeing[(key, replica.offset)] = meta.size
            unleased.append(key)
            offsets.append(replica.offset)
        if unleased:
            self.queue_drop(node, DRAM, unleased, offsets)
        self.metrics.evictions.labels(tier=DRAM).inc(len(keys))

    @staticmethod
    def dram_dropped(node: NodeState, key: str, offset: int | None) -> None:
        """``node`` freed a DRAM version of ``key`` (None: whichever it held)."""
        if offset is not None:
            node.dram_freeing.pop((key, offset), None)
            return
        for held in [k for k in node.dram_freeing if k[0] == key]:
            del node.dram_freeing[held]

    # -- nodes that go ---------------------------------------------------------------------

    def node_died(self, node: NodeState) -> None:
        node.alive = False
        gone = self.table.drop_node(node.node_id)
        log.warning("node %s missed heartbeats for %.1fs: dropped its replicas; %d objects "
                    "had no other copy and are gone", node.node_id, self.settings.node_ttl,
                    len(gone))
        self.fail_flushes(node.node_id, f"node {node.node_id} died")

    def node_left(self, node: NodeState) -> int:
        """Forget a node that unregistered, and its replicas; how many objects went too."""
        del self.nodes[node.node_id]
        gone = self.table.drop_node(node.node_id)
        log.info("node %s left the cluster: dropped its replicas; %d objects had no other "
                 "copy", node.node_id, len(gone))
        self.fail_flushes(node.node_id, f"node {node.node_id} left")
        self.update_gauges()
        return len(gone)

    def fail_flushes(self, node_id: str, reason: str) -> None:
        """``node_id`` died or left: its share of a flush has failed, and a recovery
        waiting only for gone nodes reports them as missing now, not at its timeout."""
        for waiter in self.flushes:
            for pair in [p for p in waiter.pending if p[0] == node_id]:
                waiter.pending.discard(pair)
                waiter.failed[pair[1]] = reason
        self.wake_flushes()
        for waiter in self.recoveries.values():
            if all(n not in self.nodes or not self.nodes[n].alive for n, _ in waiter.pending):
                waiter.event.set()

    def wake_flushes(self) -> None:
        """Wake the flushes whose objects all have an SSD copy now (or are gone)."""
        for waiter in self.flushes:
            waiter.pending = {(n, k) for n, k in waiter.pending
                              if k in self.table.objects
                              and self.table.objects[k].replica(n, SSD) is None}
            if not waiter.pending:
                waiter.event.set()

    # -- housekeeping ----------------------------------------------------------------------

    def housekeeping(self, now: float) -> None:
        """Expire abandoned puts, declare silent nodes dead, and free the replicas whose
        leases have run out."""
        self.table.expire_pending(now)
        for node in list(self.nodes.values()):
            if node.alive and now - node.last_heartbeat > self.settings.node_ttl:
                self.node_died(node)
        still = []
        for item in self.deferred:
            meta = None if item.removed else self.table.objects.get(item.key)
            if meta is not None and meta.lease_until > item.not_before:
                item.not_before = meta.lease_until  # leased again while it was removing
            if item.not_before > now:
                still.append(item)
            elif item.node in self.nodes:
                self.queue_drop(self.nodes[item.node], item.tier, [item.key], [item.version])
        self.deferred = still
        self.update_gauges()

    def update_gauges(self) -> None:
        usage = self.table.usage()
        live = [n for n in self.nodes.values() if n.alive]
        self.metrics.set_tiers({
            DRAM: (usage[DRAM].objects, sum(n.stats.dram_used for n in live),
                   sum(n.announced.dram_capacity for n in live)),
            SSD: (usage[SSD].objects, sum(n.stats.ssd_used for n in live),
                  sum(n.announced.ssd_capacity for n in live))})
        self.metrics.set_namespaces({
            ns: (u.objects, {t.value: c for t, c in u.usage().items()})
            for ns, u in self.table.namespaces.items() if ns})
        self.metrics.nodes.set(len(live))
        self.metrics.checksum_failures.set(sum(n.stats.corrupt_reads for n in self.nodes.values()))
        self.metrics.quarantined.set(sum(n.stats.quarantined for n in self.nodes.values()))
