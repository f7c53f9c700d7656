"""A node without data, for ``kvstore bench scale --metadata-only``: it registers an
inventory of object metadata with a real master through the ops and the batches a
recovering node uses, and then heartbeats as a node does, so that the master holds, looks
up and keeps alive millions of objects whose values were never written anywhere.

What the master does with them is what it does with a real node's inventory: the same
``register``, ``register_objects`` (chunks of the node's ``REGISTER_CHUNK``) and
``register_done`` handlers, the same table. What is not real: the objects' bytes (a
lookup names a data server no one serves, so nothing may get them), and the node's side
of a recovery (its backend's scan). The node runs its trio loop in a thread of the
benchmark, whose other threads call :meth:`InventoryNode.register`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import trio

from kvstored.bench import BenchError
from kvstored.node.service import send_inventory
from kvstored.protocol import Role, Tier, ops
from kvstored.protocol.master_api import (
    Endpoint,
    HeartbeatRequest,
    NodeContact,
    NodeStats,
    RegisterObjectsReply,
    RegisterObjectsRequest,
    RegisterRequest,
)
from kvstored.rpc import RpcClient

#: The data server the inventory names: the discard port, which nothing here serves.
NO_DATA_SERVER = Endpoint("127.0.0.1", 9)


class InventoryNode:
    """See the module docstring. ``key_of(i)`` names the i-th object."""

    def __init__(self, master: tuple[str, int], node_token: str, name: str,
                 key_of: Callable[[int], str]) -> None:
        self.master = master
        self.name = name
        self.key_of = key_of
        self._client = RpcClient(master, token=node_token, role=Role.NODE, timeout=600)
        self._objects = 0
        self._registered = False
        self._interval = 0.2
        self._ready = threading.Event()
        self._failure: BaseException | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop: trio.Event | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self._ready.wait(60)
        if self._token is None:
            raise BenchError(f"the inventory node could not reach the master: "
                             f"{self._failure}")

    def _run(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as exc:  # reported by the next call from the benchmark
            self._failure = exc
            self._ready.set()

    async def _main(self) -> None:
        hello = await self._client.connect()
        self._interval = hello.heartbeat_interval or 0.2
        self._token = trio.lowlevel.current_trio_token()
        self._stop = trio.Event()
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._heartbeats)
                self._ready.set()
                await self._stop.wait()
                nursery.cancel_scope.cancel()
        finally:
            self._client.close()

    async def _heartbeats(self) -> None:
        while True:
            if self._registered:
                stats = NodeStats(dram_used=0, ssd_used=0, ssd_objects=self._objects,
                                  corrupt_reads=0, quarantined=0)
                # Its tasks (none are expected: no DRAM, nothing to offload) are not run.
                await self._client.call(ops.HEARTBEAT, HeartbeatRequest(self.name, stats))
            await trio.sleep(self._interval)

    def register(self, count: int, size: int, checksum: int = 0) -> float:
        """Register objects ``0..count-1`` (``size`` bytes, SSD) as a node that (re)starts
        does: everything the master held of this node before is dropped first. Returns
        the seconds from the ``register`` call to the end of ``register_done``."""
        if self._failure is not None or self._token is None:
            raise BenchError(f"the inventory node stopped: {self._failure}")
        return trio.from_thread.run(self._register, count, size, checksum,
                                    trio_token=self._token)

    async def _register(self, count: int, size: int, checksum: int) -> float:
        client = self._client
        started = time.perf_counter()
        self._registered = False
        contact = NodeContact(NO_DATA_SERVER, host_id="bench-scale-inventory",
                              segment="", segment_token="")
        await client.call(ops.REGISTER, RegisterRequest(
            node=self.name, contact=contact, dram_capacity=0, ssd_capacity=1 << 50,
            backend="none", objects=count))

        def chunk(start: int, stop: int) -> RegisterObjectsRequest:
            n = stop - start
            return RegisterObjectsRequest(self.name, [self.key_of(i) for i in range(start, stop)],
                                          [size] * n, [checksum] * n, [Tier.SSD] * n, [-1] * n)

        async def sent(stop: int, conflicts: RegisterObjectsReply) -> None:
            if conflicts.keys:
                raise BenchError(f"the master refused {len(conflicts.keys)} objects of the "
                                 f"inventory, from {conflicts.keys[0]!r}")

        await send_inventory(client, self.name, count, chunk, sent)
        self._objects = count
        self._registered = True
        return time.perf_counter() - started

    def close(self) -> None:
        if self._token is not None and self._stop is not None and self._thread.is_alive():
            trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
        self._thread.join(30)
