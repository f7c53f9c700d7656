"""The master's ops for nodes: registration (a node re-sends everything it holds, so a
restarted master loses nothing), commits of received puts, heartbeats (stats and task
outcomes up, tasks down), and leaving.

Only the connection a node registered over may speak for it. Work for a node is queued
as tasks that ride on its heartbeat replies.
"""

from __future__ import annotations

import logging
import time

from kvstored.errors import BadRequestError
from kvstored.master.cluster import Cluster
from kvstored.master.nodes import NodeState
from kvstored.master.policy import count_ssd_read, plan_node
from kvstored.master.table import DRAM, SSD
from kvstored.protocol import ops
from kvstored.protocol.master_api import (
    CommitReply,
    CommitRequest,
    Empty,
    HeartbeatReply,
    HeartbeatRequest,
    NodeKeysRequest,
    NodeReport,
    NodeRequest,
    PromoteTask,
    RegisterObjectsReply,
    RegisterObjectsRequest,
    RegisterReply,
    RegisterRequest,
    UnregisterReply,
)
from kvstored.rpc import Binding, FramedSocket
from kvstored.security import Credentials

log = logging.getLogger(__name__)


class NodeOps:
    """The handlers of the ops only nodes may call (:meth:`bindings`)."""

    def __init__(self, cluster: Cluster, credentials: Credentials) -> None:
        self.cluster = cluster
        self.credentials = credentials

    def bindings(self) -> list[Binding]:
        return [Binding(ops.REGISTER, self.register),
                Binding(ops.REGISTER_OBJECTS, self.register_objects),
                Binding(ops.REGISTER_DONE, self.register_done),
                Binding(ops.COMMIT, self.commit),
                Binding(ops.HEARTBEAT, self.heartbeat),
                Binding(ops.SSD_EVICTED, self.ssd_evicted),
                Binding(ops.LEAVING, self.leaving),
                Binding(ops.UNREGISTER, self.unregister)]

    def _node(self, conn: object, name: str) -> NodeState:
        """The node a node op is about; only the connection that registered it may
        speak for it."""
        node = self.cluster.nodes.get(name)
        if node is None:
            raise BadRequestError(f"unknown node {name!r}: register first")
        if node.session is not conn:
            raise BadRequestError(f"node {node.node_id} is registered over another "
                                  "connection; register again")
        return node

    async def disconnected(self, conn: FramedSocket) -> None:
        # The name is free for the next registration once its connection is gone.
        for node in self.cluster.nodes.values():
            if node.session is conn:
                node.session = None

    # -- registration ----------------------------------------------------------------------

    async def register(self, conn: FramedSocket, request: RegisterRequest) -> RegisterReply:
        cluster = self.cluster
        held = cluster.nodes.get(request.node)
        if held is not None and held.alive and held.session not in (None, conn):
            raise BadRequestError(
                f"node name {request.node!r} belongs to a live node (data server "
                f"{held.announced.contact.endpoint}); give this node another --name, or stop that "
                "one: its name is free once it disconnects or misses heartbeats for "
                f"{cluster.settings.node_ttl:g}s")
        if held is not None:
            cluster.table.drop_node(request.node)  # it re-sends everything it holds
        cluster.nodes[request.node] = NodeState(
            node_id=request.node, announced=request, inventory=request.objects,
            last_heartbeat=time.monotonic(), session=conn)
        log.info("node %s registering from %s", request.node, request.contact.endpoint)
        # The node checks clients on its data server with the cluster's client token.
        return RegisterReply(heartbeat_interval=cluster.settings.heartbeat_interval,
                             client_token=self.credentials.client,
                             dram_only=cluster.policy.dram_only,
                             direct_permit=cluster.settings.direct_permit)

    def _registering(self, conn: object, name: str) -> NodeState:
        """The node a registration op is about. One declared dead meanwhile (its
        replicas, those of the inventory sent so far included, are dropped) must start
        its registration again: taking the rest, and register_done marking it alive,
        would leave it registered with part of what it holds."""
        node = self._node(conn, name)
        if not node.alive:
            raise BadRequestError(f"node {node.node_id} was declared dead while it "
                                  "registered; re-register")
        return node

    async def register_objects(self, conn: FramedSocket, request: RegisterObjectsRequest
                               ) -> RegisterObjectsReply:
        node = self._registering(conn, request.node)
        table = self.cluster.table
        now = time.monotonic()
        conflicts = RegisterObjectsReply()
        for key, size, checksum, tier, offset in zip(request.keys, request.sizes,
                                                     request.checksums, request.tiers,
                                                     request.offsets):
            if not table.commit(key, node.node_id, tier, size, checksum, offset, now) \
                    and table.objects[key].replica(node.node_id, tier) is None:
                conflicts.keys.append(key)
                conflicts.tiers.append(tier)
        node.inventory_sent += len(request.keys)
        # Registration also counts as a sign of life: a large inventory takes longer
        # than master.node_ttl to send, and its node heartbeats only afterwards.
        node.last_heartbeat = now
        return conflicts

    async def register_done(self, conn: FramedSocket, request: NodeRequest) -> Empty:
        cluster = self.cluster
        node = self._registering(conn, request.node)
        node.registered = True
        if cluster.eager_offload:
            cluster.queue_offload(node, [m.key for m in cluster.table.on_node(node.node_id, DRAM)
                                         if not m.has_other_copy(node.node_id, DRAM)])
        log.info("node %s registered: %d objects", node.node_id,
                 cluster.table.count_on(node.node_id))
        return Empty()

    # -- puts ------------------------------------------------------------------------------

    async def commit(self, conn: FramedSocket, request: CommitRequest) -> CommitReply:
        cluster = self.cluster
        node = self._node(conn, request.node)
        now = time.monotonic()
        results = []
        committed = []
        for key, size, checksum, offset in zip(request.keys, request.sizes, request.checksums,
                                               request.offsets):
            ok = cluster.table.commit(key, node.node_id, DRAM, size, checksum, offset, now)
            results.append(ok)
            if ok:
                committed.append(key)
                node.pending_bytes = max(0, node.pending_bytes - size)
        cluster.metrics.puts.inc(len(committed))
        if committed and cluster.eager_offload:
            cluster.queue_offload(node, committed)
        return CommitReply(results)

    # -- heartbeats ------------------------------------------------------------------------

    async def heartbeat(self, conn: FramedSocket, request: HeartbeatRequest) -> HeartbeatReply:
        cluster = self.cluster
        node = self._node(conn, request.node)
        now = time.monotonic()
        node.last_heartbeat = now
        if not node.alive:
            raise BadRequestError(f"node {node.node_id} was declared dead; re-register")
        if request.stats is not None:
            node.stats = request.stats
        node.pending_bytes = 0
        self._apply(node, request.done, now)
        for key in request.held_reads:
            meta = cluster.table.read_elsewhere(key, now)
            # Served from this node's SSD copy: counted toward promotion as a lookup
            # that finds only SSD copies counts it.
            if meta is not None and meta.replica(node.node_id, DRAM) is None \
                    and meta.replica(node.node_id, SSD) is not None \
                    and count_ssd_read(meta, cluster.policy, now):
                let_go = node.queue_promotion(key)
                if let_go:
                    cluster.metrics.promotions_skipped.labels(reason="queue_full").inc(let_go)
        plan = plan_node(node, cluster.table, cluster.policy, now)
        if plan.offload or plan.offload_urgent:
            cluster.queue_offload(node, plan.offload, urgent=plan.offload_urgent)
        if plan.evict:
            cluster.evict_dram(node, plan.evict, now)
        if plan.promote:
            node.queue(PromoteTask(plan.promote))
        return HeartbeatReply(node.take_tasks())

    def _apply(self, node: NodeState, done: NodeReport, now: float) -> None:
        """What the node reports having done since its last heartbeat."""
        cluster = self.cluster
        table = cluster.table
        offloaded = []
        for key, checksum in zip(done.offloaded.keys, done.offloaded.checksums):
            node.offload_queued.discard(key)
            meta = table.objects.get(key)
            if meta is None or meta.checksum != checksum \
                    or not table.add_replica(key, node.node_id, SSD):
                # Removed (or replaced) while it was being written: free that copy too.
                cluster.queue_drop(node, SSD, [key], [checksum])
                continue
            offloaded.append(key)
            if key in node.evict_after_offload:
                node.evict_after_offload.discard(key)
                if meta.locked(now):
                    # Locked since it was chosen: it stays; the next plans choose again.
                    continue
                # The eviction that waited for this offload happens now: counted now.
                cluster.metrics.evictions.labels(tier=DRAM).inc()
                cluster.drop_when_unleased(key, node.node_id, DRAM, now)
        if offloaded:
            cluster.metrics.offloads.inc(len(offloaded))
            cluster.metrics.offload_bytes.inc(sum(table.objects[k].size for k in offloaded
                                                  if k in table.objects))
        failures = done.offload_failed
        for failure in failures:
            if not failure.retrying:  # else it stays queued: the node tries again itself
                node.offload_queued.discard(failure.key)
                node.evict_after_offload.discard(failure.key)
        if failures:
            # The node logs its own state changes; one line per report here, not per key.
            log.debug("node %s: %d offload(s) failed (%s)", node.node_id, len(failures),
                      failures[0].message)
        dropped = done.dropped
        for key, tier, version in zip(dropped.keys, dropped.tiers, dropped.versions):
            table.drop_replica(key, node.node_id, tier, version)
            if tier is DRAM:
                cluster.dram_dropped(node, key, version)
        for key in done.ssd_evicted:
            table.drop_replica(key, node.node_id, SSD)
        cluster.metrics.evictions.labels(tier=SSD).inc(len(done.ssd_evicted))
        promoted = done.promoted
        for key, offset, checksum in zip(promoted.keys, promoted.offsets, promoted.checksums):
            meta = table.objects.get(key)
            if meta is not None and meta.checksum == checksum \
                    and table.add_replica(key, node.node_id, DRAM, offset):
                cluster.metrics.promotions.inc()
            else:
                cluster.queue_drop(node, DRAM, [key], [offset])
        if done.promote_failed:
            cluster.metrics.promotions_skipped.labels(reason="no_room").inc(
                len(done.promote_failed))
        for report in done.recovered:
            waiter = cluster.recoveries.get(report.id)
            if waiter is not None:
                waiter.reports[node.node_id] = report
                waiter.pending.discard((node.node_id, ""))
                if not waiter.pending:
                    waiter.event.set()
        for waiter in cluster.flushes:
            for key in offloaded:
                waiter.pending.discard((node.node_id, key))
                waiter.failed.pop(key, None)  # a retry made it
            for failure in failures:
                if (node.node_id, failure.key) in waiter.pending:
                    waiter.pending.discard((node.node_id, failure.key))
                    waiter.failed[failure.key] = failure.message
        cluster.wake_flushes()

    async def ssd_evicted(self, conn: FramedSocket, request: NodeKeysRequest) -> Empty:
        node = self._node(conn, request.node)
        for key in request.keys:
            self.cluster.table.drop_replica(key, node.node_id, SSD)
        self.cluster.metrics.evictions.labels(tier=SSD).inc(len(request.keys))
        return Empty()

    # -- leaving ---------------------------------------------------------------------------

    async def leaving(self, conn: FramedSocket, request: NodeRequest) -> Empty:
        """The node is shutting down: place no more puts there (it still serves reads
        while it writes its DRAM-only objects to SSD)."""
        node = self._node(conn, request.node)
        node.leaving = True
        log.info("node %s is leaving: no more puts go there", node.node_id)
        return Empty()

    async def unregister(self, conn: FramedSocket, request: NodeRequest) -> UnregisterReply:
        """The node has stopped: forget it and its replicas now, so that lookups send
        clients to other copies (or report a clean miss) instead of to a closed port."""
        return UnregisterReply(self.cluster.node_left(self._node(conn, request.node)))
