"""The master's data-path ops for clients: placement of puts, lookups with leases,
existence, removal and listing. Mixed into :class:`kvstored.master.service.Master`."""

from __future__ import annotations

import time
from typing import Any

from kvstored.errors import BadRequestError, NoSpaceError, NotFoundError, UnreachableError
from kvstored.master.nodes import NodeState
from kvstored.master.policy import count_ssd_read
from kvstored.master.table import DRAM, SSD
from kvstored.master.waits import Deferred
from kvstored.rpc import FramedSocket
from kvstored.sdk.units import format_size

MAX_BATCH = 65536


class ClientOps:
    """``op_*`` handlers clients call on every put and get."""

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
        keys, sizes = self._keys(h), [int(s) for s in h["sizes"]]
        host = h.get("host")
        live = self._live_nodes()
        nodes = [n for n in live if not n.leaving]
        if not nodes:
            raise UnreachableError(
                "every storage node is shutting down; retry once one is back" if live else
                "no storage node is registered; start one with `kvstored node` (or use "
                "`kvstored up`)")
        # Every object is checked before any is reserved: a batch is refused whole.
        candidates = [self._nodes_for(nodes, key, size) for key, size in zip(keys, sizes)]
        now = time.monotonic()
        targets: list[str | None] = []
        for key, size, fits in zip(keys, sizes, candidates):
            node = self._place(fits, size, host)
            if self.table.reserve(key, node.node_id, size, now, self.put_timeout):
                node.pending_bytes += size
                targets.append(node.node_id)
            else:
                targets.append(None)
        used = {t for t in targets if t is not None}
        return {"targets": targets,
                "nodes": {n: self.nodes[n].public() for n in used}}, ()

    def _nodes_for(self, nodes: list[NodeState], key: str, size: int) -> list[NodeState]:
        """The nodes that can ever hold an object of ``size`` bytes: it must fit in their
        DRAM tier, and (unless the store is DRAM-only) in their SSD backend, or it would
        be lost the first time it is evicted. Refuses, naming the limit, if none can."""
        roomy = [n for n in nodes if n.dram_capacity >= size]
        if not roomy:
            largest = max(n.dram_capacity for n in nodes)
            raise NoSpaceError(
                f"the object is {format_size(size)}, larger than the whole DRAM tier of "
                f"every node (the largest is {format_size(largest)}); split it, or give a "
                "node more DRAM (node.dram)", key=key)
        if self.policy.dram_only:
            return roomy
        placeable = [n for n in roomy if not n.max_value_size or n.max_value_size >= size]
        if not placeable:
            best = max(roomy, key=lambda n: n.max_value_size)
            raise NoSpaceError(
                f"the object is {format_size(size)}, larger than the SSD tier takes "
                f"({format_size(best.max_value_size)}, the {best.backend} backend's "
                "max_value_size), so it could never be offloaded; split it, or raise "
                "max_value_size in [node.backend_options]", key=key)
        return placeable

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
                if meta.lease_until <= now and r.node in self.nodes:
                    # Unleased: free it now (the next heartbeat carries the drop). A full
                    # housekeeping pass per remove cost as much as the lookups did.
                    self._queue_drop(self.nodes[r.node], r.tier, [[key, ident]])
                else:
                    self.deferred.append(Deferred(meta.lease_until, r.node, r.tier, key,
                                                  ident, True))
        return {"removed": removed}, ()

    async def op_list(self, conn: FramedSocket, h: dict[str, Any]):
        """Keys in order after ``after``; with ``node`` and/or ``tier``, only those with a
        complete replica there. A filtered page examines at most 20 pages' worth of keys,
        so it may come back short (even empty) with ``more``: resume from ``after``."""
        prefix = str(h.get("prefix") or "")
        limit = min(int(h.get("limit") or 1000), 10000)
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

