"""Staging buffers for SSD reads, shared by every connection of a node, with a byte budget.

A get of SSD-only objects reads them into a staging buffer and sends it. Fresh pages are
slow to touch (0.5-2.4 GB/s against about 20 GB/s for memory in use), so buffers are
reused; but one connection must not be able to make the node hold its peak forever, nor
many connections together hold more than a bound. So:

- at most ``budget`` bytes are lent at once over all connections; a request waits for
  room, and one that needs more than the whole budget is refused with an error saying
  so (clients split their gets below it: the node announces the budget in its hello);
- returned buffers are kept for reuse up to ``budget // 4`` bytes in all, the largest
  ones dropped first.

This module holds memory, not I/O.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

from kvstored.errors import BadRequestError
from kvstored.sdk.units import format_size

#: Smallest buffer allocated: many small gets then share one.
MIN_BUFFER = 1 << 20


class StagingPool:
    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.keep = budget // 4
        self.lent = 0
        self._free: list[bytearray] = []
        self._returned = trio.Event()

    @property
    def kept(self) -> int:
        """Bytes held in free buffers."""
        return sum(len(b) for b in self._free)

    def check(self, size: int) -> None:
        """Refuse at once a request that could never fit."""
        if size > self.budget:
            raise BadRequestError(
                f"this get needs {format_size(size)} of SSD reads staged at once, more than "
                f"the node's security.max_read_staging ({format_size(self.budget)}); ask "
                "for fewer objects per request")

    @asynccontextmanager
    async def lend(self, size: int) -> AsyncIterator[memoryview]:
        """A buffer of at least ``size`` bytes for the length of the block."""
        self.check(size)
        while self.lent + size > self.budget:
            await self._returned.wait()
        self.lent += size
        buffer = self._take(size)
        try:
            yield memoryview(buffer)[:size]
        finally:
            # No await here: a cancelled get must still give its room back.
            self.lent -= size
            self._give_back(buffer)
            self._returned.set()
            self._returned = trio.Event()

    def _take(self, size: int) -> bytearray:
        fitting = [b for b in self._free if len(b) >= size]
        if fitting:
            buffer = min(fitting, key=len)
            self._free.remove(buffer)
            return buffer
        return bytearray(max(size, MIN_BUFFER))

    def _give_back(self, buffer: bytearray) -> None:
        self._free.append(buffer)
        self._free.sort(key=len)
        while self._free and self.kept > self.keep:
            self._free.pop()  # the largest
