"""A storage node: the data server, the master session, and the tiering workers.

- **Data server** ops: ``put`` (bytes over TCP, received straight into the DRAM
  segment), ``alloc`` / ``seal`` / ``abort`` (same-host clients copy through the mapped
  segment), ``get`` (DRAM objects are sent from the segment; SSD objects are read in one
  batch into a staging buffer and sent).
- **Master session**: register (the node re-sends everything it holds, so a restarted
  master loses nothing), then heartbeat; the replies carry tasks (offload, drop,
  promote, recover). A lost master is retried with backoff while the data server keeps
  serving reads.
- **Offloader**: batches offload tasks by the backend's write hint (bytes, keys, age)
  into ``batch_write``; the master hears of an SSD copy only after it is durable.
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

from kvstored.backends import open_backend
from kvstored.errors import BadRequestError, StoreError, UnreachableError
from kvstored.hostid import host_id
from kvstored.master.table import DRAM, SSD
from kvstored.metrics import NodeMetrics
from kvstored.node.dataserver import DataServerOps
from kvstored.node.dram import DramTier
from kvstored.node.segment import DramSegment, sweep_stale
from kvstored.node.staging import StagingPool
from kvstored.protocol import NODE_OPS, Role
from kvstored.rpc import RpcClient, ServerLimits, Service, serve
from kvstored.sdk import StorageBackend, WriteOutcome
from kvstored.security import Credentials, make_private_dir

log = logging.getLogger(__name__)

REGISTER_CHUNK = 5000


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
                 populate: bool = True) -> None:
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
        self.metrics = metrics or NodeMetrics()
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
        self._offload_queue: dict[str, float] = {}  # key -> time queued
        self._offload_urgent = False
        self._offload_ready = trio.Event()
        self._nursery: trio.Nursery | None = None
        self._quarantine_pending = False
        self.corrupt_reads = 0
        self.quarantined = 0
        self.registered = trio.Event()

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
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                self.address = await nursery.start(serve, self.service, *self.listen)
                if not self.name:
                    self.name = f"{os.uname().nodename}:{self.address[1]}"
                log.info("node %s: data server on %s:%d, DRAM %d bytes, SSD %s at %s",
                         self.name, *self.address, self.dram_size, self.backend_name, ssd_dir)
                nursery.start_soon(self._master_loop)
                nursery.start_soon(self._offloader)
                nursery.start_soon(self._reaper)
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

    async def _master_loop(self) -> None:
        backoff = 0.1
        while True:
            client = RpcClient(self.master_address, token=self.credentials.node,
                               role=Role.NODE)
            try:
                hello = await client.connect()
                self.heartbeat_interval = float(hello.get("heartbeat_interval", 0.2))
                await self._register(client)
                self.master = client
                self.registered.set()
                backoff = 0.1
                await self._heartbeats(client)
            except StoreError as exc:
                log.warning("node %s: master %s:%d: %s; retrying in %.1fs", self.name,
                            *self.master_address, exc, backoff)
            finally:
                self.master = None
                client.close()
            await trio.sleep(backoff)
            backoff = min(backoff * 2, 5.0)

    async def _register(self, client: RpcClient) -> None:
        assert self.dram is not None and self.segment is not None and self.address
        self.report.clear()  # a full inventory follows; older reports are moot
        caps = self.backend.capabilities
        reply = await client.call("register", info={
            "node": self.name, "address": list(self.address), "host": host_id(),
            "segment": self.segment.name, "token": self.segment.token.hex(),
            "dram_capacity": self.dram.capacity, "ssd_capacity": self.ssd_size,
            "backend": self.backend_name, "shared": caps.shared})
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
        while True:
            reply = await client.call("heartbeat", node=self.name, stats=await self._stats(),
                                      done=self.report.take())
            for task in reply["tasks"]:
                self._start_task(task)
            with trio.move_on_after(self.heartbeat_interval):
                await self._wake.wait()
            self._wake = trio.Event()

    def wake_heartbeat(self) -> None:
        self._wake.set()

    async def _stats(self) -> dict[str, int]:
        usage = self.backend.usage()
        self.metrics.dram_used.set(self.dram.used)
        self.metrics.ssd_used.set(usage.physical_bytes)
        return {"dram_used": self.dram.used, "ssd_used": usage.physical_bytes,
                "ssd_objects": usage.objects, "corrupt_reads": self.corrupt_reads,
                "quarantined": self.quarantined}

    async def _master_call(self, op: str, **args: Any) -> dict[str, Any]:
        if self.master is None:
            raise UnreachableError("this node has lost its master; retry shortly")
        return await self.master.call(op, **args)

    # -- tasks -------------------------------------------------------------------------

    def _start_task(self, task: dict[str, Any]) -> None:
        kind = task.get("t")
        if kind == "offload":
            now = time.monotonic()
            for key in task["keys"]:
                self._offload_queue.setdefault(key, now)
            self._offload_urgent |= bool(task.get("urgent"))
            self._offload_ready.set()
        elif kind == "drop":
            self._nursery.start_soon(self._drop, task["tier"], task["items"])
        elif kind == "promote":
            self._nursery.start_soon(self._promote, task["keys"])
        elif kind == "recover":
            self._nursery.start_soon(self._recover, task["id"], bool(task.get("repair")))
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

    async def _offloader(self) -> None:
        hint = self.backend.write_batch_hint()
        while True:
            if not self._offload_queue:
                self._offload_ready = trio.Event()
                await self._offload_ready.wait()
                continue
            oldest = min(self._offload_queue.values())
            queued_bytes = sum(o.size for k in self._offload_queue
                               if (o := self.dram.get(k)) is not None)
            due = (self._offload_urgent or len(self._offload_queue) >= hint.max_keys
                   or queued_bytes >= hint.max_bytes
                   or time.monotonic() - oldest >= hint.max_age)
            if not due:
                # Wait for the age bound, or for more work (which may fill a batch).
                self._offload_ready = trio.Event()
                with trio.move_on_after(max(0.0, oldest + hint.max_age - time.monotonic())):
                    await self._offload_ready.wait()
                continue
            await self._offload_batch(hint.max_keys, hint.max_bytes)
            if not self._offload_queue:
                self._offload_urgent = False

    async def _offload_batch(self, max_keys: int, max_bytes: int) -> None:
        batch, total = [], 0
        for key in list(self._offload_queue):
            if len(batch) >= max_keys or (batch and total >= max_bytes):
                break
            del self._offload_queue[key]
            batch.append(key)
            obj = self.dram.get(key)
            total += obj.size if obj else 0
        pinned = self.dram.pin(batch)
        gone = [k for k in batch if k not in pinned]
        if gone:
            self.report.add("offload_failed", [[k, "no longer in DRAM"] for k in gone])
        if not pinned:
            return
        started = time.perf_counter()
        try:
            done, failed = await trio.to_thread.run_sync(self._write_to_ssd, pinned)
        finally:
            self.dram.unpin(pinned.values())
        self.metrics.io_seconds.labels(op="offload").observe(time.perf_counter() - started)
        self.report.add("offloaded", done)
        if failed:
            self.report.add("offload_failed", failed)
        self.wake_heartbeat()

    def _write_to_ssd(self, objects: dict[str, Any]) -> tuple[list[list[Any]], list[list[Any]]]:
        """Write pinned DRAM objects to the backend (on a worker thread). An older version
        of a key left on SSD (removed, then written again) is replaced, never reported
        as the new one's copy."""
        items = [(k, self.dram.view(o)) for k, o in objects.items()]
        results = self.backend.batch_write(items)
        stale = [r.key for r in results if r.outcome is WriteOutcome.EXISTS
                 and (rec := self.backend.stat(r.key)) is not None
                 and rec.checksum != objects[r.key].checksum]
        if stale:
            self.backend.batch_delete(stale)
            redo = {r.key: r for r in self.backend.batch_write(
                [(k, self.dram.view(objects[k])) for k in stale])}
            results = [redo.get(r.key, r) for r in results]
        done = [[r.key, objects[r.key].checksum] for r in results if r.ok]
        failed = [[r.key, str(r.error)] for r in results if r.outcome is WriteOutcome.FAILED]
        return done, failed

    async def _promote(self, keys: list[str]) -> None:
        placed = []
        for key in keys:
            record = self.backend.stat(key)
            if record is None or self.dram.allocate(key, record.size, record.checksum,
                                                    self.put_timeout) is None:
                continue
            placed.append(self.dram.get(key))
        if not placed:
            return
        results = await trio.to_thread.run_sync(
            self.backend.batch_read, [o.key for o in placed], [self.dram.view(o) for o in placed])
        promoted = []
        for obj, got in zip(placed, results):
            if got == obj.size:
                self.dram.commit(obj)
                promoted.append([obj.key, obj.offset, obj.checksum])
            else:
                self.dram.free(obj.key, obj.offset)
        self.report.add("promoted", promoted)
        self.wake_heartbeat()

    async def _recover(self, ident: int, repair: bool) -> None:
        def work() -> dict[str, Any]:
            report = self.backend.check(repair=repair)
            return {"id": ident, "repaired": report.repaired,
                    "records_checked": report.records_checked,
                    "problems": [{"kind": p.kind.value, "detail": p.detail, "key": p.key,
                                  "path": p.path, "action": p.action}
                                 for p in report.problems]}
        result = await trio.to_thread.run_sync(work)
        fixed = [p for p in result["problems"] if p["action"]]
        self.quarantined += sum(1 for p in fixed if "quarantine" in (p["action"] or ""))
        self.metrics.quarantined.inc(sum(1 for p in fixed if "quarantine" in p["action"]))
        lost = [p["key"] for p in fixed if p["key"] and not self.backend.contains(p["key"])]
        self.report.add("dropped", [[k, SSD, None] for k in lost])
        self.report.add("recovered", [result])
        self.wake_heartbeat()

    def _on_ssd_evict(self, keys: list[str]) -> None:
        # Runs on the backend's thread before the space is reused. The master learns
        # at the next heartbeat (woken now); until then a lookup may still send a client
        # here, which then misses cleanly: the backend never serves reused space.
        self.report.add("ssd_evicted", list(keys))

    async def _reaper(self) -> None:
        while True:
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

        self._nursery.start_soon(run)
