"""The master's admin ops: status, flush, evict and recover (what ``kvstore`` drives).
Mixed into :class:`kvstored.master.service.Master`."""

from __future__ import annotations

import time
from typing import Any

import trio

from kvstored.errors import BadRequestError, NotFoundError
from kvstored.master.table import DRAM, SSD, TIERS
from kvstored.master.waits import Waiter
from kvstored.rpc import FramedSocket


class AdminOps:
    """``op_*`` handlers for operators; they may wait on nodes (flush, recover)."""

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
        waiter = Waiter(set())
        for node in targets:
            keys = [m.key for m in self.table.on_node(node.node_id, DRAM)
                    if m.replica(node.node_id, SSD) is None]
            waiter.pending.update((node.node_id, k) for k in keys)
            # Named again even if queued: objects waiting for a retry go now.
            self._queue_offload(node, keys, urgent=True, again=True)
        queued = len(waiter.pending)
        if not h.get("wait") or not waiter.pending:
            return {"queued": queued, "done": not waiter.pending, "failed": []}, ()
        self.flushes.append(waiter)
        try:
            with trio.move_on_after(float(h.get("timeout", 600))):
                await waiter.event.wait()
        finally:
            self.flushes.remove(waiter)
        # Only what still fails: an attempt that failed and was then retried and
        # written is not reported.
        return {"queued": queued, "done": not waiter.pending,
                "failed": [[k, reason] for k, reason in waiter.failed.items()],
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
        waiter = Waiter({(n.node_id, "") for n in targets})
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

