"""Staging buffers for SSD reads, shared by every connection of a node, with a byte budget.

A get of SSD-only objects reads them into a staging buffer and sends it. Fresh pages are
slow to touch (0.5-2.4 GB/s against about 20 GB/s for memory in use), so buffers are
reused; but one connection must not be able to make the node hold its peak forever, nor
many connections together hold more than a bound. So:

- at most ``budget`` bytes are lent at once over all connections; a request waits for
  room, and one that needs more than the whole budget is refused with an error saying
  so (clients split their gets below it: the node announces the budget in its hello);
- one *arena* of ``budget // 4`` bytes is allocated once (pre-faulted: :meth:`prepare`
  at start, or on first use) and kept; each request takes a page-aligned extent of it
  (kvstored.allocator), so concurrent gets of any sizes share it and none pays for
  fresh pages. A request the arena cannot hold now gets a buffer of its own, freed
  when it returns.

Before the arena, returned buffers were kept up to the same bound with the largest
dropped first, so a batch of 32 objects of 4 MiB (128 MiB, the whole bound) never kept
its buffer and touched 128 MiB of fresh pages on every get.

This module holds memory, not I/O.
"""

from __future__ import annotations

import ctypes
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

from kvstored.allocator import OffsetAllocator
from kvstored.errors import BadRequestError
from kvstored.sdk.units import format_size

#: Extents of the arena start on a page (what O_DIRECT reads want).
ALIGN = 4096


def aligned(size: int) -> memoryview:
    """``size`` zeroed (so touched) bytes starting on a page. A bytearray, not an
    anonymous mapping: mappings are how a backend tells the node's DRAM segment."""
    raw = bytearray(size + ALIGN)
    skip = -ctypes.addressof(ctypes.c_char.from_buffer(raw)) % ALIGN
    return memoryview(raw)[skip:skip + size]


class StagingPool:
    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.keep = budget // 4 // ALIGN * ALIGN
        self.lent = 0
        self._arena: memoryview | None = None
        self._extents = OffsetAllocator(self.keep, ALIGN) if self.keep else None
        self._returned = trio.Event()

    @property
    def kept(self) -> int:
        """Bytes held for reuse (the arena, once allocated)."""
        return 0 if self._arena is None else self._arena.nbytes

    def prepare(self) -> None:
        """Allocate and pre-fault the arena now (slow: a thread's work at start)."""
        if self._arena is None and self.keep:
            self._arena = aligned(self.keep)

    def check(self, size: int) -> None:
        """Refuse at once a request that could never fit."""
        if size > self.budget:
            raise BadRequestError(
                f"this get needs {format_size(size)} of SSD reads staged at once, more than "
                f"the node's security.max_read_staging ({format_size(self.budget)}); ask "
                "for fewer objects per request")

    @asynccontextmanager
    async def lend(self, size: int) -> AsyncIterator[memoryview]:
        """A page-aligned buffer of ``size`` bytes for the length of the block."""
        self.check(size)
        while self.lent + size > self.budget:
            await self._returned.wait()
        self.lent += size
        offset = None
        if self._extents is not None and size <= self.keep:
            offset = self._extents.allocate(max(size, 1))
        if offset is not None:
            self.prepare()
            assert self._arena is not None
            buffer = self._arena[offset:offset + size]
        else:
            buffer = aligned(size)
        try:
            yield buffer
        finally:
            # No await here: a cancelled get must still give its room back.
            self.lent -= size
            if offset is not None:
                assert self._extents is not None
                self._extents.free(offset)
            self._returned.set()
            self._returned = trio.Event()
