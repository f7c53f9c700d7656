"""Per-key write claims: how a backend keeps two threads from writing one key at once,
without ever deadlocking.

Objects are written once, so a backend must make sure that of two batches naming the
same key, one writes it and the other reports ``EXISTS``. The obvious way, claiming each
key in turn and waiting whenever another thread holds one, deadlocks as soon as two
batches name the same keys in opposite orders: each holds the key the other waits for.

:class:`WriteClaims` does it in rounds instead:

1. Under the backend's lock, every key of the batch is sorted at once into *stored*
   (already visible: ``EXISTS``), *free* (claimed now, by this call) or *contested*
   (another call is writing it).
2. The free keys are written, and published (made visible) under the same lock.
3. Their claims are released, and only then, holding no claim at all, does the call wait
   for the writers of its contested keys; it then starts again with those keys, which by
   now are stored (``EXISTS``), or free again because that writer failed them.

A call never waits while it holds a claim, so no cycle of waits can form. This is not
what a backend *might* do: it is what every built-in backend does, and the conformance
kit's ``opposite_order_batches`` check fails a backend that deadlocks.

Use::

    self._claims = WriteClaims(self._lock)   # the lock that guards the index

    def batch_write(self, items):
        ...
        def write(positions):                # write items[p] for p in positions, publish
            ...                              # them (under self._lock) before returning
        for p in self._claims.write_batch([k for k, _ in items],
                                          stored=lambda key: key in self._index,
                                          write=write):
            results[p] = WriteResult(items[p][0], WriteOutcome.EXISTS)
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence


class WriteClaims:
    """The keys being written right now, and by which call.

    ``lock`` is the lock under which the backend publishes new objects: ``stored`` is
    called with it held, so that "not stored yet" and "claimed by me" are one atomic
    decision, and a key published by another call before it released its claim is seen
    as stored.
    """

    def __init__(self, lock: threading.Lock | threading.RLock) -> None:
        self._lock = lock
        #: key -> the event its writer sets when its round ends.
        self._writers: dict[str, threading.Event] = {}

    def claimed(self, key: str) -> bool:
        """Whether a call is writing ``key`` now. Call it with the lock held."""
        return key in self._writers

    def write_batch(self, keys: Sequence[str], *, stored: Callable[[str], bool],
                    write: Callable[[list[int]], None]) -> list[int]:
        """Write the keys of a batch, each exactly once across every concurrent call.

        ``write(positions)`` is called (without the lock) with positions into ``keys``
        that this call has claimed; it must write them and, for those it stored, make
        them visible (so that ``stored`` answers True) under the lock before it returns.
        It may be called several times, once per round.

        Returns the positions that need no write: keys already stored, and repeats of a
        key earlier in the same batch (the contract counts those as stored too). The
        caller reports them ``EXISTS``. If ``write`` raises, every claim this call holds
        is released before the exception propagates.
        """
        present: list[int] = []
        first: dict[str, int] = {}
        todo: list[int] = []
        for position, key in enumerate(keys):
            if key in first:
                present.append(position)
            else:
                first[key] = position
                todo.append(position)
        while todo:
            mine: list[int] = []
            contested: list[tuple[int, threading.Event]] = []
            done = threading.Event()  # this round's: set when its claims are released
            with self._lock:
                for position in todo:
                    key = keys[position]
                    if stored(key):
                        present.append(position)
                    elif key in self._writers:
                        contested.append((position, self._writers[key]))
                    else:
                        self._writers[key] = done
                        mine.append(position)
            try:
                if mine:
                    write(mine)
            finally:
                if mine:
                    with self._lock:
                        for position in mine:
                            del self._writers[keys[position]]
                    done.set()
            # Holding no claim now: waiting cannot be part of a cycle.
            for _, event in contested:
                event.wait()
            todo = [position for position, _ in contested]
        present.sort()
        return present
