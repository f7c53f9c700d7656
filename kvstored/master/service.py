"""The master's RPC service: object and node tables behind msgpack ops.

Node-facing ops: ``register``, ``register_objects``, ``register_done``, ``commit``,
``heartbeat``, ``ssd_evicted``, ``leaving`` (a node shutting down takes no more puts) and
``unregister`` (it is gone: its replicas are dropped at once). Client-facing ops:
``put_target``, ``lookup``, ``exists``, ``prefix_hits``, ``stat``, ``remove``, ``list``,
``status``, ``flush``, ``evict``, ``recover``.

All state lives in memory and is rebuilt from the nodes' registrations after a restart.
Handlers never block: they touch tables and return. Work on nodes is queued as tasks
that ride on the nodes' heartbeat replies. Housekeeping runs under a
:class:`~kvstored.supervisor.Supervisor`: a failed pass is logged and counted, and the
next one runs.
"""

from __future__ import annotations

import itertools
import logging
import time
from typing import Any

import trio

from kvstored.errors import BadRequestError
from kvstored.master.admin_ops import AdminOps
from kvstored.master.client_ops import ClientOps
from kvstored.master.nodes import NodeState
from kvstored.master.policy import PolicyConfig, plan_node
from kvstored.master.table import DRAM, SSD, TIERS, ObjectTable
from kvstored.master.waits import Deferred, Waiter
from kvstored.metrics import MasterMetrics
from kvstored.protocol import MASTER_OPS, OffloadFailed
from kvstored.rpc import FramedSocket, ServerLimits, Service
from kvstored.security import Credentials
from kvstored.supervisor import Supervisor

log = logging.getLogger(__name__)



class Master(ClientOps, AdminOps):
    def __init__(self, *, policy: PolicyConfig, lease_ttl: float = 5.0,
                 put_timeout: float = 30.0, node_ttl: float = 10.0,
                 heartbeat_interval: float = 0.2, credentials: Credentials | None = None,
                 limits: ServerLimits | None = None,
                 metrics: MasterMetrics | None = None) -> None:
        self.policy = policy
        self.lease_ttl = lease_ttl
        self.put_timeout = put_timeout
        self.node_ttl = node_ttl
        self.heartbeat_interval = heartbeat_interval
        self.table = ObjectTable()
        self.nodes: dict[str, NodeState] = {}
        self.metrics = metrics or MasterMetrics()
        self.supervisor = Supervisor("master", self.metrics.background_errors)
        # Drops waiting for leases to expire.
        self.deferred: list[Deferred] = []
        self.flushes: list[Waiter] = []
        self.recoveries: dict[int, Waiter] = {}
        self._ids = itertools.count(1)
        self.service = Service("master", MASTER_OPS, credentials=credentials, limits=limits)
        self.service.hello_extra = lambda header: {"heartbeat_interval": heartbeat_interval}
        self.service.bind(self)
        self.service.on_disconnect = self._disconnected

    # -- background -------------------------------------------------------------------

    async def run_housekeeping(self) -> None:
        await self.supervisor.forever("housekeeping", self._housekeeping_pass)

    async def _housekeeping_pass(self) -> None:
        await trio.sleep(self.heartbeat_interval / 2)
        self.housekeeping(time.monotonic())

    def housekeeping(self, now: float) -> None:
        self.table.expire_pending(now)
        for node in list(self.nodes.values()):
            if node.alive and now - node.last_heartbeat > self.node_ttl:
                self._node_died(node)
        still = []
        for item in self.deferred:
            meta = None if item.removed else self.table.objects.get(item.key)
            if meta is not None and meta.lease_until > item.not_before:
                item.not_before = meta.lease_until  # leased again while it was removing
            if item.not_before > now:
                still.append(item)
            elif item.node in self.nodes:
                self._queue_drop(self.nodes[item.node], item.tier, [[item.key, item.ident]])
        self.deferred = still
        self._update_gauges()

    def _node_died(self, node: NodeState) -> None:
        node.alive = False
        gone = self.table.drop_node(node.node_id)
        log.warning("node %s missed heartbeats for %.1fs: dropped its replicas; %d objects "
                    "had no other copy and are gone", node.node_id, self.node_ttl, len(gone))
        self._fail_flushes(node.node_id, f"node {node.node_id} died")

    def _fail_flushes(self, node_id: str, reason: str) -> None:
        """``node_id`` died or left: its share of a flush has failed, and a recovery
        waiting only for gone nodes reports them as missing now, not at its timeout."""
        for waiter in self.flushes:
            for pair in [p for p in waiter.pending if p[0] == node_id]:
                waiter.pending.discard(pair)
                waiter.failed[pair[1]] = reason
        self._wake_flushes()
        for waiter in self.recoveries.values():
            if all(n not in self.nodes or not self.nodes[n].alive for n, _ in waiter.pending):
                waiter.event.set()

    def _queue(self, node: NodeState, task: dict[str, Any]) -> None:
        for queued in node.tasks:  # merge with a queued task of the same kind
            if queued["t"] == task["t"] and queued.get("tier") == task.get("tier") \
                    and not queued.get("urgent") and not task.get("urgent"):
                for field in ("keys", "items"):
                    if field in task:
                        queued[field].extend(task[field])
                        return
        node.tasks.append(task)

    def _queue_drop(self, node: NodeState, tier: str, items: list[list[Any]]) -> None:
        """Ask ``node`` to free versions of keys: ``[key, offset]`` in DRAM, ``[key,
        checksum]`` on SSD, so a late drop never frees a newer object of the same key."""
        self._queue(node, {"t": "drop", "tier": tier, "items": items})

    def _node(self, conn: FramedSocket, header: dict[str, Any]) -> NodeState:
        """The node a node op is about; only the connection that registered it may
        speak for it."""
        node = self.nodes.get(header.get("node"))
        if node is None:
            raise BadRequestError(f"unknown node {header.get('node')!r}: register first")
        if node.session is not conn:
            raise BadRequestError(f"node {node.node_id} is registered over another "
                                  "connection; register again")
        return node

    async def _disconnected(self, conn: FramedSocket) -> None:
        # The name is free for the next registration once its connection is gone.
        for node in self.nodes.values():
            if node.session is conn:
                node.session = None

    # -- node-facing ops ---------------------------------------------------------------

    async def op_register(self, conn: FramedSocket, h: dict[str, Any]):
        info = h["info"]
        node_id = str(info["node"])
        held = self.nodes.get(node_id)
        if held is not None and held.alive and held.session not in (None, conn):
            raise BadRequestError(
                f"node name {node_id!r} belongs to a live node (data server "
                f"{held.address[0]}:{held.address[1]}); give this node another --name, or "
                "stop that one: its name is free once it disconnects or misses heartbeats "
                f"for {self.node_ttl:g}s")
        if held is not None:
            self.table.drop_node(node_id)  # it re-sends everything it holds
        host, port = info["address"]
        self.nodes[node_id] = NodeState(
            node_id=node_id, address=(str(host), int(port)), host_id=str(info["host"]),
            segment=str(info["segment"]), segment_token=str(info["token"]),
            dram_capacity=int(info["dram_capacity"]), ssd_capacity=int(info["ssd_capacity"]),
            backend=str(info.get("backend") or ""), shared_ssd=bool(info.get("shared")),
            max_value_size=int(info.get("max_value_size") or 0),
            inventory=int(info.get("objects") or 0),
            last_heartbeat=time.monotonic(), session=conn)
        log.info("node %s registering from %s:%s", node_id, host, port)
        # The node checks clients on its data server with the cluster's client token.
        return {"heartbeat_interval": self.heartbeat_interval,
                "client_token": self.service.credentials.client,
                "dram_only": self.policy.dram_only}, ()

    async def op_leaving(self, conn: FramedSocket, h: dict[str, Any]):
        """The node is shutting down: place no more puts there (it still serves reads
        while it writes its DRAM-only objects to SSD)."""
        node = self._node(conn, h)
        node.leaving = True
        log.info("node %s is leaving: no more puts go there", node.node_id)
        return {}, ()

    async def op_unregister(self, conn: FramedSocket, h: dict[str, Any]):
        """The node has stopped: forget it and its replicas now, so that lookups send
        clients to other copies (or report a clean miss) instead of to a closed port."""
        node = self._node(conn, h)
        del self.nodes[node.node_id]
        gone = self.table.drop_node(node.node_id)
        log.info("node %s left the cluster: dropped its replicas; %d objects had no other "
                 "copy", node.node_id, len(gone))
        self._fail_flushes(node.node_id, f"node {node.node_id} left")
        self._update_gauges()
        return {"dropped": len(gone)}, ()

    async def op_register_objects(self, conn: FramedSocket, h: dict[str, Any]):
        node = self._node(conn, h)
        now = time.monotonic()
        conflicts = []
        for key, size, checksum, tier, offset in h["objects"]:
            if tier not in TIERS:
                raise BadRequestError(f"unknown tier {tier!r}")
            if not self.table.commit(key, node.node_id, tier, size, checksum, offset, now) \
                    and self.table.objects[key].replica(node.node_id, tier) is None:
                conflicts.append([key, tier])
        node.inventory_sent += len(h["objects"])
        # Registration also counts as a sign of life: a large inventory takes longer
        # than master.node_ttl to send, and its node heartbeats only afterwards.
        node.last_heartbeat = now
        return {"conflicts": conflicts}, ()

    async def op_register_done(self, conn: FramedSocket, h: dict[str, Any]):
        node = self._node(conn, h)
        node.registered = True
        node.alive = True
        if not self.policy.dram_only and self.policy.offload == "eager":
            dram_only = [m.key for m in self.table.on_node(node.node_id, DRAM)
                         if not m.has_other_copy(node.node_id, DRAM)]
            self._queue_offload(node, dram_only)
        log.info("node %s registered: %d objects", node.node_id,
                 sum(1 for _ in self.table.on_node(node.node_id)))
        return {}, ()

    async def op_commit(self, conn: FramedSocket, h: dict[str, Any]):
        node = self._node(conn, h)
        now = time.monotonic()
        results = []
        committed = []
        for key, size, checksum, offset in h["objects"]:
            ok = self.table.commit(key, node.node_id, DRAM, size, checksum, offset, now)
            results.append(ok)
            if ok:
                committed.append(key)
                node.pending_bytes = max(0, node.pending_bytes - size)
        self.metrics.puts.inc(len(committed))
        if committed and not self.policy.dram_only and self.policy.offload == "eager":
            self._queue_offload(node, committed)
        return {"results": results}, ()

    def _queue_offload(self, node: NodeState, keys: list[str], urgent: bool = False,
                       again: bool = False) -> None:
        """Ask ``node`` to offload ``keys``. Keys already queued there are not sent again
        (the node retries its own failures), unless ``again``: a flush names every key,
        so that the node retries those waiting for a backoff at once."""
        fresh = list(keys) if again else [k for k in keys if k not in node.offload_queued]
        if fresh or urgent:
            node.offload_queued.update(fresh)
            self._queue(node, {"t": "offload", "keys": fresh, "urgent": urgent})

    async def op_heartbeat(self, conn: FramedSocket, h: dict[str, Any]):
        node = self._node(conn, h)
        now = time.monotonic()
        node.last_heartbeat = now
        if not node.alive:
            raise BadRequestError(f"node {node.node_id} was declared dead; re-register")
        stats = h.get("stats", {})
        node.dram_used = int(stats.get("dram_used", node.dram_used))
        node.ssd_used = int(stats.get("ssd_used", node.ssd_used))
        node.ssd_objects = int(stats.get("ssd_objects", node.ssd_objects))
        node.corrupt_reads = int(stats.get("corrupt_reads", node.corrupt_reads))
        node.quarantined = int(stats.get("quarantined", node.quarantined))
        problem = stats.get("offload_problem")
        node.offload_problem = str(problem) if problem else None
        node.pending_bytes = 0
        self._apply_done(node, h.get("done", {}), now)
        plan = plan_node(node, self.table, self.policy, now)
        if plan.offload or plan.offload_urgent:
            self._queue_offload(node, plan.offload, urgent=plan.offload_urgent)
        if plan.drop_now:
            self.metrics.evictions.labels(tier=DRAM).inc(len(plan.drop_now))
            self._queue_drop(node, DRAM, [
                [k, self.table.objects[k].replica(node.node_id, DRAM).offset]
                for k in plan.drop_now])
        if plan.promote:
            self._queue(node, {"t": "promote", "keys": plan.promote})
        tasks, node.tasks = node.tasks, []
        return {"tasks": tasks}, ()

    def _apply_done(self, node: NodeState, done: dict[str, Any], now: float) -> None:
        offloaded = []
        for key, checksum in done.get("offloaded", []):
            node.offload_queued.discard(key)
            meta = self.table.objects.get(key)
            if meta is None or meta.checksum != checksum \
                    or not self.table.add_replica(key, node.node_id, SSD):
                # Removed (or replaced) while it was being written: free that copy too.
                self._queue_drop(node, SSD, [[key, checksum]])
                continue
            offloaded.append(key)
            if key in node.evict_after_offload:
                node.evict_after_offload.discard(key)
                self._drop_when_unleased(key, node.node_id, DRAM, now)
        if offloaded:
            meta_sizes = sum(self.table.objects[k].size for k in offloaded
                             if k in self.table.objects)
            self.metrics.offloads.inc(len(offloaded))
            self.metrics.offload_bytes.inc(meta_sizes)
        failures = [OffloadFailed.from_wire(item) for item in done.get("offload_failed", [])]
        for failure in failures:
            if not failure.retrying:  # else it stays queued: the node tries again itself
                node.offload_queued.discard(failure.key)
                node.evict_after_offload.discard(failure.key)
        if failures:
            # The node logs its own state changes; one line per report here, not per key.
            log.debug("node %s: %d offload(s) failed (%s)", node.node_id, len(failures),
                      failures[0].message)
        for key, tier, ident in done.get("dropped", []):
            self.table.drop_replica(key, node.node_id, tier, ident)
        for key in done.get("ssd_evicted", []):
            self.table.drop_replica(key, node.node_id, SSD)
            self.metrics.evictions.labels(tier=SSD).inc()
        for key, offset, checksum in done.get("promoted", []):
            meta = self.table.objects.get(key)
            if meta is not None and meta.checksum == checksum \
                    and self.table.add_replica(key, node.node_id, DRAM, offset):
                self.metrics.promotions.inc()
            else:
                self._queue_drop(node, DRAM, [[key, offset]])
        for report in done.get("recovered", []):
            waiter = self.recoveries.get(report.get("id"))
            if waiter is not None:
                waiter.reports[node.node_id] = report
                waiter.pending.discard((node.node_id, ""))
                if not waiter.pending:
                    waiter.event.set()
        for waiter in self.flushes:
            for key in offloaded:
                waiter.pending.discard((node.node_id, key))
                waiter.failed.pop(key, None)  # a retry made it
            for failure in failures:
                if (node.node_id, failure.key) in waiter.pending:
                    waiter.pending.discard((node.node_id, failure.key))
                    waiter.failed[failure.key] = failure.message
        self._wake_flushes()

    def _wake_flushes(self) -> None:
        for waiter in self.flushes:
            waiter.pending = {(n, k) for n, k in waiter.pending
                              if k in self.table.objects
                              and self.table.objects[k].replica(n, SSD) is None}
            if not waiter.pending:
                waiter.event.set()

    def _drop_when_unleased(self, key: str, node_id: str, tier: str, now: float) -> None:
        """Stop new leases on one replica and free it once the current ones expire."""
        meta = self.table.objects.get(key)
        replica = self.table.mark_removing(key, node_id, tier) if meta else None
        if replica is None:
            return
        ident = replica.offset if tier == DRAM else meta.checksum
        if meta.lease_until <= now and node_id in self.nodes:
            self._queue_drop(self.nodes[node_id], tier, [[key, ident]])
        else:
            self.deferred.append(Deferred(meta.lease_until, node_id, tier, key, ident, False))

    async def op_ssd_evicted(self, conn: FramedSocket, h: dict[str, Any]):
        node = self._node(conn, h)
        for key in h["keys"]:
            self.table.drop_replica(key, node.node_id, SSD)
        self.metrics.evictions.labels(tier=SSD).inc(len(h["keys"]))
        return {}, ()

    def _update_gauges(self) -> None:
        usage = self.table.usage()
        live = [n for n in self.nodes.values() if n.alive]
        self.metrics.set_tiers(usage, {
            DRAM: (sum(n.dram_used for n in live), sum(n.dram_capacity for n in live)),
            SSD: (sum(n.ssd_used for n in live), sum(n.ssd_capacity for n in live))})
        self.metrics.nodes.set(len(live))
        self.metrics.checksum_failures.set(sum(n.corrupt_reads for n in self.nodes.values()))
        self.metrics.quarantined.set(sum(n.quarantined for n in self.nodes.values()))
