"""The node's data server ops: how bytes get in and out of a node.

- ``put``: values arrive as one frame; each is received straight into its slot in the
  DRAM segment (``recv_into``), its CRC-32C checked, and the batch committed at the
  master.
- ``alloc`` / ``seal`` / ``abort``: a same-host client copies through its mapping of the
  segment; the node only allocates, then checks and commits.
- ``get``: DRAM objects are sent from the segment (pinned for the send); SSD objects are
  read in one backend submission into a reused staging buffer, each sent as soon as it
  is read and the ones before it are out (kvstored.node.ssdreads), and a trailer frame
  then says which reads failed (zeros went out for them). The client passes
  the checksums the master gave it, so a node never serves another version of a key
  (one removed and written again) in its place.
- ``register_memory`` / ``copy_in`` / ``copy_out``: a same-host client's shared-memory
  KV pool, opened by the node (see kvstored.node.regions), which then reads an object
  from it into the room an ``alloc`` made (and seals it) or writes a DRAM object to it.
- ``get_held``: a client that put or read a key before asks for it here without a master
  lookup; served only from a *held* DRAM copy of the version it names (see
  :mod:`kvstored.node.dram`), pinned for the send (so an eviction's free waits for the
  reader), or from the SSD copy of such a version that has left DRAM (streamed as a
  get's SSD items are), and only while the node's permit from its last heartbeat runs.
  The rest is answered missing, and the client asks the master.
- ``revoke``: the master removed keys; none of their copies here is held any more.
- ``report_corrupt``: a client found a DRAM copy here that fails its checksum.
- ``locate``: where a key's bytes are, for debugging.

:class:`DataServer` holds the handlers (:meth:`DataServer.bindings`); the node
(:class:`NodeControl`) owns the tiers, the commits and the master session they use.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

import trio

from kvstored.checksum import crc32c
from kvstored.errors import BadRequestError
from kvstored.metrics import NodeMetrics
from kvstored.node.dram import DramObject, DramTier
from kvstored.node.regions import Regions, extents_of, read_in, write_out
from kvstored.node.report import Integrity, Outcomes
from kvstored.node.ssdreads import SsdReads
from kvstored.node.staging import StagingPool
from kvstored.protocol import OpSpec, PutStatus, Tier, ops
from kvstored.protocol.master_api import Empty, KeysRequest
from kvstored.protocol.node_api import (
    AllocReply,
    CopyOutReply,
    DramLocation,
    GetReply,
    GetRequest,
    HeldGetRequest,
    LocateReply,
    Location,
    PutReply,
    PutRequest,
    RegionRequest,
    RegisterMemoryReply,
    RegisterMemoryRequest,
    ReportCorruptReply,
    ReportCorruptRequest,
    RevokeRequest,
    SsdLocation,
)
from kvstored.rpc import ANSWERED, Answered, Binding, FramedSocket
from kvstored.sdk import ReadStatus, StorageBackend, StoredVersion
from kvstored.shm import DramSegment

log = logging.getLogger(__name__)

#: Commits received objects at the master (all of them, or raises); per object, whether
#: the master took it.
Commit = Callable[[list[DramObject]], Awaitable[list[bool]]]


class NodeControl(Protocol):
    """What the data server asks of its node."""

    @property
    def name(self) -> str: ...

    @property
    def leaving(self) -> bool:
        """Shutting down: puts are refused."""
        ...

    def no_space_reason(self) -> str:
        """Why the node could not take a put, for the client's error message."""
        ...

    def wake_heartbeat(self) -> None: ...

    def schedule_quarantine(self) -> None:
        """A record on SSD failed its checksum: run a repairing check soon."""
        ...

    def may_serve_held(self) -> bool:
        """The master answered a heartbeat recently enough (its direct permit)."""
        ...

    def held_read(self, keys: list[str]) -> None:
        """``keys`` were served to get_held: tell the master with the next heartbeat."""
        ...


class DataServer:
    def __init__(self, node: NodeControl, *, dram: DramTier, segment: DramSegment,
                 backend: StorageBackend, staging: StagingPool, commit: Commit,
                 ssd_reads: SsdReads, outcomes: Outcomes, integrity: Integrity,
                 metrics: NodeMetrics, put_timeout: float) -> None:
        self.node = node
        self.dram = dram
        self.segment = segment
        self.backend = backend
        self.staging = staging
        self.commit = commit
        self.ssd_reads = ssd_reads
        self.outcomes = outcomes
        self.integrity = integrity
        self.metrics = metrics
        self.put_timeout = put_timeout
        self.regions = Regions()
        # Looked up once: a labels() call costs as much as the rest of a small get.
        self._served_dram = metrics.bytes_served.labels(tier=Tier.DRAM)
        self._served_ssd = metrics.bytes_served.labels(tier=Tier.SSD)

    def bindings(self) -> list[Binding]:
        return [Binding(ops.PUT, self.put), Binding(ops.ALLOC, self.alloc),
                Binding(ops.SEAL, self.seal), Binding(ops.ABORT, self.abort),
                Binding(ops.GET, self.get), Binding(ops.GET_HELD, self.get_held),
                Binding(ops.LOCATE, self.locate),
                Binding(ops.REPORT_CORRUPT, self.report_corrupt),
                Binding(ops.REGISTER_MEMORY, self.register_memory),
                Binding(ops.COPY_IN, self.copy_in), Binding(ops.COPY_OUT, self.copy_out),
                Binding(ops.REVOKE, self.revoke)]

    # -- puts ------------------------------------------------------------------------------

    def _no_space(self, results: list[PutStatus]) -> str | None:
        if PutStatus.NO_SPACE not in results:
            return None
        self.node.wake_heartbeat()
        return self.node.no_space_reason()

    async def put(self, conn: FramedSocket, request: PutRequest) -> PutReply:
        if sum(request.sizes) != conn.payload_left:
            raise BadRequestError(f"sizes add up to {sum(request.sizes)} but the payload is "
                                  f"{conn.payload_left} bytes")
        results: list[PutStatus | None] = []
        received: list[tuple[int, DramObject]] = []
        for key, size, checksum in zip(request.keys, request.sizes, request.checksums):
            if self.node.leaving or self.dram.allocate(key, size, checksum,
                                                       self.put_timeout) is None:
                # Exists: another put of this key is in flight here.
                results.append(PutStatus.EXISTS if self.dram.being_written(key) is not None
                               else PutStatus.NO_SPACE)
                await _skip(conn, size)
                continue
            obj = self.dram.being_written(key)
            assert obj is not None  # allocated just now
            view = self.dram.view(obj)
            await conn.recv_payload_into(view)
            if crc32c(view) != checksum:
                self.dram.free(key, obj.offset)
                results.append(PutStatus.CORRUPT)
                continue
            results.append(None)
            received.append((len(results) - 1, obj))
        self.metrics.bytes_received.inc(sum(request.sizes))
        done = await self._commit(received, results)
        return PutReply(done, no_space=self._no_space(done))

    async def _commit(self, received: list[tuple[int, DramObject]],
                      results: list[PutStatus | None]) -> list[PutStatus]:
        """Commit the received objects at the master (with every other connection's, in
        one call: see kvstored.node.coalesce) and fill in their results."""
        oks = await self.commit([obj for _, obj in received])
        for (i, _), ok in zip(received, oks):
            results[i] = PutStatus.OK if ok else PutStatus.EXISTS
        return [PutStatus.EXISTS if r is None else r for r in results]

    async def alloc(self, conn: FramedSocket, request: PutRequest) -> AllocReply:
        offsets = [None if self.node.leaving
                   else self.dram.allocate(k, n, c, self.put_timeout)
                   for k, n, c in zip(request.keys, request.sizes, request.checksums)]
        no_space = None
        if None in offsets:
            self.node.wake_heartbeat()
            no_space = self.node.no_space_reason()
        return AllocReply(offsets, no_space)

    async def seal(self, conn: FramedSocket, request: KeysRequest) -> PutReply:
        results: list[PutStatus | None] = []
        received: list[tuple[int, DramObject]] = []
        for key in request.keys:
            obj = self.dram.being_written(key)
            if obj is None:
                results.append(PutStatus.MISSING)
                continue
            if crc32c(self.dram.view(obj)) != obj.checksum:
                self.dram.free(key, obj.offset)
                results.append(PutStatus.CORRUPT)
                continue
            results.append(None)
            received.append((len(results) - 1, obj))
        return PutReply(await self._commit(received, results))

    # -- registered host memory ------------------------------------------------------------

    async def register_memory(self, conn: FramedSocket, request: RegisterMemoryRequest
                              ) -> RegisterMemoryReply:
        try:
            local = conn.sock.getsockname()
        except OSError:
            local = None
        region = self.regions.register(request, local=_address(local),
                                       peer=_address(conn.peer))
        return RegisterMemoryReply(region.number, region.token)

    async def copy_in(self, conn: FramedSocket, request: RegionRequest) -> PutReply:
        """``seal``, after the node read each object from the client's registered
        memory into the room ``alloc`` made. Bad extents or a gone region raise before a
        byte is read, with every room still held (the client copies and seals, or
        aborts); an object whose room is gone is left to ``seal`` to report."""
        with self.regions.using(request.region, request.token) as region:
            moves = []
            for key, extents in zip(request.keys, request.extents):
                obj = self.dram.being_written(key)
                if obj is not None:
                    moves.append((extents_of(extents, obj.size, region), self.dram.view(obj)))
            # Worker thread: a batch of pages is a large copy, the event loop goes on.
            await trio.to_thread.run_sync(
                lambda: [read_in(region, pairs, room) for pairs, room in moves])
        self.metrics.bytes_received.inc(sum(room.nbytes for _, room in moves))
        return await self.seal(conn, KeysRequest(request.keys))

    async def copy_out(self, conn: FramedSocket, request: RegionRequest) -> CopyOutReply:
        """Write each DRAM object (of the wanted version) to its extents in the client's
        registered memory; per key its size, or MISSING (not in DRAM here)."""
        wanted = request.checksums
        pinned = self.dram.pin(request.keys)
        try:
            with self.regions.using(request.region, request.token) as region:
                sizes: list[int] = []
                moves = []
                for i, key in enumerate(request.keys):
                    obj = pinned.get(key)
                    if obj is None or (wanted is not None and wanted[i] != obj.checksum):
                        sizes.append(ReadStatus.MISSING)
                        continue
                    moves.append((extents_of(request.extents[i], obj.size, region),
                                  self.dram.view(obj)))
                    sizes.append(obj.size)
                await trio.to_thread.run_sync(
                    lambda: [write_out(region, pairs, view) for pairs, view in moves])
        finally:
            self.dram.unpin(pinned.values())
        self._served_dram.inc(sum(s for s in sizes if s > 0))
        return CopyOutReply(sizes)

    async def abort(self, conn: FramedSocket, request: KeysRequest) -> Empty:
        for key in request.keys:
            obj = self.dram.being_written(key)
            if obj is not None:
                self.dram.free(key, obj.offset)
        return Empty()

    # -- bad copies and debugging ----------------------------------------------------------

    async def report_corrupt(self, conn: FramedSocket, request: ReportCorruptRequest
                             ) -> ReportCorruptReply:
        """A client read bytes of a DRAM object here that failed the object's checksum
        (a same-host writer may scribble over its mapping after its seal). The node
        checks its copy itself; a bad one is dropped, counted and reported to the master,
        so that readers fall back to another replica. Returns, per key, whether the copy
        here was bad."""
        bad = []
        for key, checksum in zip(request.keys, request.checksums):
            pinned = self.dram.pin([key])
            obj = pinned.get(key)
            try:
                corrupt = (obj is not None and obj.checksum == checksum
                           and crc32c(self.dram.view(obj)) != checksum)
            finally:
                self.dram.unpin(pinned.values())
            bad.append(corrupt)
            if corrupt and obj is not None:
                self.integrity.corrupt(key, Tier.DRAM)
                if self.dram.free(key, obj.offset):
                    self.outcomes.dropped([(key, Tier.DRAM, obj.offset)])
        if any(bad):
            self.node.wake_heartbeat()
        return ReportCorruptReply(bad)

    async def locate(self, conn: FramedSocket, request: KeysRequest) -> LocateReply:
        """Where each key's bytes are on this node: the DRAM offset and the SSD file and
        offset (for debugging, and for tests that damage records on purpose)."""
        out = []
        for key in request.keys:
            obj = self.dram.get(key)
            where = self.backend.locate(key)
            out.append(Location(
                dram=None if obj is None else DramLocation(self.segment.name, obj.offset,
                                                           obj.size),
                ssd=None if where is None else SsdLocation(
                    where.path, where.offset, where.length, where.record_offset,
                    where.device)))
        return LocateReply(out)

    # -- gets ------------------------------------------------------------------------------

    async def get(self, conn: FramedSocket, request: GetRequest) -> Answered:
        keys, wanted = request.keys, request.checksums
        pinned = self.dram.pin(keys)
        try:
            sizes: list[int] = [ReadStatus.MISSING] * len(keys)
            pieces: list[memoryview | None] = [None] * len(keys)
            ssd_wanted = []
            held = []
            for i, key in enumerate(keys):
                obj = pinned.get(key)
                if obj is not None and (wanted is None or wanted[i] == obj.checksum):
                    pieces[i] = self.dram.view(obj)
                    sizes[i] = obj.size
                    if obj.held:
                        held.append(i)
                else:
                    ssd_wanted.append(i)
            self._served_dram.inc(sum(s for s in sizes if s > 0))
            versions = self._ssd_versions(keys, ssd_wanted, wanted)
            return await self._answer_get(conn, ops.GET, keys, wanted, sizes, pieces,
                                          ssd_wanted, versions, held)
        finally:
            self.dram.unpin(pinned.values())

    async def get_held(self, conn: FramedSocket, request: HeldGetRequest) -> Answered:
        keys, checksums = request.keys, request.checksums
        if not self.node.may_serve_held():
            return await conn.answer(GetReply([ReadStatus.MISSING] * len(keys)))
        pinned = self.dram.pin_held(keys, checksums)
        try:
            sizes = [ReadStatus.MISSING if obj is None else obj.size for obj in pinned]
            pieces = [None if obj is None else self.dram.view(obj) for obj in pinned]
            self._served_dram.inc(sum(s for s in sizes if s > 0))
            # A held version that left DRAM is served from its SSD copy of that version.
            ssd_wanted = [i for i, obj in enumerate(pinned) if obj is None
                          and self.dram.held_on_ssd(keys[i], checksums[i])]
            versions: dict[str, StoredVersion] = {}
            if ssd_wanted:
                try:
                    versions = self._ssd_versions(keys, ssd_wanted, list(checksums))
                except BadRequestError:  # more than the staging takes: the lookup path
                    pass                 # reads them, and says so
            served = [keys[i] for i, obj in enumerate(pinned) if obj is not None]
            served += [keys[i] for i in ssd_wanted if keys[i] in versions]
            if served:
                self.node.held_read(served)
            return await self._answer_get(conn, ops.GET_HELD, keys, list(checksums), sizes,
                                          pieces, ssd_wanted, versions, [])
        finally:
            self.dram.unpin(obj for obj in pinned if obj is not None)

    async def _answer_get(self, conn: FramedSocket, spec: OpSpec, keys: list[str],
                          wanted: list[int | None] | None, sizes: list[int],
                          pieces: list[memoryview | None], ssd_wanted: list[int],
                          versions: dict[str, StoredVersion], held: list[int]) -> Answered:
        """Send a get's reply: ``pieces`` of DRAM, and the ``versions`` of ``ssd_wanted``
        streamed from SSD as they are read (then a trailer), if there are any."""
        need = sum(v.size for v in versions.values())
        if not need:
            return await conn.answer(GetReply(sizes, held=held),
                                     [p for p in pieces if p is not None])
        async with self.staging.lend(need) as staging:
            await self._stream_from_ssd(conn, spec, keys, ssd_wanted, wanted, versions,
                                        staging, sizes, pieces, held)
            return ANSWERED

    async def revoke(self, conn: FramedSocket, request: RevokeRequest) -> Empty:
        self.dram.revoke(request.keys)
        return Empty()

    def _ssd_versions(self, keys: list[str], indexes: list[int],
                      wanted: list[int | None] | None) -> dict[str, StoredVersion]:
        """The stored version (size, checksum) of each distinct key among ``indexes``
        whose SSD copy is the wanted one: a key named many times in one get is read (and
        staged) once. One lookup for the batch: a ``stat`` per key built two records
        each (130-230 µs of a 64 KiB get of 32, docs/benchmarks.md)."""
        versions: dict[str, StoredVersion] = {}
        found = self.backend.batch_versions([keys[i] for i in indexes])
        for i, version in zip(indexes, found):
            if version is not None and (wanted is None or wanted[i] == version.checksum):
                versions.setdefault(keys[i], version)
        self.staging.check(sum(v.size for v in versions.values()))
        return versions

    async def _stream_from_ssd(self, conn: FramedSocket, spec: OpSpec, keys: list[str],
                               indexes: list[int], wanted: list[int | None] | None,
                               versions: dict[str, StoredVersion], staging: memoryview,
                               sizes: list[int], pieces: list[memoryview | None],
                               held: list[int]) -> None:
        """Answer a get whose ``indexes`` are to be read from SSD (``versions``, into
        ``staging``), the others being ``pieces`` of DRAM: the header goes out at once,
        with the sizes planned; the items follow in order, each as soon as it is there
        (the disk reads all of them in one submission meanwhile), then a trailer with
        the final sizes. An item whose read failed (its checksum, its record gone) is
        sent as zeros and is a miss in the trailer: never bytes that are not the
        object's. Returns once the reads are over, so that ``staging`` is free."""
        views, cursor = {}, 0
        for key, version in versions.items():
            views[key] = staging[cursor:cursor + version.size]
            cursor += version.size
        from_ssd = []
        for i in indexes:
            version = versions.get(keys[i])
            if version is not None and (wanted is None or wanted[i] == version.checksum):
                sizes[i] = version.size
                from_ssd.append(i)
        final = list(sizes)
        header = OpSpec.reply_header(GetReply(sizes, from_ssd, held, trailer=True))
        # The reads start only now, the reply planned: a reader thread woken while this
        # thread still had Python to run would wait for the GIL before it reached the
        # disk; sending the header lets it go at once.
        reading = self.ssd_reads.start(list(views.items()))
        started = False
        try:
            await conn.send_frame(header, payload_len=sum(s for s in sizes if s > 0))
            started = True
            order = list(views)
            got: dict[str, int] = {}
            ready: list[memoryview] = []
            for i in range(len(keys)):
                if sizes[i] < 0:
                    continue
                piece = pieces[i]
                if piece is None:
                    key = keys[i]
                    while key not in got:
                        try:
                            arrived = reading.next_nowait()
                        except trio.WouldBlock:
                            if ready:  # send what is there before waiting for the disk
                                await conn.send_frame(None, ready)
                                ready = []
                                continue
                            arrived = await reading.next()
                        if arrived is None:  # the backend call failed: the rest is lost
                            got.update(dict.fromkeys(
                                [k for k in order if k not in got], ReadStatus.IO_ERROR))
                            break
                        done_key = order[arrived[0]]
                        got[done_key] = self._read_back(done_key, arrived[1],
                                                        versions[done_key])
                    piece = views[key]
                    if got[key] != sizes[i]:
                        final[i] = got[key] if got[key] < 0 else ReadStatus.CORRUPT
                        piece[:] = bytes(piece.nbytes)  # what the staging held before
                ready.append(piece)
            await conn.send_frame(None, ready)
            if reading.error is not None:
                log.warning("node %s: an SSD read failed: %s", self.node.name,
                            reading.error)
            await conn.send_frame(spec.trailer_header(final))
        except Exception as exc:
            if not started or isinstance(exc, OSError | trio.BrokenResourceError):
                raise
            # Half a reply is out: an error frame now would be read as payload. Hang up.
            log.exception("node %s: a get failed mid-reply; closing its connection",
                          self.node.name)
            raise trio.BrokenResourceError("the get failed mid-reply") from exc
        finally:
            with trio.CancelScope(shield=True):
                await reading.done.wait()

    def _read_back(self, key: str, got: int, version: StoredVersion) -> int:
        """Count what an SSD read of ``key`` gave; a bad record is dropped and reported."""
        if got >= 0:
            self._served_ssd.inc(got)
        elif got == ReadStatus.CORRUPT:
            self.integrity.corrupt(key, Tier.SSD)
            self.outcomes.dropped([(key, Tier.SSD, version.checksum)])
            self.node.schedule_quarantine()
            self.node.wake_heartbeat()
        return got


def _address(value: object) -> tuple[str, int] | None:
    if isinstance(value, tuple) and len(value) >= 2:
        return str(value[0]), int(value[1])
    return None


async def _skip(conn: FramedSocket, size: int) -> None:
    """Read and drop ``size`` bytes of payload (an item that could not be placed)."""
    scratch = memoryview(bytearray(min(size, 1 << 20)))
    while size:
        n = min(size, len(scratch))
        await conn.recv_payload_into(scratch[:n])
        size -= n
