"""What the blocking and the trio clients share: request checks, result types, the
same-host segment mappings, and the read core (:class:`BatchRead`), which decides
without doing any I/O where each object of a batch read comes from and what a reply
means, so that both clients behave alike."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from crc32c import crc32c

from kvstored.config import ConfigError
from kvstored.errors import BadRequestError, NoSpaceError
from kvstored.hostid import host_id
from kvstored.sdk.errors import InvalidKeyError
from kvstored.sdk.types import encode_key
from kvstored.security import ClientToken, find_client_token

log = logging.getLogger(__name__)

TRANSPORTS = ("auto", "tcp", "shm")
#: Missing: the value ``get_into`` and ``batch_get_into`` report for an absent key.
MISSING = -1


@dataclass(frozen=True, slots=True)
class ReplicaInfo:
    node: str
    tier: str
    state: str


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """What ``stat`` reports: the size, the CRC-32C of the value, and where it lives."""

    key: str
    size: int
    checksum: int
    replicas: tuple[ReplicaInfo, ...]
    reads: int = 0

    @classmethod
    def from_wire(cls, obj: dict[str, Any]) -> ObjectInfo:
        return cls(obj["key"], obj["size"], obj["checksum"],
                   tuple(ReplicaInfo(r["node"], r["tier"], r["state"]) for r in obj["replicas"]),
                   obj.get("reads", 0))


def check_keys(keys: list[str]) -> None:
    for key in keys:
        try:
            encode_key(key)
        except InvalidKeyError as exc:
            raise BadRequestError(exc.message, key=exc.key) from None


def prepare_values(keys: list[str], values: list[Any]) -> tuple[list[memoryview], list[int],
                                                                list[int]]:
    if len(keys) != len(values):
        raise BadRequestError(f"{len(keys)} keys but {len(values)} values")
    check_keys(keys)
    views = [memoryview(v).cast("B") for v in values]
    return views, [v.nbytes for v in views], [crc32c(v) for v in views]


def parse_address(text: str) -> tuple[str, int]:
    from kvstored.config import split_address

    try:
        return split_address(text)
    except ValueError as exc:
        raise BadRequestError(f"bad address {text!r}: {exc}") from None


class Segments:
    """Same-host segment mappings, attached on first use; nodes that cannot be mapped
    are remembered so the client does not retry on every read."""

    def __init__(self, transport: str) -> None:
        self.transport = transport
        self._maps: dict[str, Any] = {}
        self._refused: set[str] = set()
        self._lock = threading.Lock()

    def mapping(self, node: str, info: dict[str, Any]):
        if self.transport == "tcp" or node in self._refused:
            return None
        with self._lock:
            existing = self._maps.get(node)
            if existing is not None:
                if existing[0] == (info["segment"], info["token"]):
                    return existing[1]
                # The node restarted with a new segment under the same name: the old
                # mapping shows freed memory, never read through it again.
                self._maps.pop(node)[1].close()
            if info.get("host") != host_id():
                self._refused.add(node)
                return None
            from kvstored.node.segment import SegmentMapping, SegmentUnavailable

            try:
                mapping = SegmentMapping.attach(info["segment"], bytes.fromhex(info["token"]))
            except (SegmentUnavailable, OSError) as exc:
                log.info("node %s: shared memory unavailable (%s); using TCP", node, exc)
                self._refused.add(node)
                return None
            self._maps[node] = ((info["segment"], info["token"]), mapping)
            return mapping

    def forget(self, node: str) -> None:
        with self._lock:
            entry = self._maps.pop(node, None)
        if entry is not None:
            entry[1].close()

    def close(self) -> None:
        for node in list(self._maps):
            self.forget(node)


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


class BatchRead:
    """One batch read, as a state machine without I/O.

    For each object found by the lookup, its replicas become :class:`Route` s tried in
    order: the mapped segment of a DRAM replica on this host, then a TCP get from each
    node holding a replica (DRAM copies first). A route that fails moves the object to
    the next: the node cannot be reached or fails the request, the node no longer has
    it, or the bytes fail the object's CRC-32C (which every copy handed to the caller is
    checked against). An object with no route left is a clean miss: a read never raises
    because a node is down. Bad copies are collected in :attr:`corrupt` so that the
    client can tell their nodes.

    The caller loops while :attr:`pending`: it copies :meth:`shm_copies` and calls
    :meth:`copied`, fetches :meth:`tcp_requests` and calls :meth:`received` per item or
    :meth:`failed` for what a node could not deliver, then sends :meth:`take_corrupt`.
    """

    def __init__(self, keys: list[str], reply: dict[str, Any], buffers: list[Any],
                 segments: Segments, health: NodeHealth, stats: ReadStats) -> None:
        """``buffers`` are the caller's, one per key; an empty list is filled with new
        bytearrays of the objects' sizes."""
        if not buffers:
            buffers.extend(bytearray(o[0]) if o else bytearray() for o in reply["objects"])
        buffers = [memoryview(b).cast("B") for b in buffers]
        self.keys = keys
        self.buffers = buffers
        self.segments = segments
        self.health = health
        self.stats = stats
        self.nodes: dict[str, dict[str, Any]] = reply["nodes"]
        self.lease_ttl = float(reply.get("lease_ttl", 0.0))
        self.results = [MISSING] * len(keys)
        self.sizes: list[int] = []
        self.checksums: list[int | None] = []
        self._routes: list[list[Route]] = []
        self._cursor: list[int] = []
        self._open: set[int] = set()
        self.corrupt: dict[str, list[tuple[str, int]]] = {}
        for i, found in enumerate(reply["objects"]):
            if found is None:
                self.sizes.append(MISSING)
                self.checksums.append(None)
                self._routes.append([])
                self._cursor.append(0)
                continue
            size, checksum, replicas = found
            if len(buffers[i]) < size:
                raise BadRequestError(f"the buffer holds {len(buffers[i])} bytes but the "
                                      f"object is {size}; pass a buffer of at least {size}",
                                      key=keys[i])
            self.sizes.append(size)
            self.checksums.append(checksum)
            self._routes.append(self._plan(replicas))
            self._cursor.append(0)
            if not self._routes[i]:
                raise BadRequestError("transport='shm' but the object is not in a DRAM "
                                      "segment on this host; use transport='auto'",
                                      key=keys[i])
            self._open.add(i)

    def _plan(self, replicas: list[list[Any]]) -> list[Route]:
        routes: list[Route] = []
        for node, tier, offset in replicas:
            if tier == "dram" and self.segments.mapping(node, self.nodes[node]) is not None:
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
        copies = self.shm_copies()
        for i, node, offset, size in copies:
            self.buffers[i][:size] = self.segments.mapping(node, self.nodes[node]).view(
                offset, size)
        if copies and clock() - started > 0.8 * self.lease_ttl:
            self.lease_ran_out([c[0] for c in copies])
            return
        for copy in copies:
            self.copied(copy[0])

    def shm_copies(self) -> list[tuple[int, str, int, int]]:
        """``(index, node, offset, size)`` of each object to copy out of a mapping now."""
        out = []
        for i in sorted(self._open):
            route = self._route(i)
            if route is not None and route.shm_offset is not None:
                out.append((i, route.node, route.shm_offset, self.sizes[i]))
        return out

    def tcp_requests(self) -> dict[str, list[int]]:
        """Per node, the indexes to ask it for now."""
        out: dict[str, list[int]] = {}
        for i in sorted(self._open):
            route = self._route(i)
            if route is not None and route.shm_offset is None:
                out.setdefault(route.node, []).append(i)
        return out

    def node_get(self, indexes: list[int]) -> dict[str, Any]:
        """The ``get`` request header for ``indexes`` (the checksums pick the version)."""
        return {"op": "get", "keys": [self.keys[i] for i in indexes],
                "checksums": [self.checksums[i] for i in indexes]}

    # -- what happened -----------------------------------------------------------------

    def _advance(self, i: int) -> None:
        self._cursor[i] += 1
        if self._cursor[i] >= len(self._routes[i]):
            self._open.discard(i)

    def _verify(self, i: int, size: int) -> bool:
        if size == self.sizes[i] and crc32c(self.buffers[i][:size]) == self.checksums[i]:
            self.results[i] = size
            self._open.discard(i)
            return True
        route = self._routes[i][self._cursor[i]]
        self.corrupt.setdefault(route.node, []).append((self.keys[i], self.checksums[i]))
        self.stats.count(checksum_failures=1)
        log.warning("%r from node %s (%s) failed its checksum: not used", self.keys[i],
                    route.node, "shared memory" if route.shm_offset is not None else "TCP")
        self._advance(i)
        return False

    def copied(self, i: int) -> bool:
        """The object was copied out of its mapping into its buffer: check it."""
        return self._verify(i, self.sizes[i])

    def lease_ran_out(self, indexes: list[int]) -> None:
        """Copies that took so long that their lease may have expired under them: read
        them again, over TCP from the same node, before checking anything."""
        for i in indexes:
            self._advance(i)

    def received(self, i: int, size: int) -> bool:
        """The node answered for object ``i``: ``size`` bytes are in its buffer, or
        ``size`` < 0 when the node no longer has it."""
        if size < 0:
            self._advance(i)
            return False
        return self._verify(i, size)

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


def no_room_error(count: int, waited: float, reason: str | None, key: str) -> NoSpaceError:
    """The error of a put that found no DRAM room for ``waited`` seconds, with the node's
    own account of why (its DRAM is full and, say, its SSD too)."""
    why = reason or ("the cluster is full of objects that cannot be evicted yet")
    return NoSpaceError(f"no DRAM room for {count} object(s) after {waited:.0f}s: {why}",
                        key=key)


def client_token(token: str | None, token_file: str | None) -> ClientToken:
    """The token a client presents (see :func:`kvstored.security.find_client_token`)."""
    try:
        return find_client_token(token, token_file)
    except ConfigError as exc:
        raise BadRequestError(str(exc)) from None


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


def client_host() -> str:
    return host_id()
