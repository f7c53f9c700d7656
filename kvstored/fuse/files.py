"""Open files: an object's value fetched whole on first read, or a statistics snapshot.

Objects are read whole: the client library and the backends read values, not ranges.
The first ``read`` of an open file fetches the value into a buffer; later reads (the
kernel asks for 128 KiB to 1 MiB at a time) are slices of it, handed to pyfuse3 without a
copy. Buffers are reused from a small pool, because fresh memory is slow to touch the
first time (see docs/fuse.md, "Limits").
"""

from __future__ import annotations

import json
from typing import Any

import trio

from kvstored.fuse.sources import Source

#: Released buffers kept for reuse, at most this many bytes in all.
POOL_BYTES = 512 * 1024 * 1024


class BufferPool:
    """Byte buffers to read values into, reused across opens."""

    def __init__(self, max_bytes: int = POOL_BYTES) -> None:
        self.max_bytes = max_bytes
        self._free: list[bytearray] = []

    def take(self, size: int) -> bytearray:
        """A buffer of at least ``size`` bytes (and not much more than twice that)."""
        fits = [b for b in self._free if size <= len(b) <= max(2 * size, 1 << 20)]
        if fits:
            best = min(fits, key=len)
            self._free.remove(best)
            return best
        return bytearray(size)

    def give(self, buffer: bytearray) -> None:
        """Return a buffer; the largest are let go once the pool is over its budget."""
        if len(buffer) > self.max_bytes:
            return
        self._free.append(buffer)
        self._free.sort(key=len)
        while sum(map(len, self._free)) > self.max_bytes:
            self._free.pop()


class OpenObject:
    """An open object file: its value, fetched on the first read."""

    def __init__(self, source: Source, pool: BufferPool, key: str, size: int) -> None:
        self.source = source
        self.pool = pool
        self.key = key
        self.size = size
        self._lock = trio.Lock()
        self._buffer: bytearray | None = None
        self._length = 0

    async def read(self, offset: int, size: int) -> memoryview:
        """Bytes ``[offset, offset + size)`` of the value (fewer at its end).
        Raises NotFoundError or CorruptDataError from the source."""
        if self._buffer is None:
            async with self._lock:  # concurrent readahead requests fetch it once
                if self._buffer is None:
                    buffer = self.pool.take(self.size)
                    try:
                        self._length = await self.source.read_into(self.key, buffer)
                    except BaseException:
                        self.pool.give(buffer)
                        raise
                    self._buffer = buffer
        return memoryview(self._buffer)[offset:min(offset + size, self._length)]

    def release(self) -> None:
        if self._buffer is not None:
            self.pool.give(self._buffer)
            self._buffer = None


class OpenDocument:
    """An open statistics file: the JSON rendered when it was opened."""

    def __init__(self, document: Any) -> None:
        self.data = json.dumps(document, indent=1, sort_keys=True).encode() + b"\n"

    async def read(self, offset: int, size: int) -> bytes:
        return self.data[offset:offset + size]

    def release(self) -> None:
        pass
