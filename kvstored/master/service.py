"""The master's RPC service: object and node tables behind msgpack ops.

Node-facing ops: ``register``, ``register_objects``, ``register_done``, ``commit``,
``heartbeat``, ``ssd_evicted``. Client-facing ops: ``put_target``, ``lookup``,
``exists``, ``prefix_hits``, ``stat``, ``remove``, ``list``, ``status``, ``flush``,
``evict``, ``recover``.

All state lives in memory and is rebuilt from the nodes' registrations after a restart.
Handlers never block: they touch tables and return. Work on nodes is queued as tasks
that ride on the nodes' heartbeat replies.
"""

from __future__ import annotations

import itertools
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import trio

from kvstored.errors import BadRequestError, NotFoundError, UnreachableError
from kvstored.master.nodes import NodeState
from kvstored.master.policy import PolicyConfig, count_ssd_read, plan_node
from kvstored.master.table import DRAM, SSD, TIERS, ObjectTable
from kvstored.metrics import MasterMetrics
from kvstored.rpc import FramedSocket, Service

log = logging.getLogger(__name__)

MAX_BATCH = 65536


@dataclass(slots=True)
class _Deferred:
    """A replica to free once ``not_before`` has passed (its object's last lease)."""

    not_before: float
    node: str
    tier: str
    key: str
    #: Which version: the DRAM offset, or the SSD checksum (see the node's _drop).
    ident: int
    #: The object was removed (so no newer lease can hold this version any more).
    removed: bool


@dataclass
class _Waiter:
    """A flush or recover call waiting for nodes to report back."""

    pending: set[tuple[str, str]]
    event: trio.Event = field(default_factory=trio.Event)
    failed: list[list[str]] = field(default_factory=list)
    reports: dict[str, Any] = field(default_factory=dict)


class Master:
    def __init__(self, *, policy: PolicyConfig, lease_ttl: float = 5.0,
                 put_timeout: float = 30.0, node_ttl: float = 10.0,
                 heartbeat_interval: float = 0.2, token: str | None = None,
                 metrics: MasterMetrics | None = None) -> None:
        self.policy = policy
        self.lease_ttl = lease_ttl
        self.put_timeout = put_timeout
        self.node_ttl = node_ttl
        self.heartbeat_interval = heartbeat_interval
        self.table = ObjectTable()
        self.nodes: dict[str, NodeState] = {}
        self.metrics = metrics or MasterMetrics()
        # Drops waiting for leases to expire.
        self.deferred: list[_Deferred] = []
        self.flushes: list[_Waiter] = []
        self.recoveries: dict[int, _Waiter] = {}
        self._ids = itertools.count(1)
        self.service = Service("master", token=token)
        self.service.hello_extra = lambda header: {"heartbeat_interval": heartbeat_interval}
        for name in dir(self):
            if name.startswith("op_"):
                self.service.handlers[name[3:]] = getattr(self, name)

    # -- background -------------------------------------------------------------------

    async def run_housekeeping(self) -> None:
        while True:
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
        for waiter in self.flushes:
            for pair in [p for p in waiter.pending if p[0] == node.node_id]:
                waiter.pending.discard(pair)
                waiter.failed.append([pair[1], f"node {node.node_id} died"])
        self._wake_flushes()

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

    def _node(self, header: dict[str, Any]) -> NodeState:
        node = self.nodes.get(header.get("node"))
        if node is None:
            raise BadRequestError(f"unknown node {header.get('node')!r}: register first")
        return node

    # -- node-facing ops ---------------------------------------------------------------

    async def op_register(self, conn: FramedSocket, h: dict[str, Any]):
        info = h["info"]
        node_id = str(info["node"])
        if node_id in self.nodes:
            self.table.drop_node(node_id)  # it re-sends everything it holds
        host, port = info["address"]
        self.nodes[node_id] = NodeState(
            node_id=node_id, address=(str(host), int(port)), host_id=str(info["host"]),
            segment=str(info["segment"]), segment_token=str(info["token"]),
            dram_capacity=int(info["dram_capacity"]), ssd_capacity=int(info["ssd_capacity"]),
            backend=str(info.get("backend", "")), shared_ssd=bool(info.get("shared", False)),
            last_heartbeat=time.monotonic())
        log.info("node %s registering from %s:%s", node_id, host, port)
        return {"heartbeat_interval": self.heartbeat_interval}, ()

    async def op_register_objects(self, conn: FramedSocket, h: dict[str, Any]):
        node = self._node(h)
        now = time.monotonic()
        conflicts = []
        for key, size, checksum, tier, offset in h["objects"]:
            if tier not in TIERS:
                raise BadRequestError(f"unknown tier {tier!r}")
            if not self.table.commit(key, node.node_id, tier, size, checksum, offset, now) \
                    and self.table.objects[key].replica(node.node_id, tier) is None:
                conflicts.append([key, tier])
        return {"conflicts": conflicts}, ()

    async def op_register_done(self, conn: FramedSocket, h: dict[str, Any]):
        node = self._node(h)
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
        node = self._node(h)
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

    def _queue_offload(self, node: NodeState, keys: list[str], urgent: bool = False) -> None:
        fresh = [k for k in keys if k not in node.offload_queued]
        if fresh or urgent:
            node.offload_queued.update(fresh)
            self._queue(node, {"t": "offload", "keys": fresh, "urgent": urgent})

    async def op_heartbeat(self, conn: FramedSocket, h: dict[str, Any]):
        node = self._node(h)
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
        for key, reason in done.get("offload_failed", []):
            node.offload_queued.discard(key)
            node.evict_after_offload.discard(key)
            log.warning("offload of %r on node %s failed: %s", key, node.node_id, reason)
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
            for key, reason in done.get("offload_failed", []):
                if (node.node_id, key) in waiter.pending:
                    waiter.pending.discard((node.node_id, key))
                    waiter.failed.append([key, reason])
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
            self.deferred.append(_Deferred(meta.lease_until, node_id, tier, key, ident, False))

    async def op_ssd_evicted(self, conn: FramedSocket, h: dict[str, Any]):
        node = self._node(h)
        for key in h["keys"]:
            self.table.drop_replica(key, node.node_id, SSD)
        self.metrics.evictions.labels(tier=SSD).inc(len(h["keys"]))
        return {}, ()

    # -- client-facing ops -------------------------------------------------------------

    def _keys(self, h: dict[str, Any]) -> list[str]:
        keys = h["keys"]
        if not isinstance(keys, list) or len(keys) > MAX_BATCH:
            raise BadRequestError(f"keys must be a list of at most {MAX_BATCH}")
        if not all(isinstance(k, str) for k in keys):
            raise BadRequestError("keys must be strings")
        return keys

    def _live_nodes(self) -> list[NodeState]:
        return [n for n in self.nodes.values() if n.alive and n.registered]

    async def op_put_target(self, conn: FramedSocket, h: dict[str, Any]):
        keys, sizes = self._keys(h), h["sizes"]
        host = h.get("host")
        nodes = self._live_nodes()
        if not nodes:
            raise UnreachableError("no storage node is registered; start one with "
                                   "`kvstored node` (or use `kvstored up`)")
        now = time.monotonic()
        targets: list[str | None] = []
        for key, size in zip(keys, sizes):
            node = self._place(nodes, int(size), host)
            if self.table.reserve(key, node.node_id, int(size), now, self.put_timeout):
                node.pending_bytes += int(size)
                targets.append(node.node_id)
            else:
                targets.append(None)
        used = {t for t in targets if t is not None}
        return {"targets": targets,
                "nodes": {n: self.nodes[n].public() for n in used}}, ()

    async def op_put_abort(self, conn: FramedSocket, h: dict[str, Any]):
        """A client gave up on puts it was told to place: release the reservations."""
        for key in self._keys(h):
            pending = self.table.pending.pop(key, None)
            node = self.nodes.get(pending.node) if pending else None
            if node is not None:
                node.pending_bytes = max(0, node.pending_bytes - pending.size)
        return {}, ()

    def _place(self, nodes: list[NodeState], size: int, host: str | None) -> NodeState:
        """The client's own host if it has room (no network hop), else the emptiest."""
        local = [n for n in nodes if n.host_id == host and n.dram_free() >= size]
        if local:
            return max(local, key=NodeState.dram_free)
        return max(nodes, key=NodeState.dram_free)

    async def op_lookup(self, conn: FramedSocket, h: dict[str, Any]):
        keys = self._keys(h)
        now = time.monotonic()
        out: list[Any] = []
        referenced: set[str] = set()
        for key in keys:
            meta = self.table.lookup(key, now, self.lease_ttl) if h.get("lease", True) \
                else self.table.objects.get(key)
            if meta is None:
                out.append(None)
                self.metrics.lookups.labels(result="miss").inc()
                continue
            replicas = [[r.node, r.tier, r.offset] for r in meta.readable()
                        if self.nodes.get(r.node) and self.nodes[r.node].alive]
            if not replicas:
                out.append(None)
                self.metrics.lookups.labels(result="miss").inc()
                continue
            replicas.sort(key=lambda r: r[1] != DRAM)  # DRAM copies first
            tier = replicas[0][1]
            self.metrics.lookups.labels(result=f"hit_{tier}").inc()
            if tier == SSD and count_ssd_read(meta, self.policy, now):
                node = self.nodes[replicas[0][0]]
                node.promote_queued.add(key)
            referenced.update(r[0] for r in replicas)
            out.append([meta.size, meta.checksum, replicas])
        return {"objects": out, "lease_ttl": self.lease_ttl,
                "nodes": {n: self.nodes[n].public() for n in referenced}}, ()

    async def op_exists(self, conn: FramedSocket, h: dict[str, Any]):
        return {"exists": [self.table.exists(k) for k in self._keys(h)]}, ()

    async def op_prefix_hits(self, conn: FramedSocket, h: dict[str, Any]):
        hits = 0
        for key in self._keys(h):
            if not self.table.exists(key):
                break
            hits += 1
        return {"hits": hits}, ()

    async def op_stat(self, conn: FramedSocket, h: dict[str, Any]):
        key = h["key"]
        meta = self.table.objects.get(key)
        if meta is None:
            raise NotFoundError("no such object", key=key)
        now = time.monotonic()
        return {"object": {
            "key": key, "size": meta.size, "checksum": meta.checksum, "reads": meta.reads,
            "age_seconds": now - meta.created,
            "leased_seconds": max(0.0, meta.lease_until - now),
            "replicas": [{"node": r.node, "tier": r.tier, "state": r.state,
                          "offset": r.offset} for r in meta.replicas]}}, ()

    async def op_remove(self, conn: FramedSocket, h: dict[str, Any]):
        removed = []
        now = time.monotonic()
        for key in self._keys(h):
            meta = self.table.remove(key)
            removed.append(meta is not None)
            if meta is None:
                continue
            for r in meta.replicas:
                ident = r.offset if r.tier == DRAM else meta.checksum
                self.deferred.append(_Deferred(meta.lease_until, r.node, r.tier, key, ident,
                                               True))
        self.housekeeping(now)
        return {"removed": removed}, ()

    async def op_list(self, conn: FramedSocket, h: dict[str, Any]):
        """Keys in order after ``after``; with ``node`` and/or ``tier``, only those with a
        complete replica there. A filtered page examines at most 20 pages' worth of keys,
        so it may come back short (even empty) with ``more``: resume from ``after``."""
        prefix = str(h.get("prefix") or "")
        limit = min(int(h.get("limit", 1000)), 10000)
        node, tier = h.get("node"), h.get("tier")
        unfiltered = node is None and tier is None
        budget = limit if unfiltered else 20 * limit
        keys = self.table.keys_with_prefix(prefix, h.get("after"), budget + 1)
        more = len(keys) > budget
        objects, cursor = [], h.get("after")
        for key in keys[:budget]:
            if len(objects) == limit:
                more = True
                break
            cursor = key
            readable = self.table.objects[key].readable()
            if unfiltered or any(node in (None, r.node) and tier in (None, r.tier)
                                 for r in readable):
                objects.append([key, self.table.objects[key].size,
                                sorted({r.tier for r in readable})])
        return {"objects": objects, "more": more, "after": cursor}, ()

    async def op_status(self, conn: FramedSocket, h: dict[str, Any]):
        usage = self.table.usage()
        tiers = {}
        for tier in TIERS:
            cap_key = "dram_capacity" if tier == DRAM else "ssd_capacity"
            used_key = "dram_used" if tier == DRAM else "ssd_used"
            live = [n for n in self.nodes.values() if n.alive]
            tiers[tier] = {"objects": usage[tier]["objects"],
                           "logical_bytes": usage[tier]["bytes"],
                           "used_bytes": sum(getattr(n, used_key) for n in live),
                           "capacity_bytes": sum(getattr(n, cap_key) for n in live)}
        lookups = self.metrics.lookup_counts()
        total = sum(lookups.values()) or 1
        return {"nodes": [n.status() for n in self.nodes.values()], "tiers": tiers,
                "objects": len(self.table.objects),
                "lookups": lookups,
                "hit_rate": {"dram": lookups.get("hit_dram", 0) / total,
                             "ssd": lookups.get("hit_ssd", 0) / total,
                             "total": (lookups.get("hit_dram", 0)
                                       + lookups.get("hit_ssd", 0)) / total}}, ()

    async def op_flush(self, conn: FramedSocket, h: dict[str, Any]):
        only = h.get("node")
        targets = [n for n in self._live_nodes() if only in (None, n.node_id)]
        if only is not None and not targets:
            raise NotFoundError(f"no live node named {only!r}")
        waiter = _Waiter(set())
        for node in targets:
            keys = [m.key for m in self.table.on_node(node.node_id, DRAM)
                    if m.replica(node.node_id, SSD) is None]
            waiter.pending.update((node.node_id, k) for k in keys)
            self._queue_offload(node, keys, urgent=True)
        queued = len(waiter.pending)
        if not h.get("wait") or not waiter.pending:
            return {"queued": queued, "done": not waiter.pending, "failed": []}, ()
        self.flushes.append(waiter)
        try:
            with trio.move_on_after(float(h.get("timeout", 600))):
                await waiter.event.wait()
        finally:
            self.flushes.remove(waiter)
        return {"queued": queued, "done": not waiter.pending, "failed": waiter.failed,
                "remaining": len(waiter.pending)}, ()

    async def op_evict(self, conn: FramedSocket, h: dict[str, Any]):
        tier = h["tier"]
        if tier not in TIERS:
            raise BadRequestError(f"tier must be dram or ssd, not {tier!r}")
        drop, dry_run = bool(h.get("drop")), bool(h.get("dry_run"))
        candidates = self._evict_candidates(tier, h)
        budget = h.get("bytes")
        now = time.monotonic()
        evicted, offloading, skipped = [], [], []
        freed = 0
        for meta, replica in candidates:
            if budget is not None and freed >= int(budget):
                break
            node = self.nodes.get(replica.node)
            last_copy = not meta.has_other_copy(replica.node, tier)
            if last_copy and not drop:
                if tier == DRAM and node is not None and not self.policy.dram_only:
                    offloading.append(meta.key)
                    if not dry_run:
                        node.evict_after_offload.add(meta.key)
                        self._queue_offload(node, [meta.key], urgent=True)
                    freed += meta.size
                else:
                    skipped.append(meta.key)
                continue
            evicted.append(meta.key)
            freed += meta.size
            if not dry_run:
                self.metrics.evictions.labels(tier=tier).inc()
                self._drop_when_unleased(meta.key, replica.node, tier, now)
                if last_copy:
                    self.table.remove(meta.key)
        return {"evicted": evicted, "offloading": offloading, "skipped_last_copy": skipped,
                "bytes": freed, "dry_run": dry_run}, ()

    def _evict_candidates(self, tier: str, h: dict[str, Any]):
        if h.get("keys") is not None:
            metas = [self.table.objects[k] for k in self._keys(h) if k in self.table.objects]
        elif h.get("prefix") is not None:
            metas = [m for k, m in self.table.objects.items() if k.startswith(h["prefix"])]
        else:
            metas = sorted(self.table.objects.values(), key=lambda m: m.last_access)
        out = []
        for meta in metas:
            for replica in meta.replicas:
                if replica.tier == tier and replica.state == "complete":
                    out.append((meta, replica))
        return out

    async def op_recover(self, conn: FramedSocket, h: dict[str, Any]):
        only = h.get("node")
        targets = [n for n in self._live_nodes() if only in (None, n.node_id)]
        if not targets:
            raise NotFoundError(f"no live node named {only!r}" if only else "no live node")
        ident = next(self._ids)
        waiter = _Waiter({(n.node_id, "") for n in targets})
        self.recoveries[ident] = waiter
        for node in targets:
            self._queue(node, {"t": "recover", "id": ident, "repair": bool(h.get("repair"))})
        try:
            with trio.move_on_after(float(h.get("timeout", 3600))):
                await waiter.event.wait()
        finally:
            del self.recoveries[ident]
        missing = sorted(n for n, _ in waiter.pending)
        return {"reports": waiter.reports, "missing": missing}, ()

    def _update_gauges(self) -> None:
        usage = self.table.usage()
        live = [n for n in self.nodes.values() if n.alive]
        self.metrics.set_tiers(usage, {
            DRAM: (sum(n.dram_used for n in live), sum(n.dram_capacity for n in live)),
            SSD: (sum(n.ssd_used for n in live), sum(n.ssd_capacity for n in live))})
        self.metrics.nodes.set(len(live))
        self.metrics.checksum_failures.set(sum(n.corrupt_reads for n in self.nodes.values()))
        self.metrics.quarantined.set(sum(n.quarantined for n in self.nodes.values()))
