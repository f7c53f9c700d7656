"""Keeping CPython's full garbage collections off the master's table.

A generation-2 collection walks every object the collector tracks, and runs each time
the long-lived ones have grown by a quarter. The table holds a few tracked objects per
object it holds (its ``ObjectMeta``, replica list, replica), so at millions of objects a
full collection is seconds in one step of the master's loop: 4.3 s at 3.5M objects and
6.1 s at 4M on this project's loaded 2-vCPU machine (docs/benchmarks.md, Scale), long
enough for the master to declare a registering node dead after ``node_ttl`` (10 s).

The table's entries hold no reference cycles, so the collector has nothing to find
among them. Once the table has grown by :data:`FREEZE_EVERY` objects since the last
time, :class:`TableCollector` moves every object tracked then into the permanent
generation (``gc.freeze()``), after a collection of the young generations (cheap), so
the full collections that follow walk what came since, not the whole table. Frozen
objects are still freed by reference counting when the table drops them; what a freeze
costs is a cycle that was already garbage, unreached, in the old generation at that
moment: it is never collected.
"""

from __future__ import annotations

import gc

#: Growth of the table, in objects, between two freezes.
FREEZE_EVERY = 100_000


class TableCollector:
    """Call :meth:`tick` with the table's size from the master's housekeeping."""

    def __init__(self, every: int = FREEZE_EVERY) -> None:
        self.every = every
        self._frozen_at = 0

    def tick(self, objects: int) -> bool:
        """Freeze what the collector tracks if the table grew by ``every`` objects since
        the last freeze; True if it did."""
        if objects < self._frozen_at:
            self._frozen_at = objects  # it shrank: count growth from here
        if objects - self._frozen_at < self.every:
            return False
        gc.collect(1)
        gc.freeze()
        self._frozen_at = objects
        return True
