"""The offline source: a backend directory opened without a daemon.

For the morning after a crash: the node is down and the question is what its SSD tier
holds. The backend is opened read-only (:func:`kvstored.backends.offline.open_offline`):
its recovery runs in memory and writes nothing, what it would tidy is left in place, and
a directory that a running node holds is refused. Neither the open nor the mount writes
anything. Every read is checked against the record's CRC-32C; a value that fails reads as
EIO.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

from kvstored.backends.offline import open_offline
from kvstored.errors import CorruptDataError, NotFoundError, StoreError
from kvstored.fuse.names import ParsedName, digest
from kvstored.fuse.sources import PAGE, Entry, Source, Space
from kvstored.sdk import StorageBackend
from kvstored.sdk.types import ObjectRecord, ReadStatus

_XATTRS = ("key", "tier", "size", "checksum", "location", "write_time", "seq", "backend")


class OfflineSource(Source):
    """The objects of one backend directory, read with the backend's own code."""

    stats_names = ("backend.json",)

    def __init__(self, backend: StorageBackend, *, threads: int = 4) -> None:
        super().__init__(threads)
        self.backend = backend

    @classmethod
    def open(cls, directory: str, backend: str | None = None) -> OfflineSource:
        """Open ``directory`` read-only with ``backend`` (default: the one its stamp
        names). Raises the backend's errors: MissingStoreError, CorruptionError,
        BackendBusyError (a running node holds it)."""
        return cls(open_offline(directory, backend))

    # -- objects -----------------------------------------------------------------------

    async def entries(self, after: str | None = None, *, node: str | None = None,
                      tier: str | None = None) -> AsyncIterator[Entry]:
        if after is not None or node is not None:
            raise ValueError("an offline listing is in scan order: it resumes by position")
        # scan() walks the backend's in-memory index; pull it a page at a time so that a
        # directory of millions of objects is never copied into one list here.
        records = self.backend.scan()
        try:
            while True:
                page = await self._blocking(lambda: list(itertools.islice(records, PAGE)))
                for record in page:
                    yield _entry(record)
                if len(page) < PAGE:
                    return
        finally:
            records.close()

    async def stat(self, key: str) -> Entry | None:
        record = await self._blocking(self.backend.stat, key)
        return None if record is None else _entry(record)

    async def read_into(self, key: str, buffer: bytearray) -> int:
        status = (await self._blocking(self.backend.batch_read, [key],
                                       [memoryview(buffer)]))[0]
        if status >= 0:
            return status
        if status == ReadStatus.MISSING:
            raise NotFoundError(f"no object in {self.backend.path}", key=key)
        if status == ReadStatus.CORRUPT:
            raise CorruptDataError(f"failed its checksum in {self.backend.path}", key=key)
        raise StoreError(f"reading from {self.backend.path} failed "
                         f"({ReadStatus(status).name})", key=key)

    # -- attributes --------------------------------------------------------------------

    def xattr_names(self) -> tuple[str, ...]:
        return _XATTRS

    async def xattr(self, key: str, name: str) -> bytes:
        if name not in _XATTRS:
            raise KeyError(name)
        record = await self._blocking(self.backend.stat, key)
        if record is None:
            raise NotFoundError(f"no object in {self.backend.path}", key=key)
        value: Any = {
            "key": key,
            "tier": "ssd",
            "size": record.size,
            "checksum": f"{record.checksum:08x}",
            "write_time": datetime.fromtimestamp(record.write_time, UTC).isoformat(),
            "seq": record.seq,
            "backend": self.backend.name,
        }.get(name)
        if name == "location":
            return json.dumps(dataclasses.asdict(record.location), sort_keys=True).encode()
        return str(value).encode("utf-8")

    async def find_hashed(self, parsed: ParsedName) -> str | None:
        # No sorted index to search by prefix: walk the whole scan (slow on a big
        # directory, and only needed for a hashed name not listed in this mount).
        async for entry in self.entries():
            if entry.key.startswith(parsed.prefix) and digest(entry.key) == parsed.digest:
                return entry.key
        return None

    # -- the directory -----------------------------------------------------------------

    async def stats_document(self, name: str) -> Any:
        if name != "backend.json":
            raise KeyError(name)
        usage = await self._blocking(self.backend.usage)
        caps = self.backend.capabilities
        return {"backend": self.backend.name, "path": self.backend.path,
                "usage": dataclasses.asdict(usage),
                "capabilities": {"shared": caps.shared, "eviction": caps.eviction.value,
                                 "aligned_values": caps.aligned_values,
                                 "persistent": caps.persistent,
                                 "max_value_size": caps.max_value_size}}

    async def space(self) -> Space:
        usage = await self._blocking(self.backend.usage)
        capacity = usage.capacity_bytes
        if capacity is None:
            fs = await self._blocking(os.statvfs, self.backend.path)
            capacity = fs.f_blocks * fs.f_frsize
        return Space(capacity, usage.physical_bytes, usage.objects)

    async def aclose(self) -> None:
        await self._blocking(self.backend.close)


def _entry(record: ObjectRecord) -> Entry:
    return Entry(record.key, record.size, mtime=record.write_time, checksum=record.checksum)
