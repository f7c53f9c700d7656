"""The node's data server ops: how bytes get in and out of a node.

- ``put``: values arrive as one frame; each is received straight into its slot in the
  DRAM segment (``recv_into``), its CRC-32C checked, and the batch committed at the
  master.
- ``alloc`` / ``seal`` / ``abort``: a same-host client copies through its mapping of the
  segment; the node only allocates, then checks and commits.
- ``get``: DRAM objects are sent from the segment (pinned for the send); SSD objects are
  read in one backend batch into a reused staging buffer and sent. The client passes
  the checksums the master gave it, so a node never serves another version of a key
  (one removed and written again) in its place.
- ``locate``: where a key's bytes are, for debugging.

:class:`DataServerOps` is mixed into :class:`kvstored.node.service.Node`, which owns the
tiers and the master session these ops use.
"""

from __future__ import annotations

import logging
from typing import Any

from crc32c import crc32c

from kvstored.errors import BadRequestError
from kvstored.master.table import DRAM, SSD
from kvstored.node.dram import DramObject
from kvstored.rpc import FramedSocket
from kvstored.sdk import ReadStatus

log = logging.getLogger(__name__)


def batch_columns(h: dict[str, Any], *fields: str) -> list[list[Any]]:
    """``keys`` and per-key fields of a request, checked to be lists of one length."""
    keys = h["keys"]
    columns = [keys, *(h[f] for f in fields)]
    if not isinstance(keys, list) or any(not isinstance(c, list) or len(c) != len(keys)
                                         for c in columns):
        raise BadRequestError("keys and their per-key fields must be lists of one length")
    return columns


class DataServerOps:
    """The ``op_*`` handlers of the node's data server (see the module docstring)."""

    async def op_put(self, conn: FramedSocket, h: dict[str, Any]):
        keys, sizes, checksums = batch_columns(h, "sizes", "checksums")
        if sum(sizes) != conn.payload_left:
            raise BadRequestError(f"sizes add up to {sum(sizes)} but the payload is "
                                  f"{conn.payload_left} bytes")
        results: list[str] = []
        received: list[tuple[int, DramObject]] = []
        for key, size, checksum in zip(keys, sizes, checksums):
            if self.leaving or self.dram.allocate(key, size, checksum,
                                                  self.put_timeout) is None:
                # "exists": another put of this key is in flight here.
                results.append("exists" if self.dram.being_written(key) is not None
                               else "no_space")
                await _skip(conn, size)
                continue
            obj = self.dram.being_written(key)
            view = self.dram.view(obj)
            await conn.recv_payload_into(view)
            if crc32c(view) != checksum:
                self.dram.free(key, obj.offset)
                results.append("corrupt")
                continue
            results.append("")
            received.append((len(results) - 1, obj))
        self.metrics.bytes_received.inc(sum(sizes))
        await self._commit(received, results)
        reply: dict[str, Any] = {"results": results}
        if "no_space" in results:
            self.wake_heartbeat()
            reply["no_space"] = self.no_space_reason()
        return reply, ()

    async def _commit(self, received: list[tuple[int, DramObject]], results: list[str]) -> None:
        """Commit the received objects at the master (with every other connection's, in
        one call: see kvstored.node.commits) and fill in their results."""
        oks = await self.commits.submit([obj for _, obj in received])
        for (i, _), ok in zip(received, oks):
            results[i] = "ok" if ok else "exists"

    async def op_alloc(self, conn: FramedSocket, h: dict[str, Any]):
        keys, sizes, checksums = batch_columns(h, "sizes", "checksums")
        offsets = [None if self.leaving else self.dram.allocate(k, n, c, self.put_timeout)
                   for k, n, c in zip(keys, sizes, checksums)]
        reply: dict[str, Any] = {"offsets": offsets}
        if None in offsets:
            self.wake_heartbeat()
            reply["no_space"] = self.no_space_reason()
        return reply, ()

    async def op_seal(self, conn: FramedSocket, h: dict[str, Any]):
        (keys,) = batch_columns(h)
        results: list[str] = []
        received: list[tuple[int, DramObject]] = []
        for key in keys:
            obj = self.dram.being_written(key)
            if obj is None:
                results.append("missing")
                continue
            if crc32c(self.dram.view(obj)) != obj.checksum:
                self.dram.free(key, obj.offset)
                results.append("corrupt")
                continue
            results.append("")
            received.append((len(results) - 1, obj))
        await self._commit(received, results)
        return {"results": results}, ()

    async def op_abort(self, conn: FramedSocket, h: dict[str, Any]):
        (keys,) = batch_columns(h)
        for key in keys:
            obj = self.dram.being_written(key)
            if obj is not None:
                self.dram.free(key, obj.offset)
        return {}, ()

    async def op_report_corrupt(self, conn: FramedSocket, h: dict[str, Any]):
        """A client read bytes of a DRAM object here that failed the object's checksum
        (a same-host writer may scribble over its mapping after its seal). The node
        checks its copy itself; a bad one is dropped, counted and reported to the master,
        so that readers fall back to another replica. Returns, per key, whether the copy
        here was bad."""
        keys, checksums = batch_columns(h, "checksums")
        bad = []
        for key, checksum in zip(keys, checksums):
            pinned = self.dram.pin([key])
            obj = pinned.get(key)
            try:
                corrupt = (obj is not None and obj.checksum == checksum
                           and crc32c(self.dram.view(obj)) != checksum)
            finally:
                self.dram.unpin(pinned.values())
            bad.append(corrupt)
            if corrupt:
                self.count_corrupt(key, DRAM)
                if self.dram.free(key, obj.offset):
                    self.report.add("dropped", [[key, DRAM, obj.offset]])
        if any(bad):
            self.wake_heartbeat()
        return {"corrupt": bad}, ()

    async def op_locate(self, conn: FramedSocket, h: dict[str, Any]):
        """Where each key's bytes are on this node: the DRAM offset and the SSD file and
        offset (for debugging, and for tests that damage records on purpose)."""
        (keys,) = batch_columns(h)
        out = []
        for key in keys:
            obj = self.dram.get(key)
            where = self.backend.locate(key)
            out.append({
                "dram": None if obj is None else {"segment": self.segment.name,
                                                  "offset": obj.offset, "size": obj.size},
                "ssd": None if where is None else {
                    "path": where.path, "offset": where.offset, "length": where.length,
                    "record_offset": where.record_offset, "device": where.device}})
        return {"locations": out}, ()

    async def op_get(self, conn: FramedSocket, h: dict[str, Any]):
        (keys,) = batch_columns(h)
        wanted = h.get("checksums")
        if wanted is not None and (not isinstance(wanted, list) or len(wanted) != len(keys)):
            raise BadRequestError("checksums must be a list with one entry per key")
        pinned = self.dram.pin(keys)
        try:
            sizes: list[int] = [ReadStatus.MISSING] * len(keys)
            pieces: list[memoryview | None] = [None] * len(keys)
            ssd_wanted = []
            for i, key in enumerate(keys):
                obj = pinned.get(key)
                if obj is not None and (wanted is None or wanted[i] == obj.checksum):
                    pieces[i] = self.dram.view(obj)
                    sizes[i] = obj.size
                else:
                    ssd_wanted.append(i)
            self.metrics.bytes_served.labels(tier=DRAM).inc(
                sum(s for s in sizes if s > 0))
            records = self._ssd_records(keys, ssd_wanted, wanted)
            need = sum(r.size for r in records.values())
            if not need:
                await conn.send_frame({"ok": True, "sizes": sizes},
                                      [p for p in pieces if p is not None])
                return None, ()
            async with self.staging.lend(need) as staging:
                await self._load_from_ssd(keys, ssd_wanted, wanted, records, staging, sizes,
                                          pieces)
                await conn.send_frame({"ok": True, "sizes": sizes},
                                      [p for p in pieces if p is not None])
        finally:
            self.dram.unpin(pinned.values())
        return None, ()

    def _ssd_records(self, keys: list[str], indexes: list[int],
                     wanted: list[int | None] | None) -> dict[str, Any]:
        """The SSD record of each distinct key among ``indexes`` that has the wanted
        version: a key named many times in one get is read (and staged) once."""
        records: dict[str, Any] = {}
        for i in indexes:
            key = keys[i]
            if key in records:
                continue
            record = self.backend.stat(key)
            if record is not None and (wanted is None or wanted[i] == record.checksum):
                records[key] = record
        self.staging.check(sum(r.size for r in records.values()))
        return records

    async def _load_from_ssd(self, keys: list[str], indexes: list[int],
                             wanted: list[int | None] | None, records: dict[str, Any],
                             staging: memoryview, sizes: list[int],
                             pieces: list[memoryview | None]) -> None:
        """Read ``records`` into ``staging`` in one backend batch, then point every index
        that wants the version read at its bytes."""
        views, cursor = {}, 0
        for key, record in records.items():
            views[key] = staging[cursor:cursor + record.size]
            cursor += record.size
        results = await self.ssd_reads.submit(list(zip(records, views.values())))
        got_by_key = dict(zip(records, results))
        for key, got in got_by_key.items():
            if got >= 0:
                self.metrics.bytes_served.labels(tier=SSD).inc(got)
            elif got == ReadStatus.CORRUPT:
                self.count_corrupt(key, SSD)
                self.report.add("dropped", [[key, SSD, records[key].checksum]])
                self._schedule_quarantine()
                self.wake_heartbeat()
        for i in indexes:
            key = keys[i]
            got = got_by_key.get(key, ReadStatus.MISSING)
            if got >= 0 and (wanted is None or wanted[i] == records[key].checksum):
                sizes[i] = got
                pieces[i] = views[key][:got]

    def count_corrupt(self, key: str, tier: str) -> None:
        """Count a copy of ``key`` that failed its checksum (served as a miss)."""
        self.corrupt_reads += 1
        self.metrics.checksum_failures.labels(tier=tier).inc()
        log.warning("node %s: %r failed its checksum in %s: served as a miss%s", self.name,
                    key, tier, ", quarantining" if tier == SSD else ", dropped this copy")


async def _skip(conn: FramedSocket, size: int) -> None:
    """Read and drop ``size`` bytes of payload (an item that could not be placed)."""
    scratch = memoryview(bytearray(min(size, 1 << 20)))
    while size:
        n = min(size, len(scratch))
        await conn.recv_payload_into(scratch[:n])
        size -= n
