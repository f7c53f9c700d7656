"""Where a client last found each key it put or read: so that its next read of the key
asks that node directly (``get_held``), without a master lookup first. No I/O.

A remembered location is a hint, never trusted for bytes: the node serves a key to
``get_held`` only from a DRAM copy of the version (the checksum) named, that a client
put there and that the master has not revoked (a remove revokes before it returns), and
the client checks the CRC-32C of what comes back. Anything else comes back missing, the
entry is forgotten, and the key is read the usual way (lookup, then get). So a stale
entry costs one round trip, never a wrong or removed value.

Keys this client holds a lock on (``batch_lookup_and_lock``, ``prefix_hits(lock_for=)``)
are read through the master: that read is what ends the lock there.

Thread-safe: the blocking client's threads share one core.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

#: The most locations one client remembers (the oldest go first): about 150 bytes each.
MAX_LOCATIONS = 1 << 17


@dataclass(frozen=True, slots=True)
class HeldCopy:
    """A node holding a key's value of ``size`` bytes and CRC-32C ``checksum``."""

    node: str
    size: int
    checksum: int


class HeldLocations:
    def __init__(self, clock: Callable[[], float], limit: int = MAX_LOCATIONS) -> None:
        self.clock = clock
        self.limit = limit
        self._where: dict[str, HeldCopy] = {}
        #: Keys this client locked, and until when (its clock).
        self._locks: dict[str, float] = {}
        self._mutex = threading.Lock()

    def __len__(self) -> int:
        return len(self._where)

    def get(self, key: str) -> HeldCopy | None:
        return self._where.get(key)

    def remember(self, key: str, node: str, size: int, checksum: int) -> None:
        with self._mutex:
            self._where.pop(key, None)
            self._where[key] = HeldCopy(node, size, checksum)
            while len(self._where) > self.limit:
                del self._where[next(iter(self._where))]

    def forget(self, keys: Iterable[str]) -> None:
        with self._mutex:
            for key in keys:
                self._where.pop(key, None)

    def forget_prefix(self, prefix: str) -> None:
        with self._mutex:
            for key in [k for k in self._where if k.startswith(prefix)]:
                del self._where[key]

    # -- this client's locks ---------------------------------------------------------

    def locked(self, keys: Sequence[str], found: Sequence[bool], ttl: float) -> None:
        until = self.clock() + ttl
        with self._mutex:
            for key, ok in zip(keys, found):
                if ok:
                    self._locks[key] = max(self._locks.get(key, 0.0), until)

    def unlocked(self, keys: Iterable[str]) -> None:
        with self._mutex:
            for key in keys:
                self._locks.pop(key, None)

    def _is_locked(self, key: str, now: float) -> bool:
        until = self._locks.get(key)
        if until is None:
            return False
        if until <= now:
            self._locks.pop(key, None)
            return False
        return True

    # -- a read --------------------------------------------------------------------------

    def one(self, key: str) -> HeldCopy | None:
        """What is known of ``key`` if it may be asked for directly (known here, not
        locked by this client): :meth:`plan` for one key."""
        copy = self._where.get(key)
        if copy is None or not self._locks:
            return copy
        with self._mutex:
            return None if self._is_locked(key, self.clock()) else copy

    def plan(self, keys: Sequence[str], usable: Callable[[str], bool]
             ) -> dict[str, list[tuple[int, HeldCopy]]]:
        """Per node, the indexes of ``keys`` to ask it for with get_held and what is
        known of each: known here, not locked by this client, on a node ``usable`` says
        to ask directly (asked once per node)."""
        out: dict[str, list[tuple[int, HeldCopy]]] = {}
        where = self._where
        if not where:
            return out
        asked: dict[str, bool] = {}
        locks = self._locks
        now = self.clock() if locks else 0.0
        with self._mutex:
            for i, key in enumerate(keys):
                copy = where.get(key)
                if copy is None or (locks and self._is_locked(key, now)):
                    continue
                node = copy.node
                ok = asked.get(node)
                if ok is None:
                    ok = asked[node] = usable(node)
                if ok:
                    out.setdefault(node, []).append((i, copy))
        return out
