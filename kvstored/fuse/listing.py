"""An open directory: a stream of entries that ``readdir`` offsets can resume.

The kernel reads a directory in several ``readdir`` calls, each starting at an offset
the previous one handed out. Entry number ``i`` (from 0) is handed out with offset
``i + 1``. A listing that continues where it stopped uses the stream it has (and the
entry that did not fit last time); one that jumps (``seekdir``, ``rewinddir``) restarts
the stream after the key it remembers for that offset, so a listing of millions of keys
never holds more than a page and a bounded table of recent offsets. An offset it has
forgotten is reached by listing again from the start and skipping.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import AsyncIterator, Callable

import trio

from kvstored.fuse.tree import Child

#: Offsets remembered per open directory (a few kernel buffers' worth of entries).
REMEMBERED_OFFSETS = 4096

StreamFactory = Callable[[str | None], AsyncIterator[Child]]


class DirListing:
    """One ``opendir``: its stream, its position, and the cursors of recent offsets."""

    def __init__(self, open_stream: StreamFactory, resumable: bool) -> None:
        self._open_stream = open_stream
        self.resumable = resumable
        #: Serialises readdir calls on the same handle (the stream is not reentrant).
        self.lock = trio.Lock()
        self.position = 0
        self._stream: AsyncIterator[Child] | None = None
        self._held: Child | None = None
        self._cursors: OrderedDict[int, str] = OrderedDict()

    async def seek(self, offset: int) -> None:
        """Make :meth:`next` return the entry numbered ``offset``."""
        if offset == self.position and self._stream is not None:
            return
        if offset == 0:
            await self._restart(None, 0)
        elif self.resumable and offset in self._cursors:
            await self._restart(self._cursors[offset], offset)
        else:
            await self._restart(None, 0)
            while self.position < offset and await self.next() is not None:
                self.position += 1

    async def _restart(self, after: str | None, position: int) -> None:
        await self.close()
        self._stream = self._open_stream(after)
        self.position = position

    async def next(self) -> Child | None:
        """The next entry (not yet counted: call :meth:`accept` or :meth:`hold`)."""
        if self._held is not None:
            child, self._held = self._held, None
            return child
        if self._stream is None:
            self._stream = self._open_stream(None)
        try:
            return await self._stream.__anext__()
        except StopAsyncIteration:
            return None

    def accept(self, child: Child) -> None:
        """The kernel took ``child``: count it, and remember where to resume after it."""
        self.position += 1
        if self.resumable and child.cursor is not None:
            self._cursors[self.position] = child.cursor
            while len(self._cursors) > REMEMBERED_OFFSETS:
                self._cursors.popitem(last=False)

    def hold(self, child: Child) -> None:
        """The kernel's buffer was full: hand ``child`` out again on the next call."""
        self._held = child

    async def close(self) -> None:
        stream, self._stream, self._held = self._stream, None, None
        if stream is not None:
            await stream.aclose()  # type: ignore[attr-defined]
