"""A storage node: the data server, the master session, and the tiering workers.

- **Data server** ops: ``put`` (bytes over TCP, received straight into the DRAM
  segment), ``alloc`` / ``seal`` / ``abort`` (same-host clients copy through the mapped
  segment), ``get`` (DRAM objects are sent from the segment; SSD objects are read in one
  batch into a staging buffer and sent).
- **Master session**: register (the node re-sends everything it holds, so a restarted
  master loses nothing), then heartbeat; the replies carry tasks (offload, drop,
  promote, recover). A lost master is retried with backoff while the data server keeps
  serving reads.
- **Offloader** (:mod:`kvstored.node.offload`): batches offload tasks by the backend's
  write hint into ``batch_write``; the master hears of an SSD copy only after it is
  durable. Failed offloads are retried with backoff.
- **Supervision**: every background task runs under a :class:`~kvstored.supervisor.Supervisor`,
  so that a backend or I/O error in one is logged, counted and survived.
- **Leaving**: on shutdown (:meth:`Node.leave`) the node stops taking puts, writes its
  DRAM-only objects to SSD within ``node.shutdown_flush_timeout``, and unregisters, so
  the master drops its replicas at once instead of after ``master.node_ttl``.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

import trio

from kvstored.errors import BadRequestError, UnreachableError
from kvstored.hostid import host_id
from kvstored.master.table import DRAM, SSD
from kvstored.metrics import NodeMetrics
from kvstored.node.coalesce import Coalescer
from kvstored.node.dataserver import DataServerOps
from kvstored.node.dram import DramObject, DramTier
from kvstored.node.offload import Offloader
from kvstored.node.segment import DramSegment, sweep_stale
from kvstored.node.staging import StagingPool
from kvstored.protocol import NODE_OPS, Role
from kvstored.rpc import RpcClient, ServerLimits, Service, serve
from kvstored.sdk import RepairAction, StorageBackend
from kvstored.sdk.registry import open_backend
from kvstored.sdk.units import format_size
from kvstored.security import Credentials, make_private_dir
from kvstored.supervisor import Backoff, Supervisor, describe_keys

log = logging.getLogger(__name__)

REGISTER_CHUNK = 5000
#: SSD batch reads the node runs at once (each carries every read waiting for it).
SSD_READS_IN_FLIGHT = 4
#: How long a leaving node waits for the master to hear that it goes.
UNREGISTER_TIMEOUT = 5.0


class _Report:
    """Task outcomes waiting for the next heartbeat; filled from threads too."""

    FIELDS = ("offloaded", "offload_failed", "dropped", "promoted", "ssd_evicted", "recovered")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._data: dict[str, list[Any]] = {f: [] for f in self.FIELDS}

    def add(self, field: str, items: list[Any]) -> None:
        with self._lock:
            self._data[field].extend(items)

    def take(self) -> dict[str, list[Any]]:
        with self._lock:
            data, self._data = self._data, {f: [] for f in self.FIELDS}
        return {k: v for k, v in data.items() if v}

    def clear(self) -> None:
        self.take()


class Node(DataServerOps):
    def __init__(self, *, data_dir: str | Path, dram: int, ssd: int, backend: str,
                 backend_options: dict[str, Any] | None = None,
                 master: tuple[str, int], listen: tuple[str, int] = ("127.0.0.1", 0),
                 name: str = "", credentials: Credentials | None = None,
                 limits: ServerLimits | None = None, max_read_staging: int = 512 << 20,
                 put_timeout: float = 30.0, metrics: NodeMetrics | None = None,
                 populate: bool = True, shutdown_flush_timeout: float = 30.0) -> None:
        self.data_dir = Path(data_dir)
        self.dram_size = dram
        self.ssd_size = ssd
        self.backend_name = backend
        self.backend_options = dict(backend_options or {})
        self.master_address = master
        self.listen = listen
        self.name = name
        #: The node token (presented to the master); the client token its data server
        #: checks arrives with the master's answer to ``register``.
        self.credentials = credentials or Credentials.open()
        self.put_timeout = put_timeout
        self.populate = populate
        self.shutdown_flush_timeout = shutdown_flush_timeout
        self.metrics = metrics or NodeMetrics()
        self.supervisor = Supervisor(f"node {name}" if name else "node",
                                     self.metrics.background_errors)
        self.report = _Report()
        self.service = Service("node", NODE_OPS, credentials=self.credentials, limits=limits)
        self.service.bind(self)
        self.service.hello_extra = lambda header: self._hello_info()
        self.staging = StagingPool(max_read_staging)
        self.backend: StorageBackend | None = None
        self.dram: DramTier | None = None
        self.segment: DramSegment | None = None
        self.master: RpcClient | None = None
        self.address: tuple[str, int] | None = None
        self.heartbeat_interval = 0.2
        self._wake = trio.Event()
        self.offloader: Offloader | None = None
        self.commits: Coalescer[DramObject, bool] | None = None
        self.ssd_reads: Coalescer[tuple[str, memoryview], int] | None = None
        self._nursery: trio.Nursery | None = None
        self._quarantine_pending = False
        self.corrupt_reads = 0
        self.quarantined = 0
        self.registered = trio.Event()
        #: The master's policy.dram_only (told at registration): nothing is offloaded.
        self.dram_only = False
        #: Set by :meth:`leave`: puts are refused while the node shuts down.
        self.leaving = False
        self._session_scope = trio.CancelScope()
        self._offload_scope = trio.CancelScope()
        self._offload_stopped = trio.Event()

    # -- lifecycle ---------------------------------------------------------------------

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        ssd_dir = make_private_dir(self.data_dir) / "ssd"
        make_private_dir(ssd_dir)
        options = {"capacity": self.ssd_size, "on_evict": self._on_ssd_evict,
                   **self.backend_options}
        self.backend = await trio.to_thread.run_sync(
            lambda: open_backend(self.backend_name, ssd_dir, **options))
        swept = await trio.to_thread.run_sync(sweep_stale)
        if swept:
            log.warning("node: removed %d DRAM segments left by killed nodes: %s",
                        len(swept), ", ".join(swept))
        segment_name = "kvstored-" + hashlib.blake2b(
            str(self.data_dir.resolve()).encode(), digest_size=8).hexdigest()
        try:
            self.segment = await trio.to_thread.run_sync(
                lambda: DramSegment.create(segment_name, self.dram_size,
                                           populate=self.populate))
            self.dram = DramTier(self.segment)
            # Concurrent puts commit in one master call; concurrent SSD reads go to the
            # backend in one batch (kvstored.node.coalesce).
            self.commits = Coalescer(self._send_commit)
            self.ssd_reads = Coalescer(self._read_from_ssd, in_flight=SSD_READS_IN_FLIGHT)
            self.offloader = Offloader(
                node=self.name or "(starting)", backend=self.backend, dram=self.dram,
                report=self.report, metrics=self.metrics, supervisor=self.supervisor,
                wake=self.wake_heartbeat, on_corrupt=self.count_corrupt)
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                self.address = await nursery.start(serve, self.service, *self.listen)
                if not self.name:
                    self.name = f"{os.uname().nodename}:{self.address[1]}"
                self.supervisor.owner = f"node {self.name}"
                self.offloader.node = self.name
                log.info("node %s: data server on %s:%d, DRAM %d bytes, SSD %s at %s",
                         self.name, *self.address, self.dram_size, self.backend_name, ssd_dir)
                nursery.start_soon(self._master_session)
                nursery.start_soon(self._offload_loop)
                nursery.start_soon(self.supervisor.forever, "commit", self.commits.run)
                nursery.start_soon(self.supervisor.forever, "ssd-read", self.ssd_reads.run)
                nursery.start_soon(self.supervisor.forever, "reaper", self._reap)
                task_status.started(self.address)
        finally:
            if self.master is not None:
                self.master.close()
            with trio.CancelScope(shield=True):  # shutting down is itself cancelled
                await trio.to_thread.run_sync(self.backend.close)
            if self.segment is not None:
                self.segment.close()

    def _hello_info(self) -> dict[str, Any]:
        assert self.segment is not None
        return {"node": self.name, "host": host_id(), "segment": self.segment.name,
                "token": self.segment.token.hex(), "max_read_staging": self.staging.budget}

    # -- master session ----------------------------------------------------------------

    async def _master_session(self) -> None:
        """Stay registered with the master: connect, register, heartbeat; a lost master
        is retried with backoff (logged once, not per attempt)."""
        with self._session_scope:
            await self.supervisor.forever("master-session", self._session,
                                          backoff=Backoff(0.1, 5.0))

    async def _session(self) -> None:
        client = RpcClient(self.master_address, token=self.credentials.node, role=Role.NODE)
        try:
            hello = await client.connect()
            self.heartbeat_interval = float(hello.get("heartbeat_interval", 0.2))
            await self._register(client)
            self.master = client
            self.registered.set()
            self.supervisor.succeeded("master-session")
            await self._heartbeats(client)
        finally:
            self.master = None
            client.close()

    async def _register(self, client: RpcClient) -> None:
        assert self.dram is not None and self.segment is not None and self.address
        self.report.clear()  # a full inventory follows; older reports are moot
        caps = self.backend.capabilities
        reply = await client.call("register", info={
            "node": self.name, "address": list(self.address), "host": host_id(),
            "segment": self.segment.name, "token": self.segment.token.hex(),
            "dram_capacity": self.dram.capacity, "ssd_capacity": self.ssd_size,
            "backend": self.backend_name, "shared": caps.shared,
            "max_value_size": caps.max_value_size})
        self.dram_only = bool(reply.get("dram_only", False))
        self._adopt_client_token(reply.get("client_token"))
        inventory = [[o.key, o.size, o.checksum, DRAM, o.offset] for o in self.dram.committed()]
        inventory += await trio.to_thread.run_sync(
            lambda: [[r.key, r.size, r.checksum, SSD, -1] for r in self.backend.scan()])
        for start in range(0, len(inventory), REGISTER_CHUNK):
            reply = await client.call("register_objects", node=self.name,
                                      objects=inventory[start:start + REGISTER_CHUNK])
            for key, tier in reply["conflicts"]:
                log.warning("node %s: %r conflicts with the cluster's copy; dropping ours",
                            self.name, key)
                held = self.dram.get(key) if tier == DRAM else self.backend.stat(key)
                if held is not None:
                    ident = held.offset if tier == DRAM else held.checksum
                    await self._drop(tier, [[key, ident]], report=False)
        await client.call("register_done", node=self.name)
        log.info("node %s: registered %d objects with the master", self.name, len(inventory))

    def _adopt_client_token(self, token: Any) -> None:
        """Check clients with the token the master gave (it is the cluster's authority)."""
        if self.credentials.required and not isinstance(token, str):
            raise BadRequestError(
                f"the master at {self.master_address[0]}:{self.master_address[1]} accepts "
                "clients without a token (security.auth = none) but this node requires "
                "one; set security.auth the same on both")
        self.credentials.client = token

    async def _heartbeats(self, client: RpcClient) -> None:
        stats: dict[str, Any] = {}
        while True:
            # Figures that cannot be had this time are sent as they were last time: a
            # failing usage() must not cost the node its master session.
            with self.supervisor.guard("heartbeat-stats"):
                stats = self._stats()
            reply = await client.call("heartbeat", node=self.name, stats=stats,
                                      done=self.report.take())
            for task in reply["tasks"]:
                self._start_task(task)
            with trio.move_on_after(self.heartbeat_interval):
                await self._wake.wait()
            self._wake = trio.Event()

    def wake_heartbeat(self) -> None:
        self._wake.set()

    def _stats(self) -> dict[str, Any]:
        usage = self.backend.usage()
        self.metrics.dram_used.set(self.dram.used)
        self.metrics.ssd_used.set(usage.physical_bytes)
        return {"dram_used": self.dram.used, "ssd_used": usage.physical_bytes,
                "ssd_objects": usage.objects, "corrupt_reads": self.corrupt_reads,
                "quarantined": self.quarantined, "offload_problem": self.offloader.problem}

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
            reply = await self._master_call(
                "commit", node=self.name,
                objects=[[o.key, o.size, o.checksum, o.offset] for o in objects])
        except BaseException:
            for obj in objects:
                self.dram.free(obj.key, obj.offset)
            raise
        for obj, ok in zip(objects, reply["results"]):
            if ok:
                self.dram.commit(obj)
            else:
                self.dram.free(obj.key, obj.offset)
        return reply["results"]

    async def _read_from_ssd(self, items: list[tuple[str, memoryview]]) -> list[int]:
        """One backend batch read (on a worker thread) for the SSD reads of every
        connection that are waiting."""
        started = time.perf_counter()
        results = await trio.to_thread.run_sync(
            self.backend.batch_read, [k for k, _ in items], [v for _, v in items])
        self.metrics.io_seconds.labels(op="load").observe(time.perf_counter() - started)
        return results

    async def _master_call(self, op: str, **args: Any) -> dict[str, Any]:
        if self.master is None:
            raise UnreachableError("this node has lost its master; retry shortly")
        return await self.master.call(op, **args)

    # -- tasks -------------------------------------------------------------------------

    def _start_task(self, task: dict[str, Any]) -> None:
        kind = task.get("t")
        spawn = self.supervisor.spawn
        if kind == "offload":
            self.offloader.request(list(task["keys"]), urgent=bool(task.get("urgent")))
        elif kind == "drop":
            # Retried: a drop that never happens leaves the master pointing at a removed
            # object's bytes until the node re-registers.
            spawn(self._nursery, "drop", self._drop, task["tier"], task["items"],
                  subject=describe_keys([k for k, _ in task["items"]]), attempts=5)
        elif kind == "promote":
            spawn(self._nursery, "promote", self._promote, task["keys"],
                  subject=describe_keys(task["keys"]))
        elif kind == "recover":
            ident = task["id"]
            spawn(self._nursery, "recover", self._recover, ident, bool(task.get("repair")),
                  on_error=lambda exc: self._recover_failed(ident, exc))
        else:
            log.warning("node %s: ignoring unknown task %r", self.name, kind)

    async def _drop(self, tier: str, items: list[list[Any]], report: bool = True) -> None:
        """Drop versions of keys: ``items`` are ``[key, offset]`` (DRAM) or ``[key,
        checksum]`` (SSD), so that a drop meant for a removed object never takes a newer
        one written under the same key."""
        if tier == DRAM:
            done = [[k, DRAM, off] for k, off in items if self.dram.free(k, off)]
        else:
            def delete() -> list[list[Any]]:
                doomed = [(k, c) for k, c in items
                          if (r := self.backend.stat(k)) is not None and r.checksum == c]
                self.backend.batch_delete([k for k, _ in doomed])
                return [[k, SSD, c] for k, c in doomed]
            done = await trio.to_thread.run_sync(delete)
        if report:
            # Versions already gone count as dropped too: the master only needs to stop
            # pointing at them.
            gone = {(k, i) for k, _, i in done}
            self.report.add("dropped", done + [[k, tier, i] for k, i in items
                                               if (k, i) not in gone])

    async def _offload_loop(self) -> None:
        try:
            with self._offload_scope:
                await self.supervisor.forever("offload", self.offloader.step,
                                              backoff=Backoff(0.5, 30.0))
        finally:
            self._offload_stopped.set()

    async def _promote(self, keys: list[str]) -> None:
        placed = []
        for key in keys:
            record = self.backend.stat(key)
            if record is None or self.dram.allocate(key, record.size, record.checksum,
                                                    self.put_timeout) is None:
                continue
            placed.append(self.dram.being_written(key))
        if not placed:
            return
        promoted = []
        try:
            results = await trio.to_thread.run_sync(
                self.backend.batch_read, [o.key for o in placed],
                [self.dram.view(o) for o in placed])
            for obj, got in zip(placed, results):
                if got == obj.size:
                    self.dram.commit(obj)
                    promoted.append([obj.key, obj.offset, obj.checksum])
        finally:
            for obj in placed:  # whatever did not make it (or the read raised)
                if not obj.committed:
                    self.dram.free(obj.key, obj.offset)
        self.report.add("promoted", promoted)
        self.wake_heartbeat()

    async def _recover(self, ident: int, repair: bool) -> None:
        def work() -> dict[str, Any]:
            report = self.backend.check(repair=repair)
            return {"id": ident, "repaired": report.repaired,
                    "records_checked": report.records_checked,
                    "problems": [p.as_dict() for p in report.problems]}
        result = await trio.to_thread.run_sync(work)
        self._recovered(result)

    def _recover_failed(self, ident: int, exc: Exception) -> None:
        """A recovery that raised still answers the master, so `kvstore recover` reports
        the error instead of waiting for its timeout."""
        self.report.add("recovered", [{
            "id": ident, "repaired": False, "records_checked": 0,
            "problems": [{"kind": "check-failed", "key": None, "path": self.backend.path,
                          "detail": f"the check could not run: {type(exc).__name__}: "
                                    f"{exc}; see the node's log, then run it again",
                          "action": None}]}])
        self.wake_heartbeat()

    def _recovered(self, result: dict[str, Any]) -> None:
        fixed = [p for p in result["problems"] if p["action"]]
        quarantined = sum(1 for p in fixed if p["action"] == RepairAction.QUARANTINED.value)
        self.quarantined += quarantined
        self.metrics.quarantined.inc(quarantined)
        lost = [p["key"] for p in fixed if p["key"] and not self.backend.contains(p["key"])]
        self.report.add("dropped", [[k, SSD, None] for k in lost])
        self.report.add("recovered", [result])
        self.wake_heartbeat()

    def _on_ssd_evict(self, keys: list[str]) -> None:
        # Runs on the backend's thread before the space is reused. The master learns
        # at the next heartbeat (woken now); until then a lookup may still send a client
        # here, which then misses cleanly: the backend never serves reused space.
        self.report.add("ssd_evicted", list(keys))

    async def _reap(self) -> None:
        await trio.sleep(1.0)
        stale = self.dram.expire_uncommitted(time.monotonic())
        if stale:
            log.info("node %s: reclaimed %d abandoned puts", self.name, len(stale))

    def _schedule_quarantine(self) -> None:
        if self._quarantine_pending:
            return
        self._quarantine_pending = True

        async def run() -> None:
            try:
                await self._recover(0, True)
            finally:
                self._quarantine_pending = False

        self.supervisor.spawn(self._nursery, "quarantine", run)

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
                    await self.master.call("leaving", node=self.name)
        self._offload_scope.cancel()
        if self.offloader is not None:
            # A batch being written finishes first: the flush must not write the same
            # keys beside it.
            await self._offload_stopped.wait()
            await self._flush_for_shutdown()
        await self._unregister()

    async def _flush_for_shutdown(self) -> None:
        with self.supervisor.guard("shutdown-flush"):
            pending = len(await trio.to_thread.run_sync(self.offloader.not_on_ssd))
            timeout = self.shutdown_flush_timeout
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
                    await master.call("unregister", node=self.name)
                    log.info("node %s: unregistered from the master", self.name)
        # No checkpoint since the call returned: the next heartbeat cannot slip in.
        self._session_scope.cancel()
