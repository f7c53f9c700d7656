"""The node's DRAM tier: objects in the shared-memory segment, placed by the allocator.

An object is first *allocated* (its bytes are being written, by a TCP put or by a
same-host client through the mapping), then *committed* once the master has made it
visible. Uncommitted objects that nobody seals within the put timeout are reclaimed.
Frees of pinned objects (being sent, or being offloaded) wait for the last unpin, so
memory is never reused under a reader.

Thread-safe: the trio loop and worker threads (offload, promotion) share it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass

from kvstored.allocator import OffsetAllocator
from kvstored.node.segment import DramSegment


@dataclass(slots=True)
class DramObject:
    offset: int
    size: int
    checksum: int
    committed: bool
    deadline: float
    pins: int = 0
    doomed: bool = False


class DramTier:
    def __init__(self, segment: DramSegment, alignment: int = 4096) -> None:
        self.segment = segment
        self.allocator = OffsetAllocator(segment.data_size, alignment)
        self.objects: dict[str, DramObject] = {}
        self._lock = threading.Lock()

    @property
    def capacity(self) -> int:
        return self.segment.data_size

    @property
    def used(self) -> int:
        return self.allocator.used_bytes

    def allocate(self, key: str, size: int, checksum: int, timeout: float) -> int | None:
        """Reserve room for an uncommitted object; None if it is here already or there
        is no room."""
        with self._lock:
            if key in self.objects:
                return None
            offset = self.allocator.allocate(size)
            if offset is None:
                return None
            self.objects[key] = DramObject(offset, size, checksum, False,
                                           time.monotonic() + timeout)
            return offset

    def get(self, key: str) -> DramObject | None:
        return self.objects.get(key)

    def view(self, obj: DramObject) -> memoryview:
        return self.segment.view(obj.offset, obj.size)

    def commit(self, key: str) -> None:
        with self._lock:
            self.objects[key].committed = True

    def pin(self, keys: Iterable[str]) -> list[str]:
        """Pin the committed objects among ``keys``; returns those pinned."""
        pinned = []
        with self._lock:
            for key in keys:
                obj = self.objects.get(key)
                if obj is not None and obj.committed and not obj.doomed:
                    obj.pins += 1
                    pinned.append(key)
        return pinned

    def unpin(self, keys: Iterable[str]) -> None:
        with self._lock:
            for key in keys:
                obj = self.objects[key]
                obj.pins -= 1
                if obj.pins == 0 and obj.doomed:
                    self._release_locked(key, obj)

    def free(self, key: str) -> bool:
        """Drop ``key``; its memory is reused once the last pin is gone."""
        with self._lock:
            obj = self.objects.get(key)
            if obj is None or obj.doomed:
                return False
            obj.doomed = True
            if obj.pins == 0:
                self._release_locked(key, obj)
            return True

    def _release_locked(self, key: str, obj: DramObject) -> None:
        del self.objects[key]
        self.allocator.free(obj.offset)

    def expire_uncommitted(self, now: float) -> list[str]:
        """Reclaim allocations whose put was abandoned."""
        with self._lock:
            stale = [k for k, o in self.objects.items()
                     if not o.committed and not o.doomed and o.deadline <= now]
        for key in stale:
            self.free(key)
        return stale

    def committed(self) -> list[tuple[str, DramObject]]:
        with self._lock:
            return [(k, o) for k, o in self.objects.items() if o.committed and not o.doomed]
