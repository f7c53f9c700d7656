"""The node's DRAM tier: objects in the shared-memory segment, placed by the allocator.

An object is first *allocated* (its bytes are being written, by a TCP put or by a
same-host client through the mapping), then *committed* once the master has made it
visible. Uncommitted objects that nobody seals within the put timeout are reclaimed.

Versions: a key can be removed and put again while a reader still holds a lease on
the old value. The old object then stays in memory, *retired*, until the master's drop
for it arrives. An object's identity is therefore its offset in the segment, and frees
name the offset, so a late drop of an old version never frees the new one. A new version
is written beside the current one and replaces it only when it commits: a put that the
master refuses (the key exists) leaves the committed object exactly as it was.

Frees of pinned objects (being sent, or being offloaded) wait for the last unpin, so
memory is never reused under a reader.

*Held* objects may be served without a master lookup (``get_held``): a version a client
put here, once the master committed it, until the master *revokes* its key (a remove) or
the node registers again (a new master, or one that declared this node dead, knows
nothing of what clients cached). A revoke marks every version of the key present, the
uncommitted one too, so a commit that lands after it never makes a removed value held.
A held version that leaves DRAM (evicted once it is on SSD) stays held in name
(:meth:`DramTier.held_on_ssd`): the node may serve its SSD copy of that version to
get_held until the same revoke, which is what lets a client read a key it put in one trip
after it moved to SSD.

Thread-safe: the trio loop and worker threads (offload, promotion) share it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass

from kvstored.allocator import OffsetAllocator
from kvstored.shm import DramSegment

#: Held versions that left DRAM remembered at most (about 100 bytes each).
MAX_HELD_ON_SSD = 1 << 20


@dataclass(slots=True)
class DramObject:
    key: str
    offset: int
    size: int
    checksum: int
    committed: bool
    deadline: float
    pins: int = 0
    doomed: bool = False
    #: Servable to get_held (see the module docstring).
    held: bool = False
    #: Its key was revoked while this version was here: never held again.
    revoked: bool = False


class DramTier:
    def __init__(self, segment: DramSegment, alignment: int = 4096) -> None:
        self.segment = segment
        self.allocator = OffsetAllocator(segment.data_size, alignment)
        #: Every object in memory, by offset (its identity).
        self.by_offset: dict[int, DramObject] = {}
        #: The current committed version of each key.
        self.current: dict[str, DramObject] = {}
        #: The version of each key being written (allocated, not yet committed).
        self.writing: dict[str, DramObject] = {}
        #: The checksum of each held version that left DRAM unrevoked, oldest first (at
        #: most MAX_HELD_ON_SSD: a key past that is read after a lookup, as any other).
        self._held_left: dict[str, int] = {}
        self._lock = threading.Lock()

    @property
    def capacity(self) -> int:
        return self.segment.data_size

    @property
    def used(self) -> int:
        return self.allocator.used_bytes

    def allocate(self, key: str, size: int, checksum: int, timeout: float) -> int | None:
        """Reserve room for a new, uncommitted version of ``key``; None if a put of the
        key is already in flight here, or there is no room. A committed version of the
        key stays current (and readable) until the new one commits."""
        with self._lock:
            if key in self.writing:
                return None
            offset = self.allocator.allocate(size)
            if offset is None:
                return None
            obj = DramObject(key, offset, size, checksum, False, time.monotonic() + timeout)
            self.by_offset[offset] = obj
            self.writing[key] = obj
            return offset

    def get(self, key: str) -> DramObject | None:
        """The current committed version of ``key``."""
        return self.current.get(key)

    def being_written(self, key: str) -> DramObject | None:
        """The uncommitted version of ``key`` a put is writing here, if any."""
        return self.writing.get(key)

    def view(self, obj: DramObject) -> memoryview:
        return self.segment.view(obj.offset, obj.size)

    def commit(self, obj: DramObject, *, held: bool = False) -> None:
        """Make ``obj`` the current version of its key (``held``: a client's put the
        master committed, servable to get_held unless revoked meanwhile). A committed
        older version is retired, not freed: leased readers may still be using it, and
        the master sends its drop once their leases have expired."""
        with self._lock:
            if self.writing.get(obj.key) is obj:
                del self.writing[obj.key]
            obj.committed = True
            # A promotion of a held version that left DRAM is that held version again.
            held = held or self._held_left.get(obj.key) == obj.checksum
            obj.held = held and not obj.revoked
            if held:
                self._held_left.pop(obj.key, None)  # this copy is the one held now
            if not obj.doomed:
                self.current[obj.key] = obj

    def pin(self, keys: Iterable[str]) -> dict[str, DramObject]:
        """Pin the current committed version of each of ``keys`` that has one."""
        pinned: dict[str, DramObject] = {}
        with self._lock:
            for key in keys:
                obj = self.current.get(key)
                if key not in pinned and obj is not None and not obj.doomed:
                    obj.pins += 1
                    pinned[key] = obj
        return pinned

    def pin_held(self, keys: list[str], checksums: list[int]) -> list[DramObject | None]:
        """Pin, per key, its current version if it is held and of ``checksums``' version
        (None for the others). A key named twice is pinned twice (unpin each)."""
        out: list[DramObject | None] = []
        with self._lock:
            for key, checksum in zip(keys, checksums):
                obj = self.current.get(key)
                if obj is not None and obj.held and obj.checksum == checksum \
                        and not obj.doomed:
                    obj.pins += 1
                    out.append(obj)
                else:
                    out.append(None)
        return out

    def held_on_ssd(self, key: str, checksum: int) -> bool:
        """Whether the version ``checksum`` of ``key`` was held when it left DRAM and has
        not been revoked since: its SSD copy, if it has one, may serve get_held."""
        return self._held_left.get(key) == checksum

    def revoke(self, keys: Iterable[str]) -> None:
        """No version of ``keys`` here now, nor one that left DRAM, is served to get_held
        again."""
        with self._lock:
            for key in keys:
                self._held_left.pop(key, None)
                for obj in (self.current.get(key), self.writing.get(key)):
                    if obj is not None:
                        obj.held, obj.revoked = False, True

    def revoke_all(self) -> None:
        """Nothing here now, nor anything that left DRAM, is served to get_held again
        (the node registered anew)."""
        with self._lock:
            self._held_left.clear()
            for obj in self.by_offset.values():
                obj.held, obj.revoked = False, True

    def unpin(self, objects: Iterable[DramObject]) -> None:
        with self._lock:
            for obj in objects:
                obj.pins -= 1
                if obj.pins == 0 and obj.doomed:
                    self._release_locked(obj)

    def free(self, key: str, offset: int | None = None) -> bool:
        """Drop a version of ``key``: the one at ``offset``, or the current one. Its
        memory is reused once the last pin is gone. False if there is no such version."""
        with self._lock:
            obj = self.current.get(key) if offset is None else self.by_offset.get(offset)
            if obj is None or obj.key != key or obj.doomed:
                return False
            obj.doomed = True
            if self.current.get(key) is obj:
                del self.current[key]
                if obj.held:
                    self._left_held_locked(obj)
            if self.writing.get(key) is obj:
                del self.writing[key]
            if obj.pins == 0:
                self._release_locked(obj)
            return True

    def _left_held_locked(self, obj: DramObject) -> None:
        obj.held = False
        held = self._held_left
        held.pop(obj.key, None)
        if len(held) >= MAX_HELD_ON_SSD:
            del held[next(iter(held))]
        held[obj.key] = obj.checksum

    def _release_locked(self, obj: DramObject) -> None:
        del self.by_offset[obj.offset]
        self.allocator.free(obj.offset)

    def expire_uncommitted(self, now: float) -> list[str]:
        """Reclaim allocations whose put was abandoned."""
        with self._lock:
            stale = [o for o in self.writing.values() if not o.doomed and o.deadline <= now]
        for obj in stale:
            self.free(obj.key, obj.offset)
        return [o.key for o in stale]

    def committed(self) -> list[DramObject]:
        """Current committed versions (what the node registers with the master)."""
        with self._lock:
            return [o for o in self.current.values() if not o.doomed]
