"""How a client reads a batch, without I/O: where each object comes from, in which order
its replicas are tried, and what each answer means (:class:`BatchRead`); plus what reads
remember across batches (nodes that just failed, counts of what went wrong).

The I/O is the shells' (blocking, trio): :mod:`kvstored.client.core` drives a
:class:`BatchRead` through them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvstored.client.parts import checksum, scatter_checked
from kvstored.client.segments import Segments
from kvstored.errors import BadRequestError
from kvstored.protocol import Tier
from kvstored.protocol.master_api import LookupReply, NodeContact
from kvstored.protocol.node_api import GetRequest
from kvstored.wire import Into, Parts

log = logging.getLogger(__name__)

#: Missing: the value ``get_into`` and ``batch_get_into`` report for an absent key.
MISSING = -1


@dataclass(slots=True)
class ReadStats:
    """What a client's reads ran into; ``Client.stats`` (thread-safe counts)."""

    #: Copies that failed the object's CRC-32C (served from another replica, or missed).
    checksum_failures: int = 0
    #: Reads that a node could not serve (unreachable, or it failed the request) and that
    #: fell back to another replica or missed.
    node_failures: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def count(self, *, checksum_failures: int = 0, node_failures: int = 0) -> None:
        with self._lock:
            self.checksum_failures += checksum_failures
            self.node_failures += node_failures


class NodeHealth:
    """Nodes that just failed a request; reads skip them for ``holdoff`` seconds instead
    of paying a connection attempt per batch (the master drops a node that left at once,
    and a dead one after ``master.node_ttl``)."""

    def __init__(self, holdoff: float = 1.0) -> None:
        self.holdoff = holdoff
        self._down: dict[str, float] = {}

    def down(self, node: str) -> None:
        self._down[node] = time.monotonic() + self.holdoff

    def is_down(self, node: str) -> bool:
        until = self._down.get(node)
        if until is None:
            return False
        if until <= time.monotonic():
            self._down.pop(node, None)
            return False
        return True


@dataclass(frozen=True, slots=True)
class Route:
    """One way to read an object: copy it out of ``node``'s mapped segment at
    ``shm_offset``, or (``shm_offset`` None) ask ``node`` for it over TCP."""

    node: str
    shm_offset: int | None = None


@dataclass(frozen=True, slots=True)
class ShmCopy:
    """An object to copy out of a mapped segment now."""

    index: int
    node: str
    offset: int
    size: int


class BatchRead:
    """One batch read, as a state machine without I/O.

    For each object found by the lookup, its replicas become :class:`Route` s tried in
    order: the mapped segment of a DRAM replica on this host, then a TCP get from each
    node holding a replica (DRAM copies first). A route that fails moves the object to
    the next: the node cannot be reached or fails the request, the node no longer has
    it, or the bytes fail the object's CRC-32C (which every copy handed to the caller is
    checked against). An object with no route left is a clean miss: a read never raises
    because a node is down. Bad copies are collected so that the client can tell their
    nodes.

    The caller loops while :attr:`pending`: :meth:`copy_from_segments`, then for each of
    :meth:`tcp_requests` a node get (:meth:`node_get`) and :meth:`received` per item or
    :meth:`failed` for what the node could not deliver, and sends :meth:`take_corrupt`.
    """

    def __init__(self, keys: list[str], reply: LookupReply, buffers: list[Any],
                 segments: Segments, health: NodeHealth, stats: ReadStats) -> None:
        """``buffers`` are the caller's, one per key (a buffer, or the :class:`Parts` of
        one object); an empty list is filled with new bytearrays of the objects' sizes."""
        if not buffers:
            buffers.extend(bytearray(s or 0) for s in reply.sizes)
        self.keys = keys
        self.buffers: list[Into] = [b if isinstance(b, Parts) else memoryview(b).cast("B")
                                    for b in buffers]
        self.segments = segments
        self.health = health
        self.stats = stats
        self.nodes: dict[str, NodeContact] = reply.nodes
        self.lease_ttl = reply.lease_ttl
        self.results = [MISSING] * len(keys)
        #: The tier each object was read from (None: not read).
        self.tiers: list[Tier | None] = [None] * len(keys)
        self.sizes = [MISSING if s is None else s for s in reply.sizes]
        self.checksums = reply.checksums
        self._routes: list[list[Route]] = [[] for _ in keys]
        self._cursor = [0] * len(keys)
        self._open: set[int] = set()
        self.corrupt: dict[str, list[tuple[str, int]]] = {}
        replicas: dict[int, list[tuple[str, Tier, int]]] = {}
        columns = reply.replicas
        for i, node, tier, offset in zip(columns.of, columns.nodes, columns.tiers,
                                         columns.offsets):
            replicas.setdefault(i, []).append((node, tier, offset))
        for i, held in replicas.items():
            size = self.sizes[i]
            if size < 0:
                continue
            if len(self.buffers[i]) < size:
                what = "pieces hold" if isinstance(self.buffers[i], Parts) else "buffer holds"
                raise BadRequestError(f"the {what} {len(self.buffers[i])} bytes but the "
                                      f"object is {size}; pass a buffer of at least {size}",
                                      key=keys[i])
            self._routes[i] = self._plan(held)
            if not self._routes[i]:
                raise BadRequestError("transport='shm' but the object is not in a DRAM "
                                      "segment on this host; use transport='auto'",
                                      key=keys[i])
            self._open.add(i)

    def _plan(self, replicas: list[tuple[str, Tier, int]]) -> list[Route]:
        routes: list[Route] = []
        for node, tier, offset in replicas:
            if tier is Tier.DRAM and self.segments.mapping(node, self.nodes[node]) is not None:
                routes.append(Route(node, offset))
        if self.segments.transport != "shm":
            for node in dict.fromkeys(r[0] for r in replicas):
                routes.append(Route(node))
        return routes

    # -- what to do next ---------------------------------------------------------------

    @property
    def pending(self) -> bool:
        return bool(self._open)

    def _route(self, i: int) -> Route | None:
        routes, cursor = self._routes[i], self._cursor[i]
        while cursor < len(routes):
            route = routes[cursor]
            if route.shm_offset is not None or not self.health.is_down(route.node):
                self._cursor[i] = cursor
                return route
            cursor += 1  # that node just failed: do not wait on it again
        self._cursor[i] = cursor
        self._open.discard(i)
        return None

    def copy_from_segments(self, started: float, clock: Callable[[], float]) -> None:
        """Copy what this host's mapped segments hold into the buffers and check it. If
        that took so long (``clock() - started``) that the lookup's lease may have run
        out under the copies, they are read again over TCP instead of trusted."""
        copied: list[tuple[int, int]] = []
        for copy in self.shm_copies():
            mapping = self.segments.mapping(copy.node, self.nodes[copy.node])
            if mapping is None:  # unmapped since the plan (closed): ask over TCP
                self._advance(copy.index)
                continue
            # The CRC of what was stored, taken on the way: checked only once the lease
            # is known to have covered the whole copy.
            crc = scatter_checked(mapping.view(copy.offset, copy.size),
                                  self.buffers[copy.index])
            copied.append((copy.index, crc))
        if copied and clock() - started > 0.8 * self.lease_ttl:
            self.lease_ran_out([i for i, _ in copied])
            return
        for i, crc in copied:
            self.copied(i, crc)

    def shm_copies(self) -> list[ShmCopy]:
        """The objects to copy out of a mapping now."""
        out = []
        for i in sorted(self._open):
            route = self._route(i)
            if route is not None and route.shm_offset is not None:
                out.append(ShmCopy(i, route.node, route.shm_offset, self.sizes[i]))
        return out

    def tcp_requests(self) -> dict[str, list[int]]:
        """Per node, the indexes to ask it for now."""
        out: dict[str, list[int]] = {}
        for i in sorted(self._open):
            route = self._route(i)
            if route is not None and route.shm_offset is None:
                out.setdefault(route.node, []).append(i)
        return out

    def node_get(self, indexes: list[int]) -> GetRequest:
        """The ``get`` request for ``indexes`` (the checksums pick the version)."""
        return GetRequest([self.keys[i] for i in indexes],
                          [self.checksums[i] for i in indexes])

    # -- what happened -----------------------------------------------------------------

    def _advance(self, i: int) -> None:
        self._cursor[i] += 1
        if self._cursor[i] >= len(self._routes[i]):
            self._open.discard(i)

    def _verify(self, i: int, size: int, tier: Tier, crc: int | None = None) -> bool:
        """Whether object ``i``'s buffer holds its ``size`` bytes with its CRC-32C
        (``crc``, if the copy took it, else computed here over the buffer)."""
        expected = self.checksums[i]
        assert expected is not None  # only found objects are read
        if size == self.sizes[i] and (checksum(self.buffers[i], size) if crc is None
                                      else crc) == expected:
            self.results[i] = size
            self.tiers[i] = tier
            self._open.discard(i)
            return True
        route = self._routes[i][self._cursor[i]]
        self.corrupt.setdefault(route.node, []).append((self.keys[i], expected))
        self.stats.count(checksum_failures=1)
        log.warning("%r from node %s (%s) failed its checksum: not used", self.keys[i],
                    route.node, "shared memory" if route.shm_offset is not None else "TCP")
        self._advance(i)
        return False

    def copied(self, i: int, crc: int | None = None) -> bool:
        """The object was copied out of its mapping into its buffer (``crc``: the CRC-32C
        the copy took of the bytes it stored): check it."""
        return self._verify(i, self.sizes[i], Tier.DRAM, crc)

    def lease_ran_out(self, indexes: list[int]) -> None:
        """Copies that took so long that their lease may have expired under them: read
        them again, over TCP from the same node, before checking anything."""
        for i in indexes:
            self._advance(i)

    def received(self, i: int, size: int, tier: Tier = Tier.DRAM,
                 crc: int | None = None) -> bool:
        """The node answered for object ``i``: ``size`` bytes (read from its ``tier``) are
        in its buffer (``crc``: their CRC-32C, taken as they landed), or ``size`` < 0
        when the node no longer has it."""
        if size < 0:
            self._advance(i)
            return False
        return self._verify(i, size, tier, crc)

    def failed(self, node: str, indexes: list[int]) -> None:
        """``node`` could not deliver ``indexes`` (unreachable, timed out, or it failed
        the request): they move to their next replica."""
        self.health.down(node)
        self.stats.count(node_failures=len(indexes))
        for i in indexes:
            if i in self._open:
                self._advance(i)

    def take_corrupt(self) -> dict[str, tuple[list[str], list[int]]]:
        """Per node, the keys and checksums of copies that failed, to report there."""
        out = {node: ([k for k, _ in items], [c for _, c in items])
               for node, items in self.corrupt.items()}
        self.corrupt = {}
        return out


def split_by_bytes(sizes: list[int], limit: int | None) -> list[list[int]]:
    """Indexes of ``sizes`` in order, cut into runs of at most ``limit`` bytes each (an
    item larger than ``limit`` alone in its run): the requests one node get becomes."""
    if not limit or sum(sizes) <= limit:
        return [list(range(len(sizes)))]
    runs: list[list[int]] = [[]]
    total = 0
    for i, size in enumerate(sizes):
        if runs[-1] and total + size > limit:
            runs.append([])
            total = 0
        runs[-1].append(i)
        total += size
    return runs
