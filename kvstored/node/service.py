"""A storage node: its tiers, its data server, its master session, and leaving.

- :func:`open_node` opens the SSD tier (the backend recovers as it opens) and creates the
  DRAM segment; the :class:`Node` it yields owns them until the block ends.
- **Data server** (:mod:`kvstored.node.dataserver`): puts, gets, same-host alloc/seal.
- **Master session**: register (the node re-sends everything it holds, so a restarted
  master loses nothing), then heartbeat; the replies carry tasks
  (:mod:`kvstored.node.tasks`). A lost master is retried with backoff while the data
  server keeps serving reads.
- **Offloader** (:mod:`kvstored.node.offload`): batches offload tasks by the backend's
  write hint into ``batch_write``; the master hears of an SSD copy only after it is
  durable. Failed offloads are retried with backoff.
- **Supervision**: every background task runs under a :class:`~kvstored.supervisor.Supervisor`,
  so that a backend or I/O error in one is logged, counted and survived.
- **Leaving**: on shutdown (:meth:`Node.leave`) the node stops taking puts, writes its
  DRAM-only objects to SSD within ``shutdown_flush_timeout``, and unregisters, so the
  master drops its replicas at once instead of after ``master.node_ttl``.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from kvstored.errors import BadRequestError, UnreachableError
from kvstored.hostid import host_id
from kvstored.metrics import NodeMetrics
from kvstored.node.coalesce import Coalescer
from kvstored.node.dataserver import DataServer
from kvstored.node.dram import DramObject, DramTier
from kvstored.node.offload import Offloader
from kvstored.node.report import Integrity, Outcomes
from kvstored.node.ssdreads import SsdReads
from kvstored.node.staging import StagingPool
from kvstored.node.startup import StartupProgress, StartupStep
from kvstored.node.tasks import TaskRunner
from kvstored.protocol import NODE_OPS, HelloReply, Role, Tier, ops
from kvstored.protocol.master_api import (
    CommitRequest,
    Endpoint,
    HeartbeatRequest,
    NodeContact,
    NodeRequest,
    NodeStats,
    RegisterObjectsReply,
    RegisterObjectsRequest,
    RegisterRequest,
)
from kvstored.rpc import RpcClient, ServerLimits, Service, serve
from kvstored.sdk import StorageBackend
from kvstored.sdk.registry import open_backend
from kvstored.sdk.units import format_size
from kvstored.security import Credentials, make_private_dir
from kvstored.shm import DramSegment, sweep_stale
from kvstored.supervisor import Backoff, Supervisor

log = logging.getLogger(__name__)

#: Objects per register_objects call of an inventory.
REGISTER_CHUNK = 5000
#: The most distinct keys served to get_held that one heartbeat reports (for recency, a
#: hint: the rest go unreported). Keys are up to 1 KiB, and a heartbeat's header must
#: stay well within the master's frame limit.
MAX_HELD_READS = 2048
#: SSD batch reads the node runs at once (each carries every read waiting for it).
SSD_READS_IN_FLIGHT = 4
#: How long a leaving node waits for the master to hear that it goes.
UNREGISTER_TIMEOUT = 5.0


async def send_inventory(client: RpcClient, node: str, count: int,
                         chunk: Callable[[int, int], RegisterObjectsRequest],
                         sent: Callable[[int, RegisterObjectsReply], Awaitable[None]]) -> None:
    """The registration of ``node``'s ``count`` objects after its ``register``: one
    register_objects call a REGISTER_CHUNK (``chunk(start, stop)`` builds it), each
    followed by ``sent(stop, reply)`` (the reply names the keys the master refused), and
    then register_done."""
    for start in range(0, count, REGISTER_CHUNK):
        stop = min(count, start + REGISTER_CHUNK)
        await sent(stop, await client.call(ops.REGISTER_OBJECTS, chunk(start, stop)))
    await client.call(ops.REGISTER_DONE, NodeRequest(node))


@dataclass(frozen=True)
class NodeConfig:
    """What a node is told (the ``node.*`` settings, and the master's put timeout)."""

    data_dir: Path
    dram: int
    ssd: int
    backend: str
    master: tuple[str, int]
    backend_options: dict[str, Any] = field(default_factory=dict)
    listen: tuple[str, int] = ("127.0.0.1", 0)
    #: "": the host name and the data server's port.
    name: str = ""
    max_read_staging: int = 512 << 20
    put_timeout: float = 30.0
    #: Pre-fault the DRAM segment (slow to create, fast to use).
    populate: bool = True
    shutdown_flush_timeout: float = 30.0


@asynccontextmanager
async def open_node(config: NodeConfig, *, credentials: Credentials | None = None,
                    limits: ServerLimits | None = None,
                    metrics: NodeMetrics | None = None) -> AsyncIterator[Node]:
    """Open the node's SSD tier and create its DRAM segment; close both afterwards."""
    ssd_dir = make_private_dir(Path(config.data_dir)) / "ssd"
    make_private_dir(ssd_dir)
    outcomes = Outcomes()
    # Runs on the backend's thread before the space is reused. The master learns at the
    # next heartbeat; until then a lookup may still send a client here, which then
    # misses cleanly: the backend never serves reused space.
    options = {"capacity": config.ssd, "on_evict": outcomes.ssd_evicted,
               **config.backend_options}
    startup = StartupProgress()
    who = functools.partial(_who, config.name, Path(config.data_dir))
    async with startup.logged(StartupStep.RECOVERING_SSD, log, who):
        backend = await trio.to_thread.run_sync(
            lambda: open_backend(config.backend, ssd_dir, progress=startup.update, **options))
    try:
        swept = await trio.to_thread.run_sync(sweep_stale)
        if swept:
            log.warning("node: removed %d DRAM segments left by killed nodes: %s",
                        len(swept), ", ".join(swept))
        segment_name = "kvstored-" + hashlib.blake2b(
            str(Path(config.data_dir).resolve()).encode(), digest_size=8).hexdigest()
        segment = await trio.to_thread.run_sync(
            lambda: DramSegment.create(segment_name, config.dram, populate=config.populate))
        node = None
        try:
            node = Node(config, backend, segment, outcomes, credentials=credentials,
                        limits=limits, metrics=metrics, startup=startup)
            if config.populate:  # as the segment: slow to create, fast to use
                await trio.to_thread.run_sync(node.staging.prepare)
            yield node
        finally:
            if node is not None:
                node.dataserver.regions.close()
            segment.close()
    finally:
        with trio.CancelScope(shield=True):  # shutting down is itself cancelled
            await trio.to_thread.run_sync(backend.close)


def _who(name: str, data_dir: Path) -> str:
    """How log lines name a node (its name is known once it serves)."""
    return f"node {name}" if name else f"node on {data_dir}"


class Node:
    """A node with its tiers open (see :func:`open_node`); :meth:`run` serves it."""

    def __init__(self, config: NodeConfig, backend: StorageBackend, segment: DramSegment,
                 outcomes: Outcomes, *, credentials: Credentials | None = None,
                 limits: ServerLimits | None = None, metrics: NodeMetrics | None = None,
                 startup: StartupProgress | None = None) -> None:
        self.config = config
        self.name = config.name
        self.backend = backend
        self.segment = segment
        self.dram = DramTier(segment)
        self.outcomes = outcomes
        #: The node token (presented to the master); the client token its data server
        #: checks arrives with the master's answer to ``register``.
        self.credentials = credentials or Credentials.open()
        self.metrics = metrics or NodeMetrics()
        self.supervisor = Supervisor(f"node {self.name}" if self.name else "node",
                                     self.metrics.background_errors)
        self.integrity = Integrity(self.name, self.metrics)
        self.staging = StagingPool(config.max_read_staging)
        self.heartbeat_interval = 0.2
        self._wake = trio.Event()
        # Concurrent puts commit in one master call (kvstored.node.coalesce); concurrent
        # SSD reads go to the backend in one submission (kvstored.node.ssdreads).
        self.commits: Coalescer[DramObject, bool] = Coalescer(self._send_commit)
        self.ssd_reads = SsdReads(
            backend.read_stream, in_flight=SSD_READS_IN_FLIGHT,
            observe=self.metrics.io_seconds.labels(op="load").observe)
        self.offloader = Offloader(
            node=self.name or "(starting)", backend=backend, dram=self.dram,
            outcomes=outcomes, metrics=self.metrics, supervisor=self.supervisor,
            wake=self.wake_heartbeat, on_corrupt=self.integrity.corrupt)
        self.tasks = TaskRunner(backend=backend, dram=self.dram, offloader=self.offloader,
                                outcomes=outcomes, integrity=self.integrity,
                                supervisor=self.supervisor, wake=self.wake_heartbeat,
                                put_timeout=config.put_timeout)
        self.dataserver = DataServer(
            self, dram=self.dram, segment=segment, backend=backend, staging=self.staging,
            commit=self.commits.submit, ssd_reads=self.ssd_reads,
            outcomes=outcomes, integrity=self.integrity, metrics=self.metrics,
            put_timeout=config.put_timeout)
        self.service = Service("node", NODE_OPS, self.dataserver.bindings(),
                               credentials=self.credentials, limits=limits,
                               hello=self._hello)
        self.master: RpcClient | None = None
        self.address: tuple[str, int] | None = None
        self.registered = trio.Event()
        #: What a starting node is doing, for its log (kvstored.node.startup).
        self.startup = startup or StartupProgress()
        #: The master's policy.dram_only (told at registration): nothing is offloaded.
        self.dram_only = False
        #: Set by :meth:`leave`: puts are refused while the node shuts down.
        self.leaving = False
        #: Until when (time.monotonic()) get_held may be served: the master's permit,
        #: renewed by each heartbeat it answers (see RegisterReply.direct_permit).
        self.held_until = 0.0
        self._direct_permit = 0.0
        #: Keys served to get_held since the last heartbeat (bounded: recency is a hint).
        self._held_reads: dict[str, None] = {}
        self._session_scope = trio.CancelScope()
        self._offload_scope = trio.CancelScope()
        self._offload_stopped = trio.Event()

    # -- lifecycle ---------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[tuple[str, int]]
                  = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled; reports the data server's address."""
        try:
            async with trio.open_nursery() as nursery:
                self.tasks.nursery = nursery
                self.address = address = await nursery.start(serve, self.service,
                                                             *self.config.listen)
                self._named(self.name or f"{os.uname().nodename}:{address[1]}")
                log.info("node %s: data server on %s:%d, DRAM %d bytes, SSD %s at %s",
                         self.name, *address, self.config.dram, self.config.backend,
                         self.backend.path)
                nursery.start_soon(self._master_session)
                nursery.start_soon(self._offload_loop)
                nursery.start_soon(self.supervisor.forever, "commit", self.commits.run)
                nursery.start_soon(self.supervisor.forever, "ssd-read", self.ssd_reads.run)
                nursery.start_soon(self.supervisor.forever, "reaper", self.reap)
                task_status.started(address)
        finally:
            if self.master is not None:
                self.master.close()

    def _who(self) -> str:
        return _who(self.name, self.config.data_dir)

    def _named(self, name: str) -> None:
        self.name = self.offloader.node = self.integrity.node = name
        self.supervisor.owner = f"node {name}"

    def _hello(self, role: Role) -> HelloReply:
        return HelloReply(service="node", role=role, max_read_staging=self.staging.budget)

    def contact(self) -> NodeContact:
        """How clients reach this node."""
        assert self.address is not None, "not serving yet"
        return NodeContact(Endpoint(*self.address), host_id(), self.segment.name,
                           self.segment.token.hex())

    # -- master session ----------------------------------------------------------------

    async def _master_session(self) -> None:
        """Stay registered with the master: connect, register, heartbeat; a lost master
        is retried with backoff (logged once, not per attempt)."""
        with self._session_scope:
            await self.supervisor.forever("master-session", self._session,
                                          backoff=Backoff(0.1, 5.0))

    async def _session(self) -> None:
        client = RpcClient(self.config.master, token=self.credentials.node, role=Role.NODE)
        try:
            hello = await client.connect()
            self.heartbeat_interval = hello.heartbeat_interval or 0.2
            await self._register(client)
            self.master = client
            self.registered.set()
            self.supervisor.succeeded("master-session")
            await self._heartbeats(client)
        finally:
            self.held_until = 0.0  # the master that granted it may be gone
            self.master = None
            client.close()

    async def _register(self, client: RpcClient) -> None:
        self.outcomes.clear()  # a full inventory follows; older reports are moot
        caps = self.backend.capabilities
        inventory = [(o.key, o.size, o.checksum, Tier.DRAM, o.offset)
                     for o in self.dram.committed()]
        # Listed before registering: the master shows the node as starting, with the
        # count of objects still to come, until register_done.
        async with self.startup.logged(StartupStep.LISTING, log, self._who):
            inventory += await trio.to_thread.run_sync(
                lambda: [(r.key, r.size, r.checksum, Tier.SSD, -1)
                         for r in self.backend.scan()])
        async with self.startup.logged(StartupStep.REGISTERING, log, self._who) as progress:
            progress.update(0, len(inventory), "objects")
            reply = await client.call(ops.REGISTER, RegisterRequest(
                node=self.name, contact=self.contact(), dram_capacity=self.dram.capacity,
                ssd_capacity=self.config.ssd, backend=self.config.backend,
                shared=caps.shared, max_value_size=caps.max_value_size,
                objects=len(inventory)))
            self.dram_only = reply.dram_only
            self._adopt_client_token(reply.client_token)

            def chunk(start: int, stop: int) -> RegisterObjectsRequest:
                keys, sizes, checksums, tiers, offsets = (
                    list(column) for column in zip(*inventory[start:stop]))
                return RegisterObjectsRequest(self.name, keys, sizes, checksums, tiers,
                                              offsets)

            async def sent(stop: int, conflicts: RegisterObjectsReply) -> None:
                progress.update(stop, len(inventory), "objects")
                for key, tier in zip(conflicts.keys, conflicts.tiers):
                    await self._drop_conflict(key, tier)

            await send_inventory(client, self.name, len(inventory), chunk, sent)
        # This master knows nothing of the locations clients cached from an earlier
        # session (it may be a new one, or one that declared this node dead and let
        # removes through): nothing put before now is served without a lookup.
        self.dram.revoke_all()
        self._direct_permit = reply.direct_permit
        log.info("node %s: registered %d objects with the master", self.name, len(inventory))

    async def _drop_conflict(self, key: str, tier: Tier) -> None:
        log.warning("node %s: %r conflicts with the cluster's copy; dropping ours",
                    self.name, key)
        if tier is Tier.DRAM:
            obj = self.dram.get(key)
            version = None if obj is None else obj.offset
        else:
            record = self.backend.stat(key)
            version = None if record is None else record.checksum
        if version is not None:
            await self.tasks.drop(tier, [key], [version], report=False)

    def _adopt_client_token(self, token: str | None) -> None:
        """Check clients with the token the master gave (it is the cluster's authority)."""
        if self.credentials.required and token is None:
            master = self.config.master
            raise BadRequestError(
                f"the master at {master[0]}:{master[1]} accepts clients without a token "
                "(security.auth = none) but this node requires one; set security.auth the "
                "same on both")
        self.credentials.client = token

    async def _heartbeats(self, client: RpcClient) -> None:
        stats: NodeStats | None = None
        while True:
            # Figures that cannot be had this time are sent as they were last time: a
            # failing usage() must not cost the node its master session.
            with self.supervisor.guard("heartbeat-stats"):
                stats = self._stats()
            sent = time.monotonic()
            served, self._held_reads = list(self._held_reads), {}
            reply = await client.call(ops.HEARTBEAT, HeartbeatRequest(
                self.name, stats, self.outcomes.take(), served))
            for task in reply.tasks:
                self.tasks.start(task)  # revokes apply here, before the permit is renewed
            self.held_until = sent + self._direct_permit
            with trio.move_on_after(self.heartbeat_interval):
                await self._wake.wait()
            self._wake = trio.Event()

    def wake_heartbeat(self) -> None:
        self._wake.set()

    def may_serve_held(self) -> bool:
        return time.monotonic() < self.held_until

    def held_read(self, keys: list[str]) -> None:
        if len(self._held_reads) < MAX_HELD_READS:
            self._held_reads.update(dict.fromkeys(keys))

    def schedule_quarantine(self) -> None:
        self.tasks.schedule_quarantine()

    def _stats(self) -> NodeStats:
        usage = self.backend.usage()
        self.metrics.dram_used.set(self.dram.used)
        self.metrics.ssd_used.set(usage.physical_bytes)
        return NodeStats(dram_used=self.dram.used, ssd_used=usage.physical_bytes,
                         ssd_objects=usage.objects,
                         corrupt_reads=self.integrity.corrupt_reads,
                         quarantined=self.integrity.quarantined,
                         offload_problem=self.offloader.problem)

    def no_space_reason(self) -> str:
        """Why this node could not take a put, for the client's error message."""
        if self.leaving:
            return f"node {self.name} is shutting down"
        reason = (f"node {self.name}'s DRAM tier is full ({format_size(self.dram.used)} "
                  f"of {format_size(self.dram.capacity)} in use)")
        if self.offloader.problem:
            reason += f" and its objects cannot move to SSD: {self.offloader.problem}"
        return reason

    async def _send_commit(self, objects: list[DramObject]) -> list[bool]:
        """Commit received, checked objects at the master and apply its answer to the
        DRAM tier here, so that a put whose client left meanwhile leaves nothing half
        done: each is committed, or freed if the master refused it (the key exists) or
        the call failed."""
        try:
            if self.master is None:
                raise UnreachableError("this node has lost its master; retry shortly")
            reply = await self.master.call(ops.COMMIT, CommitRequest(
                self.name, [o.key for o in objects], [o.size for o in objects],
                [o.checksum for o in objects], [o.offset for o in objects]))
        except BaseException:
            for obj in objects:
                self.dram.free(obj.key, obj.offset)
            raise
        for obj, ok in zip(objects, reply.results):
            if ok:
                self.dram.commit(obj, held=True)
            else:
                self.dram.free(obj.key, obj.offset)
        return reply.results

    # -- background --------------------------------------------------------------------

    async def _offload_loop(self) -> None:
        try:
            with self._offload_scope:
                await self.supervisor.forever("offload", self.offloader.step,
                                              backoff=Backoff(0.5, 30.0))
        finally:
            self._offload_stopped.set()

    async def reap(self) -> None:
        """One pass of the reaper: reclaim puts whose writer never sealed them."""
        await trio.sleep(1.0)
        stale = self.dram.expire_uncommitted(time.monotonic())
        if stale:
            log.info("node %s: reclaimed %d abandoned puts", self.name, len(stale))

    # -- leaving -----------------------------------------------------------------------

    async def leave(self) -> None:
        """Shut down without losing acknowledged objects or failing readers: stop taking
        puts, write every DRAM-only object to SSD within ``shutdown_flush_timeout``, say
        how many were written and how many had to be dropped, and unregister from the
        master so that it drops this node's replicas at once. Reads are served
        throughout; the caller cancels the node afterwards."""
        self.leaving = True
        if self.master is not None:
            with trio.move_on_after(UNREGISTER_TIMEOUT):
                with self.supervisor.guard("leave"):
                    await self.master.call(ops.LEAVING, NodeRequest(self.name))
        self._offload_scope.cancel()
        if self.address is not None:
            # A batch being written finishes first: the flush must not write the same
            # keys beside it.
            await self._offload_stopped.wait()
            await self._flush_for_shutdown()
        await self._unregister()

    async def _flush_for_shutdown(self) -> None:
        with self.supervisor.guard("shutdown-flush"):
            pending = len(await trio.to_thread.run_sync(self.offloader.not_on_ssd))
            timeout = self.config.shutdown_flush_timeout
            if not pending:
                log.info("node %s: shutting down: every DRAM object has an SSD copy",
                         self.name)
                return
            if self.dram_only:
                log.warning("node %s: shutting down: policy.dram_only is set, so %d "
                            "DRAM-only objects are dropped", self.name, pending)
                return
            if timeout <= 0:
                log.warning("node %s: shutting down: node.shutdown_flush_timeout is 0, so "
                            "%d DRAM-only objects are dropped", self.name, pending)
                return
            log.info("node %s: shutting down: writing %d DRAM-only objects to SSD "
                     "(at most %.0fs)", self.name, pending, timeout)
            started = time.monotonic()
            with trio.move_on_after(timeout) as scope:
                await self.offloader.flush_all()
            left = len(await trio.to_thread.run_sync(self.offloader.not_on_ssd))
            self.metrics.shutdown_flushed.inc(max(0, pending - left))
            why = ""
            if left and scope.cancelled_caught:
                why = (f" (node.shutdown_flush_timeout={timeout:g}s ran out; raise it to "
                       "keep more)")
            elif left:
                why = " (their writes failed: see above)"
            log.log(logging.WARNING if left else logging.INFO,
                    "node %s: shutdown flush: %d DRAM-only objects written to SSD in %.1fs, "
                    "%d dropped%s", self.name, max(0, pending - left),
                    time.monotonic() - started, left, why)

    async def _unregister(self) -> None:
        """Tell the master this node is gone, over the master session (the connection
        the master knows this node by), then end that session so that it does not
        register the node again. Best effort: a master that cannot be told drops the
        node after master.node_ttl anyway."""
        master = self.master
        if master is not None:
            with trio.move_on_after(UNREGISTER_TIMEOUT):
                with self.supervisor.guard("leave"):
                    await master.call(ops.UNREGISTER, NodeRequest(self.name))
                    log.info("node %s: unregistered from the master", self.name)
        # No checkpoint since the call returned: the next heartbeat cannot slip in.
        self._session_scope.cancel()
