"""Revoking what nodes may serve without the master: the master's one outgoing call.

A client that put or read a key remembers where it lives and its version, and asks that
node for it directly (``get_held``): no master lookup. The node serves only a DRAM copy a
client put there (see :mod:`kvstored.node.dram`). What keeps this from ever serving a
removed value is that a remove (or a removal of a prefix) does not return before every
node holding a copy of the key has been told (``revoke`` on its data server), or can no
longer be serving one:

- the call reached the node: it revoked the keys before answering;
- it did not (the node is slow, unreachable, or dead): the keys go into the node's next
  heartbeat reply as a :class:`~kvstored.protocol.master_api.RevokeTask`, which the node
  applies before it renews its permit to serve ``get_held`` with that heartbeat, and the
  remove waits until the permit of the last heartbeat answered has run out
  (``master.direct_permit``): a renewed one comes with the revoke, or with a new
  registration (which revokes everything).

A new master delays its first puts by the permit too (:meth:`Revoker.settle`): a node
may still hold a permit from the master before it.
"""

from __future__ import annotations

import logging
import time

import trio

from kvstored.errors import StoreError
from kvstored.master.cluster import Cluster
from kvstored.master.table import ObjectMeta
from kvstored.protocol import Role, ops
from kvstored.protocol.master_api import RevokeTask
from kvstored.protocol.node_api import RevokeRequest
from kvstored.rpc import RpcClient

log = logging.getLogger(__name__)

#: How long a revoke waits for a node's data server before it falls back to the heartbeat.
REVOKE_TIMEOUT = 1.0


class Revoker:
    def __init__(self, cluster: Cluster, node_token: str | None) -> None:
        self.cluster = cluster
        self.node_token = node_token
        self.started = time.monotonic()
        self._peers: dict[str, tuple[tuple[str, int], RpcClient]] = {}

    async def settle(self) -> None:
        """Wait until no node can hold a permit from an earlier master (see above)."""
        left = self.started + self.cluster.settings.direct_permit - time.monotonic()
        if left > 0:
            await trio.sleep(left)

    async def revoke(self, removed: list[ObjectMeta]) -> None:
        """Tell each node holding a copy of ``removed`` to serve none of it to get_held
        again; returns once each has, or can no longer be serving it."""
        by_node: dict[str, list[str]] = {}
        for meta in removed:
            for replica in meta.replicas:
                keys = by_node.setdefault(replica.node, [])
                if not keys or keys[-1] != meta.key:
                    keys.append(meta.key)
        if not by_node or self.cluster.settings.direct_permit <= 0:
            return
        async with trio.open_nursery() as nursery:
            for node_id, keys in by_node.items():
                nursery.start_soon(self._revoke_on, node_id, keys)

    async def _revoke_on(self, node_id: str, keys: list[str]) -> None:
        node = self.cluster.nodes.get(node_id)
        if node is None or not node.alive:
            # Gone, or silent for longer than its permit lasts: it registers anew (which
            # revokes everything) before it serves get_held again.
            return
        endpoint = node.announced.contact.endpoint
        address = (endpoint.host, endpoint.port)
        known = self._peers.get(node_id)
        if known is None or known[0] != address:
            if known is not None:
                known[1].close()
            known = self._peers[node_id] = (address, RpcClient(
                address, token=self.node_token, role=Role.NODE,
                connect_timeout=REVOKE_TIMEOUT, timeout=REVOKE_TIMEOUT))
        try:
            await known[1].call(ops.REVOKE, RevokeRequest(keys))
            return
        except StoreError as exc:
            log.warning("could not revoke %d key(s) at node %s (%s); telling it with its "
                        "next heartbeat and waiting %.1fs for its permit to run out",
                        len(keys), node_id, exc, self.cluster.settings.direct_permit)
        node.queue(RevokeTask(keys))
        # Any later heartbeat's reply carries the revoke, so the permit the node may
        # hold without it came with the last heartbeat answered, or an earlier one.
        await trio.sleep(max(
            0.0, node.last_heartbeat + self.cluster.settings.direct_permit - time.monotonic()))

    def close(self) -> None:
        for _, peer in self._peers.values():
            peer.close()
        self._peers.clear()
