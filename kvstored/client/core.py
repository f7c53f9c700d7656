"""The client's logic, once, without I/O: what a put, a read or a query asks of the master
and the nodes, what each reply means, what is retried, and which error the caller sees.

Every operation of :class:`ClientCore` is a generator (a :data:`Step`) that yields
*effects* and is sent their results:

- :class:`Call`: send a request to the master (``node`` None) or to a node, and be sent
  the typed reply; a failure (the peer answered an error, or could not be reached, or
  timed out) is thrown into the step as a :class:`~kvstored.errors.StoreError`;
- :class:`Greet`: be sent a node's hello reply (connecting first if need be);
- :class:`Pause`: be resumed after some seconds.

A *shell* performs the effects with real I/O and drives the step with :func:`drive`
(blocking) or :func:`drive_async`: :class:`kvstored.client.sync.Client` over blocking
sockets, :class:`kvstored.aio.AsyncClient` over trio and
:class:`kvstored.asyncio.AsyncioClient` over asyncio (the two async ones share their
calls, :class:`kvstored.client.shell.AsyncShell`). A shell is a connection per peer and
these three effects. So the clients cannot drift: the same reply is the same result, or
the same error, in each.
"""

from __future__ import annotations

import logging
import math
import os
import secrets
import time
from collections.abc import Awaitable, Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

from kvstored.address import split_address
from kvstored.client.held import HeldCopy, HeldLocations
from kvstored.client.memory import HostMemory
from kvstored.client.metrics import CallKind, ClientMetrics, Outcome, metered
from kvstored.client.parts import checksum, gather, parts_of, views_of
from kvstored.client.read import MISSING, BatchRead, NodeHealth, ReadStats, split_by_bytes
from kvstored.client.segments import TRANSPORTS, Segments
from kvstored.errors import (
    BadRequestError,
    CorruptDataError,
    NoSpaceError,
    StoreError,
    UnreachableError,
)
from kvstored.hostid import host_id
from kvstored.protocol import MASTER_OPS, HelloReply, Message, PutStatus, Tier, ops
from kvstored.protocol.master_api import (
    Empty,
    Endpoint,
    KeysRequest,
    LockRequest,
    LookupRequest,
    NamespaceRequest,
    NodeContact,
    PutTargetRequest,
    RemovePrefixRequest,
    ReplicaInfo,
    StatRequest,
    UnlockRequest,
)
from kvstored.protocol.node_api import (
    GetReply,
    HeldGetRequest,
    PutReply,
    PutRequest,
    RegionRequest,
    RegisterMemoryRequest,
    ReportCorruptRequest,
)
from kvstored.protocol.ops import Rep, Req
from kvstored.sdk.errors import InvalidKeyError
from kvstored.sdk.types import MAX_KEY_BYTES, encode_key
from kvstored.security import ClientToken
from kvstored.wire import Buffer, Into, Parts

T = TypeVar("T")

log = logging.getLogger(__name__)

#: How long puts keep retrying when the target node is momentarily out of DRAM (the
#: master frees room by evicting offloaded objects within a heartbeat or two).
NO_SPACE_RETRY_SECONDS = 5.0
#: The pause between two such tries.
NO_SPACE_RETRY_PAUSE = 0.05


# -- effects ---------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Call:
    """Send ``request`` (an op of ``spec``) to the master (``node`` None) or a node;
    ``payload`` follows the request, the reply's payload is received into ``into``, and
    ``sums[i]`` (if given) set to the CRC-32C of item ``i`` as it lands: a check of a
    1 MiB object right after its receive finds it in the cache, one after the whole
    batch reads it again from memory. An item a shell leaves None is checked by the
    core itself."""

    spec: Any
    request: Message
    node: str | None = None
    payload: Sequence[Buffer] = ()
    into: Sequence[Into] | None = None
    sums: list[int | None] | None = None


@dataclass(frozen=True, slots=True)
class Greet:
    """The hello reply of ``node``."""

    node: str


@dataclass(frozen=True, slots=True)
class Pause:
    seconds: float


Effect = Call | Greet | Pause
#: An operation: yields effects, is sent their results, returns its own.
Step = Generator[Effect, Any, T]


def call(spec: ops.OpSpec[Req, Rep], request: Req, *, node: str | None = None,
         payload: Sequence[Buffer] = (), into: Sequence[Into] | None = None,
         sums: list[int | None] | None = None) -> Step[Rep]:
    """``reply = yield from call(...)``: one request, typed."""
    reply = yield Call(spec, request, node, payload, into, sums)
    return reply


def greet(node: str) -> Step[HelloReply]:
    hello = yield Greet(node)
    return hello


def drive(step: Step[T], perform: Callable[[Effect], Any]) -> T:
    """Run ``step``, performing its effects with ``perform`` (a blocking shell's loop).
    Only a ``StoreError`` of an effect goes back into the step; anything else ends it."""
    result: Any = None
    error: StoreError | None = None
    while True:
        try:
            effect = step.send(result) if error is None else step.throw(error)
        except StopIteration as done:
            return done.value
        try:
            result, error = perform(effect), None
        except StoreError as exc:
            result, error = None, exc


async def drive_async(step: Step[T], perform: Callable[[Effect], Awaitable[Any]]) -> T:
    """:func:`drive` for an async shell (trio or asyncio): ``perform`` is awaited."""
    result: Any = None
    error: StoreError | None = None
    while True:
        try:
            effect = step.send(result) if error is None else step.throw(error)
        except StopIteration as done:
            return done.value
        try:
            result, error = await perform(effect), None
        except StoreError as exc:
            result, error = None, exc


# -- results ---------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """What ``stat`` reports: the size, the CRC-32C of the value, and where it lives."""

    key: str
    size: int
    checksum: int
    replicas: tuple[ReplicaInfo, ...]
    reads: int = 0


def check_keys(keys: Sequence[str]) -> None:
    for key in keys:
        # An ASCII key's length is its size in UTF-8: most keys need no encoding to tell
        # (isascii is a flag of the string, not a scan).
        if type(key) is str and key.isascii() and 0 < len(key) <= MAX_KEY_BYTES:
            continue
        try:
            encode_key(key)
        except InvalidKeyError as exc:
            raise BadRequestError(exc.message, key=exc.key) from None


def parse_address(text: str) -> tuple[str, int]:
    try:
        return split_address(text)
    except ValueError as exc:
        raise BadRequestError(f"bad address {text!r}: {exc}") from None


class HeldRead(NamedTuple):
    """One key's read in one trip, planned by :meth:`ClientCore.plan_held_read`: the
    shell sends ``request`` (a ``get_held``) to ``node`` with ``into`` and hands the
    reply, or the StoreError of the call, to :meth:`ClientCore.finish_held_read`. (A
    tuple: one is made per get.)"""

    key: str
    node: str
    copy: HeldCopy
    view: Into
    request: HeldGetRequest
    into: list[Into]
    #: The shell's CRC-32C of the item as it lands (left None: the core takes it).
    sums: list[int | None]
    started: float


@dataclass(slots=True)
class _Put:
    """A batch put in progress: the values, and each key's result so far."""

    keys: list[str]
    #: Each value: one buffer, or its pieces (sent and copied as they are, never joined).
    views: list[Into]
    sizes: list[int]
    checksums: list[int]
    results: list[bool | None]

    def request(self, idx: list[int]) -> PutRequest:
        return PutRequest([self.keys[i] for i in idx], [self.sizes[i] for i in idx],
                          [self.checksums[i] for i in idx])


class ClientCore:
    """The state a client keeps (the nodes it knows, its same-host mappings, which nodes
    just failed, its counts) and its operations as steps (see the module docstring).
    ``clock`` is the shell's monotonic clock."""

    def __init__(self, master: str, *, transport: str, token: ClientToken,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if transport not in TRANSPORTS:
            raise BadRequestError(f"transport must be one of {', '.join(TRANSPORTS)}")
        self.master = parse_address(master)
        self.transport = transport
        self.token = token
        self.clock = clock
        self.segments = Segments(transport)
        #: What reads ran into: checksum failures, nodes that could not serve.
        self.stats = ReadStats()
        self.health = NodeHealth()
        #: How to reach each node this client heard of.
        self.nodes: dict[str, NodeContact] = {}
        #: In whose name this client's locks are held: its reads end them.
        self.holder = secrets.token_hex(16)
        #: Buffers over shared-memory files that same-host nodes move bytes to and from.
        self.memory = HostMemory()
        #: What this client's calls did (the ``@metered`` operations count them).
        self.metrics = ClientMetrics()
        #: Where keys this client put or read live, to read them again in one trip.
        self.held = HeldLocations(clock)

    def endpoint(self, node: str | None) -> tuple[str, int]:
        """The address of the master (None) or of ``node``."""
        if node is None:
            return self.master
        contact = self.nodes.get(node)
        if contact is None:
            raise UnreachableError(f"no address is known for node {node}")
        return contact.endpoint.host, contact.endpoint.port

    # -- writes ------------------------------------------------------------------------------

    @metered(CallKind.PUT)
    def batch_put(self, keys: Sequence[str], values: Sequence[Any]) -> Step[list[bool]]:
        """Store objects; True for each stored now, False for each that existed."""
        keys = list(keys)
        if len(keys) != len(values):
            raise BadRequestError(f"{len(keys)} keys but {len(values)} values")
        check_keys(keys)
        views: list[Into] = [memoryview(v).cast("B") for v in values]
        return (yield from self._put(keys, views))

    @metered(CallKind.PUT)
    def batch_put_parts(self, keys: Sequence[str], objects: Sequence[Any]
                        ) -> Step[list[bool]]:
        """As :meth:`batch_put`, each object given as its pieces (buffers, concatenated
        in order): over TCP they go out in one ``sendmsg`` scatter list, to a mapped
        segment one copy per piece; never joined first (see kvstored.client.parts)."""
        keys = list(keys)
        if len(keys) != len(objects):
            raise BadRequestError(f"{len(keys)} keys but {len(objects)} lists of pieces")
        check_keys(keys)
        views: list[Into] = [parts_of(obj, key=key, writable=False)
                             for key, obj in zip(keys, objects)]
        return (yield from self._put(keys, views))

    def _put(self, keys: list[str], views: list[Into]) -> Step[list[bool]]:
        put = _Put(keys, views, [v.nbytes for v in views], [checksum(v) for v in views],
                   [None] * len(keys))
        todo = list(range(len(keys)))
        deadline = self.clock() + NO_SPACE_RETRY_SECONDS
        while todo:
            todo, why = yield from self._put_round(put, todo)
            if not todo:
                break
            if self.clock() > deadline:
                why = why or "the cluster is full of objects that cannot be evicted yet"
                raise NoSpaceError(f"no DRAM room for {len(todo)} object(s) after "
                                   f"{NO_SPACE_RETRY_SECONDS:.0f}s: {why}", key=keys[todo[0]])
            yield Pause(NO_SPACE_RETRY_PAUSE)
        return [bool(r) for r in put.results]

    def _put_round(self, put: _Put, todo: list[int]) -> Step[tuple[list[int], str | None]]:
        """One placement and one request per node: the indexes to try again (no DRAM
        room there yet) and the node's account of why."""
        reply = yield from call(ops.PUT_TARGET, PutTargetRequest(
            [put.keys[i] for i in todo], [put.sizes[i] for i in todo], host_id()))
        self.nodes.update(reply.nodes)
        by_node: dict[str, list[int]] = {}
        for i, target in zip(todo, reply.targets):
            if target is None:
                put.results[i] = False  # the key exists, or another put of it is on
            else:
                by_node.setdefault(target, []).append(i)
        retry: list[int] = []
        why = None
        for node, idx in by_node.items():
            try:
                placed = yield from self._put_on_node(node, put, idx)
            except StoreError:
                yield from call(ops.PUT_ABORT, KeysRequest([put.keys[i] for i in idx]))
                raise
            why = placed.no_space or why
            retry += yield from self._settle(node, put, idx, placed.results)
        return retry, why

    def _settle(self, node: str, put: _Put, idx: list[int], results: list[PutStatus]
                ) -> Step[list[int]]:
        """Record a node's answer; release the reservations of what it did not store,
        and raise for what must not be retried. Returns the indexes to try again."""
        retry: list[int] = []
        failure: StoreError | None = None
        for i, status in zip(idx, results):
            if status is PutStatus.OK or status is PutStatus.EXISTS:
                put.results[i] = status is PutStatus.OK
                if status is PutStatus.OK:
                    self.held.remember(put.keys[i], node, put.sizes[i], put.checksums[i])
                continue
            if status is PutStatus.NO_SPACE:
                retry.append(i)
            elif failure is None:
                failure = _put_failure(node, put.keys[i], status)
        released = [put.keys[i] for i, status in zip(idx, results)
                    if status is not PutStatus.OK and status is not PutStatus.EXISTS]
        if released:
            yield from call(ops.PUT_ABORT, KeysRequest(released))
        if failure is not None:
            raise failure
        return retry

    def _put_on_node(self, node: str, put: _Put, idx: list[int]) -> Step[PutReply]:
        """Send ``idx`` to ``node``: over TCP, or through its mapped segment."""
        mapping = self.segments.mapping(node, self.nodes[node])
        request = put.request(idx)
        if mapping is None:
            return (yield from call(ops.PUT, request, node=node,
                                    payload=[v for i in idx for v in views_of(put.views[i])]))
        allocated = yield from call(ops.ALLOC, request, node=node)
        status: dict[int, PutStatus] = {}
        rooms: dict[int, int] = {}  # what this client copies into the segment itself
        placed: dict[int, int] = {}
        by_region: dict[tuple[int, str], tuple[list[int], list[list[int]]]] = {}
        for i, offset in zip(idx, allocated.offsets):
            if offset is None:
                status[i] = PutStatus.NO_SPACE
                continue
            placed[i] = offset
            where = yield from self._in_region(node, put.views[i], put.sizes[i])
            if where is None:
                rooms[i] = offset
                continue
            moved, extents = by_region.setdefault(where[0], ([], []))
            moved.append(i)
            extents.append(where[1])
        for (region, token), (moved, extents) in by_region.items():
            try:
                outcome = yield from call(ops.COPY_IN, RegionRequest(
                    [put.keys[i] for i in moved], region, token, extents), node=node)
            except BadRequestError:
                self.memory.forget(node)  # the region is gone there: copy them here
                rooms.update((i, placed[i]) for i in moved)
                continue
            status.update(zip(moved, outcome.results))
            self.memory.stats.count(moved=len(moved),
                                    moved_bytes=sum(put.sizes[i] for i in moved))
        sealed = list(rooms)
        for i, offset in rooms.items():
            gather(put.views[i], mapping.view(offset, put.sizes[i]))
        if sealed:
            outcome = yield from call(ops.SEAL, KeysRequest([put.keys[i] for i in sealed]),
                                      node=node)
            status.update(zip(sealed, outcome.results))
        return PutReply([status[i] for i in idx], allocated.no_space)

    # -- reads -------------------------------------------------------------------------------

    def read(self, keys: Sequence[str], buffers: list[Any],
             tiers: list[Tier | None] | None = None) -> Step[list[int]]:
        """Read each key in one trip from the node this client last found it on (see
        kvstored.client.held); the others, and any that node no longer serves, are looked
        up (one master round trip), then copied from a mapped segment or fetched from
        their node, falling back to other replicas (see BatchRead). Per key the length
        read, or MISSING. An empty ``buffers`` is filled with new bytearrays. ``tiers``,
        if given, is filled with the tier each key was read from (None where missing)."""
        keys = list(keys)
        check_keys(keys)
        fresh = not buffers
        direct = self.held.plan(keys, self._ask_directly)
        if not direct:
            return (yield from self._read_looked_up(keys, buffers, tiers))
        results = [MISSING] * len(keys)
        from_ssd: set[int] = set()
        if fresh:
            buffers.extend([None] * len(keys))
        for node, picked in direct.items():
            yield from self._get_held(node, keys, picked, buffers, results, from_ssd)
        got_tiers: list[Tier | None] = [
            None if n < 0 else Tier.SSD if i in from_ssd else Tier.DRAM
            for i, n in enumerate(results)]
        rest = [i for i, n in enumerate(results) if n < 0]
        if not rest:
            if tiers is not None:
                tiers[:] = got_tiers
            return results
        sub_buffers = [] if fresh else [buffers[i] for i in rest]
        sub_tiers: list[Tier | None] = []
        sub = yield from self._read_looked_up([keys[i] for i in rest], sub_buffers, sub_tiers)
        for j, i in enumerate(rest):
            results[i], got_tiers[i] = sub[j], sub_tiers[j]
            if fresh:
                buffers[i] = sub_buffers[j]
        if tiers is not None:
            tiers[:] = got_tiers
        return results

    # A single key this client holds a location for is read without the step machinery
    # (a generator per layer, an effect, the drive loop: on a single 64 KiB get, a
    # fifth of the client's time). The core still decides: it plans the one call and
    # judges its reply with the same code as a batch (_held_failed, _held_item); the
    # shell only performs the call. Anything else, and any miss, is read by read_into.

    def plan_held_read(self, key: str, buffer: Any) -> HeldRead | None:
        """The get_held of ``key`` into ``buffer`` if this client knows a node serving
        it, else None (use :meth:`read_into`)."""
        copy = self.held.one(key) if type(key) is str else None
        if copy is None or not self._ask_directly(copy.node):
            return None
        view = _into(buffer)
        if len(view) < copy.size:
            return None
        return HeldRead(key, copy.node, copy, view, HeldGetRequest([key], [copy.checksum]),
                        [view], [None], self.clock())

    def finish_held_read(self, read: HeldRead, reply: GetReply | StoreError) -> int | None:
        """The length read into ``read``'s buffer, counted as a get; None if the node did
        not serve it (nothing counted: :meth:`read_into` reads it the usual way)."""
        if isinstance(reply, StoreError):
            self._held_failed(read.node, [read.key])
            return None
        size = reply.sizes[0] if len(reply.sizes) == 1 else MISSING
        if not self._held_item(read.node, read.key, read.copy, read.view, size,
                               read.sums[0]):
            return None
        self.metrics.record(CallKind.GET, self.clock() - read.started,
                            Outcome(1, 1, 0, size))
        return size

    def _held_failed(self, node: str, keys: list[str]) -> None:
        """``node`` could not serve a get_held of ``keys``."""
        # Counted as the lookup path counts a node that could not serve (ReadStats).
        self.health.down(node)
        self.stats.count(node_failures=len(keys))
        self.held.forget(keys)

    def _held_item(self, node: str, key: str, copy: HeldCopy, view: Into, size: int,
                   crc: int | None) -> bool:
        """Whether the ``size`` bytes ``node`` sent into ``view`` for ``key`` are the
        value (``crc``: their CRC-32C as the shell took it; None: taken here); if not,
        the key's location is forgotten."""
        if size == copy.size and (checksum(view, size) if crc is None
                                  else crc) == copy.checksum:
            return True
        self.held.forget([key])
        if size == copy.size:  # the version asked for, with other bytes: corrupt
            self.stats.count(checksum_failures=1)
            log.warning("%r from node %s (get_held) failed its checksum: not used", key, node)
        return False

    def _ask_directly(self, node: str) -> bool:
        """Whether to read from ``node`` with get_held: over TCP (a node whose segment is
        mapped here is read through the mapping, under a lookup's lease), and not just
        failed."""
        contact = self.nodes.get(node)
        return (contact is not None and self.segments.transport != "shm"
                and not self.health.is_down(node)
                and self.segments.mapping(node, contact) is None)

    def _get_held(self, node: str, keys: list[str], picked: list[tuple[int, HeldCopy]],
                  buffers: list[Any], results: list[int], from_ssd: set[int]) -> Step[None]:
        """Ask ``node`` for ``picked`` (indexes, and what is known of them) without a
        lookup; what it serves and passes the checksum is in ``results`` (its index in
        ``from_ssd`` if the node read it from SSD), the rest is forgotten (and read the
        usual way, as is a key whose buffer is too small: that read says what is wrong
        with it)."""
        idx: list[int] = []
        held: list[HeldCopy] = []
        views: list[Into] = []
        for i, copy in picked:
            buffer = buffers[i]
            if buffer is None:
                buffer = buffers[i] = bytearray(copy.size)
                view: Into = memoryview(buffer)
            else:
                view = _into(buffer)
                if len(view) < copy.size:
                    continue
            idx.append(i)
            held.append(copy)
            views.append(view)
        if not idx:
            return
        sums: list[int | None] = [None] * len(idx)  # a shell that fills none: checked here
        try:
            reply = yield from call(ops.GET_HELD, HeldGetRequest(
                [keys[i] for i in idx], [c.checksum for c in held]), node=node, into=views,
                sums=sums)
        except StoreError:
            self._held_failed(node, [keys[i] for i in idx])
            return
        for i, copy, view, crc, size in zip(idx, held, views, sums, reply.sizes):
            if self._held_item(node, keys[i], copy, view, size, crc):
                results[i] = size
        from_ssd.update(idx[j] for j in reply.from_ssd)

    def _read_looked_up(self, keys: list[str], buffers: list[Any],
                        tiers: list[Tier | None] | None) -> Step[list[int]]:
        """The usual read: a lookup, then the nodes (see :meth:`read`)."""
        self.held.unlocked(keys)  # the lookup ends this client's locks on them
        started = self.clock()
        reply = yield from call(ops.LOOKUP, LookupRequest(keys, holder=self.holder))
        self.nodes.update(reply.nodes)
        read = BatchRead(keys, reply, buffers, self.segments, self.health, self.stats)
        while read.pending:
            yield from self._copy_out(read)
            read.copy_from_segments(started, self.clock)
            yield from self._report_corrupt(read)
            for node, idx in read.tcp_requests().items():
                yield from self._get_from_node(read, node, idx)
            yield from self._report_corrupt(read)
        if tiers is not None:
            tiers[:] = read.tiers
        return read.results

    @metered(CallKind.GET)
    def read_into(self, keys: Sequence[str], buffers: Sequence[Any],
                  tiers: list[Tier | None] | None = None) -> Step[list[int]]:
        if len(keys) != len(buffers):
            raise BadRequestError(f"{len(keys)} keys but {len(buffers)} buffers")
        return (yield from self.read(keys, list(buffers), tiers))

    @metered(CallKind.GET)
    def read_into_parts(self, keys: Sequence[str], objects: Sequence[Any],
                        tiers: list[Tier | None] | None = None) -> Step[list[int]]:
        """As :meth:`read_into`, each object landing in its pieces (buffers filled in
        order): received over TCP straight into them, copied out of a mapped segment one
        piece at a time; the CRC-32C is chained over them. Pieces holding fewer bytes
        than the object are a BadRequestError before any byte lands; an object shorter
        than its pieces fills their start."""
        keys = list(keys)
        if len(keys) != len(objects):
            raise BadRequestError(f"{len(keys)} keys but {len(objects)} lists of pieces")
        check_keys(keys)
        return (yield from self.read(keys, [parts_of(obj, key=key, writable=True)
                                            for key, obj in zip(keys, objects)], tiers))

    @metered(CallKind.GET)
    def read_values(self, keys: Sequence[str]) -> Step[list[bytes | None]]:
        buffers: list[Any] = []
        results = yield from self.read(keys, buffers)
        return [bytes(memoryview(b)[:n]) if n >= 0 else None
                for b, n in zip(buffers, results)]

    def _copy_out(self, read: BatchRead) -> Step[None]:
        """Have same-host nodes write the objects bound for registered memory there
        themselves; whatever they do not (a refused region, an object gone from DRAM)
        goes on as a copy out of the segment, or over TCP."""
        if not self.memory.buffers:
            return
        groups: dict[tuple[str, int, str], tuple[list[int], list[list[int]]]] = {}
        for copy in read.shm_copies():
            where = yield from self._in_region(copy.node, read.buffers[copy.index],
                                               copy.size)
            if where is not None:
                idx, extents = groups.setdefault((copy.node, *where[0]), ([], []))
                idx.append(copy.index)
                extents.append(where[1])
        for (node, region, token), (idx, extents) in groups.items():
            try:
                reply = yield from call(ops.COPY_OUT, RegionRequest(
                    [read.keys[i] for i in idx], region, token, extents,
                    [read.checksums[i] for i in idx]), node=node)
            except StoreError:
                self.memory.forget(node)  # copied out of the segment instead
                continue
            for i, size in zip(idx, reply.sizes):
                if read.received(i, size, Tier.DRAM):
                    self.memory.stats.count(moved=1, moved_bytes=size)

    # -- registered host memory ----------------------------------------------------------

    def register_memory(self, buffer: Any, fd: int) -> None:
        """Register ``buffer``, this process's mapping (from its start) of the
        shared-memory file open as ``fd``: see kvstored.client.memory."""
        self.memory.add(buffer, fd)

    def _in_region(self, node: str, value: Into, size: int
                   ) -> Step[tuple[tuple[int, str], list[int]] | None]:
        """``node``'s region and the extents holding the first ``size`` bytes of
        ``value``, registering the buffer there on first use; None: the client copies
        (not in registered memory, or the node does not take it)."""
        found = self.memory.locate(value, size)
        if found is None:
            return None
        index, extents = found
        known = self.memory.regions.get((node, index))
        if isinstance(known, str):
            self.memory.stats.count(fallback=1)
            return None
        if known is None:
            buf = self.memory.buffers[index]
            try:
                reply = yield from call(ops.REGISTER_MEMORY, RegisterMemoryRequest(
                    os.getpid(), buf.fd, buf.device, buf.inode, buf.size, host_id()),
                    node=node)
            except BadRequestError as exc:
                self.memory.refused(node, index, exc.message)
                self.memory.stats.count(fallback=1)
                return None
            except StoreError:
                self.memory.stats.count(fallback=1)
                return None  # not now (the node is busy or going): ask again next time
            known = self.memory.regions[(node, index)] = (reply.region, reply.token)
        return known, extents

    def _get_from_node(self, read: BatchRead, node: str, idx: list[int]) -> Step[None]:
        """Fetch ``idx`` from ``node`` into their buffers; whatever it cannot deliver is
        handed back to ``read`` as failed (never raised: a read falls back or misses)."""
        try:
            hello = yield from greet(node)
        except StoreError:
            read.failed(node, idx)
            return
        # A node stages at most max_read_staging bytes of SSD reads for one request.
        parts = split_by_bytes([max(read.sizes[i], 0) for i in idx], hello.max_read_staging)
        for n, part in enumerate(parts):
            chunk = [idx[j] for j in part]
            sums: list[int | None] = [None] * len(chunk)
            try:
                reply = yield from call(ops.GET, read.node_get(chunk), node=node,
                                        into=[read.buffers[i] for i in chunk], sums=sums)
            except StoreError:
                read.failed(node, [idx[j] for later in parts[n:] for j in later])
                return
            from_ssd = {chunk[j] for j in reply.from_ssd if j < len(chunk)}
            held = {chunk[j] for j in reply.held if j < len(chunk)}
            for i, size, crc in zip(chunk, reply.sizes, sums):
                if read.received(i, size, Tier.SSD if i in from_ssd else Tier.DRAM, crc) \
                        and i in held:
                    checksum = read.checksums[i]
                    assert checksum is not None  # found by the lookup
                    self.held.remember(read.keys[i], node, size, checksum)

    def _report_corrupt(self, read: BatchRead) -> Step[None]:
        """Tell nodes which of their copies failed the checksum here; each checks its
        own copy and drops it if bad (best effort: a read never fails over this)."""
        for node, (keys, checksums) in read.take_corrupt().items():
            try:
                yield from call(ops.REPORT_CORRUPT, ReportCorruptRequest(keys, checksums),
                                node=node)
            except StoreError:
                pass

    # -- metadata ----------------------------------------------------------------------------

    @metered(CallKind.EXISTS)
    def batch_exists(self, keys: Sequence[str]) -> Step[list[bool]]:
        return (yield from call(ops.EXISTS, KeysRequest(list(keys)))).exists

    @metered(CallKind.PREFIX_HITS)
    def prefix_hits(self, keys: Sequence[str], lock_for: float | None = None) -> Step[int]:
        """How many leading keys exist (the prefix-cache rule of HiCache and LMCache);
        with ``lock_for``, those are also locked for that many seconds (as
        :meth:`batch_lookup_and_lock`), and none after the first miss."""
        if lock_for is None:
            return (yield from call(ops.PREFIX_HITS, KeysRequest(list(keys)))).hits
        locked = yield from self._lock(keys, lock_for, leading=True)
        return locked.index(False) if False in locked else len(locked)

    @metered(CallKind.LOOKUP_AND_LOCK)
    def batch_lookup_and_lock(self, keys: Sequence[str], ttl: float) -> Step[list[bool]]:
        """Which keys exist; each that does is locked against eviction for ``ttl``
        seconds (cut to the master's ``master.max_lock_ttl``), until this client reads
        it, unlocks it, or the time is up."""
        return (yield from self._lock(keys, ttl, leading=False))

    def _lock(self, keys: Sequence[str], ttl: float, *, leading: bool) -> Step[list[bool]]:
        if isinstance(ttl, bool) or not isinstance(ttl, int | float) \
                or not math.isfinite(ttl) or ttl <= 0:
            raise BadRequestError(f"a lock lasts a positive number of seconds, not {ttl!r}")
        keys = list(keys)
        reply = yield from call(ops.LOCK, LockRequest(keys, self.holder, float(ttl),
                                                      leading))
        self.held.locked(keys, reply.locked, reply.ttl)
        return reply.locked

    @metered(CallKind.UNLOCK)
    def batch_unlock(self, keys: Sequence[str]) -> Step[list[bool]]:
        """End this client's locks on ``keys``; True where it held one still running."""
        self.held.unlocked(keys)
        return (yield from call(ops.UNLOCK, UnlockRequest(list(keys), self.holder))).unlocked

    @metered(CallKind.REMOVE)
    def batch_remove(self, keys: Sequence[str]) -> Step[list[bool]]:
        self.held.forget(keys)
        return (yield from call(ops.REMOVE, KeysRequest(list(keys)))).removed

    @metered(CallKind.REMOVE_PREFIX)
    def batch_remove_prefix(self, prefix: str) -> Step[int]:
        """Remove every object whose key starts with ``prefix`` (not empty); how many
        went. Puts under it in flight now are cancelled (they report not stored)."""
        if not isinstance(prefix, str) or not prefix:
            raise BadRequestError("batch_remove_prefix needs a non-empty prefix (an empty "
                                  "one would be every object in the store)")
        check_keys([prefix])
        self.held.forget_prefix(prefix)
        return (yield from call(ops.REMOVE_PREFIX, RemovePrefixRequest(prefix))).removed

    @metered(CallKind.REGISTER_NAMESPACE)
    def register_namespace(self, prefix: str) -> Step[int]:
        """Have the master count the objects under ``prefix`` (a key prefix ending in
        ``/``) as a namespace; how many it holds now."""
        check_keys([prefix])
        return (yield from call(ops.ADD_NAMESPACE, NamespaceRequest(prefix))).objects

    @metered(CallKind.STAT)
    def stat(self, key: str) -> Step[ObjectInfo | None]:
        return (yield from self._stat(key))

    def _stat(self, key: str) -> Step[ObjectInfo | None]:
        try:
            found = (yield from call(ops.STAT, StatRequest(key))).object
        except StoreError as exc:
            if exc.code == "not_found":
                return None
            raise
        return ObjectInfo(found.key, found.size, found.checksum, tuple(found.replicas),
                          found.reads)

    @metered(CallKind.LOCATE)
    def locate(self, key: str) -> Step[dict[str, dict[str, Any]]]:
        """Where each node holding ``key`` keeps its bytes (see ``Client.locate``)."""
        info = yield from self._stat(key)
        if info is None:
            return {}
        holders = sorted({r.node for r in info.replicas})
        if any(n not in self.nodes for n in holders):
            # Nodes this client never talked to: their addresses are in the status.
            for status in (yield from call(ops.STATUS, _EMPTY)).nodes:
                if status.node not in self.nodes and status.node in holders:
                    host, port = parse_address(status.address)
                    self.nodes[status.node] = NodeContact(
                        Endpoint(host, port), host_id="", segment="", segment_token="")
        out: dict[str, dict[str, Any]] = {}
        for node in holders:
            try:
                found = yield from call(ops.LOCATE, KeysRequest([key]), node=node)
                out[node] = found.locations[0].to_wire()
            except StoreError as exc:
                out[node] = {"error": f"node {node} could not be asked: {exc}"}
        return out

    @metered(CallKind.CALL)
    def raw(self, op: str, args: dict[str, Any]) -> Step[dict[str, Any]]:
        """A master request from its wire fields, and its reply as a map (the admin
        tools' ``Client.call``). The request is checked here as the master would."""
        spec = MASTER_OPS.get(op)
        if spec is None:
            raise BadRequestError(f"unknown op {op!r}; known: {', '.join(sorted(MASTER_OPS))}")
        reply = yield from call(spec, spec.check({"op": op, **args}))
        return ops.OpSpec.reply_header(reply)


_EMPTY = Empty()


def _into(buffer: Any) -> Into:
    """Where a read lands: the pieces of a scatter/gather object, or one flat buffer."""
    return buffer if isinstance(buffer, Parts) else memoryview(buffer).cast("B")


def _put_failure(node: str, key: str, status: PutStatus) -> StoreError:
    """The error of a put that a node refused for good."""
    if status is PutStatus.CORRUPT:
        return CorruptDataError(f"node {node} received bytes that fail their checksum; "
                                "nothing was stored", key=key)
    if status is PutStatus.MISSING:
        return UnreachableError(f"node {node} no longer held the room for this put when it "
                                "was sealed (it waited longer than master.put_timeout)",
                                key=key)
    return StoreError(f"node {node} answered the put with {status!r}", key=key)
