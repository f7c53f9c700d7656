"""A master in this process, served on a loopback port, and peers that speak to it as a
node or a client would: over real sockets, through the real hello, role checks and
request checks, in one trio run (no subprocess).

:func:`running_master` yields a :class:`Cluster` of the master, its address and the
tokens it checks; :meth:`Cluster.node` registers a :class:`FakeNode` (a node session
driven by hand: commits, heartbeats with reports, and the tasks it gets back), and
:meth:`Cluster.client` opens a client-role :class:`~kvstored.rpc.RpcClient`.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, fields, replace
from typing import Any

import trio

from kvstored.config import MasterSettings, PolicySettings, load_config
from kvstored.master.service import Master
from kvstored.protocol import Role, Tier, ops
from kvstored.protocol.master_api import (
    CommitRequest,
    Endpoint,
    HeartbeatRequest,
    NodeContact,
    NodeReport,
    NodeRequest,
    NodeStats,
    RegisterObjectsRequest,
    RegisterRequest,
    Task,
)
from kvstored.rpc import RpcClient, ServerLimits, serve
from kvstored.security import Credentials

CLIENT_TOKEN, NODE_TOKEN = "client-token", "node-token"
#: The defaults of every setting (no file, no environment): the one copy, config.py's.
DEFAULTS = load_config(env={})


def policy(**changes: Any) -> PolicySettings:
    """The default ``policy.*`` settings, but for ``changes``."""
    return replace(DEFAULTS.policy, **changes)


def master_settings(**changes: Any) -> MasterSettings:
    """The default ``master.*`` settings, but for ``changes``."""
    return replace(DEFAULTS.master, **changes)
MiB = 1 << 20


@dataclass
class FakeNode:
    """A node's master session, driven by the test."""

    name: str
    rpc: RpcClient
    dram: int
    #: Tasks the heartbeats brought back, in order.
    tasks: list[Task] = field(default_factory=list)

    async def commit(self, *objects: tuple[str, int, int, int]) -> list[bool]:
        """Commit ``(key, size, checksum, offset)`` DRAM objects."""
        keys, sizes, checksums, offsets = (list(c) for c in zip(*objects))
        reply = await self.rpc.call(ops.COMMIT, CommitRequest(self.name, keys, sizes,
                                                              checksums, offsets))
        return reply.results

    async def heartbeat(self, done: NodeReport | None = None, *, dram_used: int = 0
                        ) -> list[Task]:
        stats = NodeStats(dram_used=dram_used, ssd_used=0, ssd_objects=0, corrupt_reads=0,
                          quarantined=0)
        reply = await self.rpc.call(ops.HEARTBEAT, HeartbeatRequest(
            self.name, stats, done or NodeReport()))
        self.tasks += reply.tasks
        return reply.tasks

    async def leaving(self) -> None:
        await self.rpc.call(ops.LEAVING, NodeRequest(self.name))

    async def unregister(self) -> int:
        return (await self.rpc.call(ops.UNREGISTER, NodeRequest(self.name))).dropped


@dataclass
class Cluster:
    master: Master
    address: tuple[str, int]
    nursery: trio.Nursery
    _peers: list[RpcClient] = field(default_factory=list)

    def rpc(self, role: Role = Role.CLIENT, token: str | None = None) -> RpcClient:
        """A connection to the master (not yet open) as ``role``."""
        default = NODE_TOKEN if role is Role.NODE else CLIENT_TOKEN
        peer = RpcClient(self.address, token=token or default, role=role, timeout=30)
        self._peers.append(peer)
        return peer

    def client(self) -> RpcClient:
        return self.rpc(Role.CLIENT)

    async def node(self, name: str, *, dram: int = 64 * MiB, max_value_size: int = 8 * MiB,
                   host_id: str = "host-a",
                   inventory: list[tuple[str, int, int, Tier, int]] = ()) -> FakeNode:
        """Register a node (with ``inventory``: ``(key, size, checksum, tier, offset)``)
        over a connection of its own."""
        rpc = self.rpc(Role.NODE)
        await rpc.call(ops.REGISTER, RegisterRequest(
            name, NodeContact(Endpoint("127.0.0.1", 1), host_id, f"seg-{name}", "00"),
            dram_capacity=dram, ssd_capacity=1 << 30, backend="bucket",
            max_value_size=max_value_size))
        if inventory:
            keys, sizes, checksums, tiers, offsets = (list(c) for c in zip(*inventory))
            await rpc.call(ops.REGISTER_OBJECTS, RegisterObjectsRequest(
                name, keys, sizes, checksums, tiers, offsets))
        await rpc.call(ops.REGISTER_DONE, NodeRequest(name))
        return FakeNode(name, rpc, dram)

    def housekeeping(self, after: float = 0.0) -> None:
        """One housekeeping pass, as if ``after`` seconds had passed."""
        self.master.cluster.housekeeping(time.monotonic() + after)

    def close(self) -> None:
        for peer in self._peers:
            peer.close()


@asynccontextmanager
async def running_master(**settings: Any) -> AsyncIterator[Cluster]:
    """A master on 127.0.0.1:0 with both tokens required; ``settings`` are ``master.*``
    settings (``lease_ttl=0.0``), ``policy`` a dict of ``policy.*`` ones, and the
    rest :class:`Master`'s own arguments."""
    # Its nodes are this test's sockets, not data servers a remove could revoke at.
    settings.setdefault("direct_permit", 0.0)
    timing = {f.name: settings.pop(f.name) for f in fields(MasterSettings)
              if f.name in settings}
    master = Master(policy=policy(**settings.pop("policy", {})),
                    settings=master_settings(**timing),
                    credentials=Credentials(True, client=CLIENT_TOKEN, node=NODE_TOKEN),
                    limits=ServerLimits(hello_timeout=10), **settings)
    async with trio.open_nursery() as nursery:
        address = await nursery.start(serve, master.service, "127.0.0.1", 0)
        cluster = Cluster(master, address, nursery)
        try:
            yield cluster
        finally:
            cluster.close()
            nursery.cancel_scope.cancel()


def run(scenario: Callable[[Cluster], Any], **settings: Any) -> None:
    """Run ``await scenario(cluster)`` against a fresh master, within 60 s."""
    async def main() -> None:
        with trio.fail_after(60):
            async with running_master(**settings) as cluster:
                await scenario(cluster)

    trio.run(main)
