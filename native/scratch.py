"""Per-thread page-aligned scratch memory, reused from one batch to the next.

Every path that moves records through the io engine needs memory of its own for a
moment: bounce buffers for unaligned O_DIRECT items, a record's header block, the small
values read together with their headers. Fresh pages are slow to touch (each one faults),
and O_DIRECT wants page-aligned memory, so each thread keeps what it last used, an
anonymous ``mmap`` (always page-aligned), and grows it on demand.

One :class:`ScratchMemory` is one purpose's memory: a thread's ``take`` hands out the
same pages again, so two uses that must be alive at once (a backend's record buffers and
the engine's bounce buffers under them) each have their own instance.
"""

from __future__ import annotations

import mmap
import threading

#: Scratch memory up to this size is kept by its thread for the next call; a larger
#: request gets memory of its own, freed once the caller drops it.
KEEP_BYTES = 64 << 20
#: The least a thread maps at once, so that small requests do not remap every time.
MIN_BYTES = 1 << 20


class ScratchMemory(threading.local):
    """Each thread's page-aligned scratch memory for one purpose."""

    def __init__(self) -> None:
        self.memory: mmap.mmap | None = None

    def take(self, size: int) -> memoryview:
        """``size`` bytes of page-aligned memory, valid until this thread's next ``take``
        of this instance. Its contents are whatever was there: zero what must be zero."""
        if self.memory is not None and len(self.memory) >= size:
            return memoryview(self.memory)[:size]
        fresh = mmap.mmap(-1, max(1 << max(size - 1, 0).bit_length(), MIN_BYTES))
        if len(fresh) <= KEEP_BYTES:
            self.memory = fresh
        return memoryview(fresh)[:size]


class ScratchLoan:
    """Memory lent by a :class:`ScratchPool`: ``view`` is the caller's until it gives the
    loan back."""

    __slots__ = ("memory", "view")

    def __init__(self, memory: mmap.mmap, size: int) -> None:
        self.memory = memory
        self.view = memoryview(memory)[:size]


class ScratchPool:
    """Page-aligned scratch memory lent out and given back, for memory that must stay
    valid past its thread's next use (the groups of a read stream in flight together):
    :meth:`ScratchMemory.take` hands out the same pages again at the thread's next call.
    Given-back memory is kept (up to :data:`KEEP_BYTES` in all) for the next loan of any
    thread, so its pages are already faulted in."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._free: list[mmap.mmap] = []
        self._kept = 0

    def lend(self, size: int) -> ScratchLoan:
        """``size`` bytes of page-aligned memory, whatever they held before."""
        with self._lock:
            for n, memory in enumerate(self._free):
                if len(memory) >= size:
                    del self._free[n]
                    self._kept -= len(memory)
                    return ScratchLoan(memory, size)
        return ScratchLoan(mmap.mmap(-1, max(1 << max(size - 1, 0).bit_length(), MIN_BYTES)),
                           size)

    def give_back(self, loan: ScratchLoan) -> None:
        """Return ``loan``: its memory may be lent again at once, so nothing (no io
        request in flight) may still use it."""
        memory = loan.memory
        with self._lock:
            if self._kept + len(memory) <= KEEP_BYTES:
                self._free.append(memory)
                self._kept += len(memory)
