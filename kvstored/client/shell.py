"""What the shells share around the sans-IO :class:`ClientCore`: finding the token,
building the core, the views of it they all expose (:class:`CoreShell`), and the calls
of the two async shells, once (:class:`AsyncShell`: trio's and asyncio's differ only in
how they perform an effect).

Not the I/O itself: each shell performs the core's effects its own way.
"""

from __future__ import annotations

import time
from collections.abc import Generator, Mapping, Sequence
from typing import Any, Generic, Protocol, TypedDict, TypeVar, Unpack

from prometheus_client import CollectorRegistry
from prometheus_client.registry import Collector

from kvstored.client.core import (
    Call,
    ClientCore,
    Effect,
    Greet,
    ObjectInfo,
    Pause,
    Step,
    drive_async,
)
from kvstored.client.memory import HostMemory
from kvstored.client.metrics import MetricsSnapshot, register_metrics
from kvstored.client.read import ReadStats
from kvstored.client.segments import Segments
from kvstored.errors import BadRequestError, ConfigError, StoreError, UnauthorizedError
from kvstored.protocol import HelloReply, OpSpec, Tier
from kvstored.protocol.master_api import NodeContact
from kvstored.protocol.node_api import GetReply
from kvstored.protocol.ops import GET_HELD, Rep, Req
from kvstored.security import find_client_token
from kvstored.wire import Buffer, Into

T = TypeVar("T")
S = TypeVar("S", bound="AsyncShell")


class CoreShell:
    """Base of every client (:class:`kvstored.Client`, :class:`kvstored.aio.AsyncClient`,
    :class:`kvstored.asyncio.AsyncioClient`)."""

    core: ClientCore

    def _start_core(self, master: str, transport: str, token: str | None,
                    token_file: str | None, timeout: float, connect_timeout: float | None,
                    **core_options: Any) -> None:
        try:
            found = find_client_token(token, token_file)
        except ConfigError as exc:
            raise BadRequestError(str(exc)) from None
        self.core = ClientCore(master, transport=transport, token=found, **core_options)
        #: Seconds one request may take; connecting and the hello after it.
        self.timeout = timeout
        self.connect_timeout = timeout if connect_timeout is None else connect_timeout

    @property
    def segments(self) -> Segments:
        return self.core.segments

    def register_memory(self, buffer: Any, fd: int) -> None:
        """Register ``buffer``, this process's mapping (from its start) of the
        shared-memory file open as ``fd`` (a ``/dev/shm`` file or a memfd: an engine's
        host KV pool). Puts and gets of pieces inside it, with nodes on this host, are
        then moved by the node itself between the file and its DRAM segment, with no
        copy by this client; a node that cannot (another host, another user) is
        remembered and the client copies as before (``memory.stats``, docs/client.md).
        Keep ``fd`` open while the client is in use. BadRequestError for something that
        is not a writable mapping and a regular file at least as long."""
        self.core.register_memory(buffer, fd)

    @property
    def memory(self) -> HostMemory:
        """The registered buffers, each node's region or refusal, and their counts."""
        return self.core.memory

    @property
    def stats(self) -> ReadStats:
        """What reads ran into: checksum failures, nodes that could not serve."""
        return self.core.stats

    @property
    def nodes(self) -> dict[str, NodeContact]:
        """The nodes this client has heard of, and how it reaches each."""
        return dict(self.core.nodes)

    def metrics(self) -> MetricsSnapshot:
        """What this client's calls did so far, per kind of call: calls, errors, keys,
        hits, misses, bytes and a latency histogram (kvstored.client.metrics)."""
        return self.core.metrics.snapshot()

    def register_metrics(self, registry: CollectorRegistry | None = None,
                         labels: Mapping[str, str] | None = None) -> Collector:
        """Export :meth:`metrics` to a prometheus-client ``registry`` (the default one
        if None), with ``labels`` on every sample; see
        :func:`kvstored.client.metrics.register_metrics`."""
        return register_metrics(self.core.metrics, registry, labels)


class Peer(Protocol):
    """What an async shell holds for the master (``None``) or a node: trio's
    :class:`~kvstored.rpc.RpcClient`, or the connections of :mod:`kvstored.asyncio`."""

    async def hello(self) -> HelloReply: ...

    async def call(self, spec: OpSpec[Req, Rep], request: Req, payload: Sequence[Buffer] = (),
                   into: Sequence[Into] | None = None, sums: list[int | None] | None = None
                   ) -> Rep: ...

    def close(self) -> None: ...


class AsyncShell(CoreShell):
    """The async clients, once: their calls as coroutines (each is the blocking client's
    call of the same name; see :class:`kvstored.client.sync.Client` for what it does),
    a :class:`Peer` per master or node, and how effects are performed. A subclass says
    how to reach a peer (:meth:`_new_peer`) and how to sleep (:meth:`_sleep`)."""

    timeout: float
    connect_timeout: float

    def __init__(self, master: str, *, transport: str = "auto", token: str | None = None,
                 token_file: str | None = None, timeout: float = 30.0,
                 connect_timeout: float | None = None) -> None:
        self._start_core(master, transport, token, token_file, timeout, connect_timeout,
                         clock=self._now)
        self._peers: dict[str | None, Peer] = {}

    def _now(self) -> float:
        """The loop's clock, in seconds."""
        return time.monotonic()

    def _new_peer(self, address: tuple[str, int]) -> Peer:
        raise NotImplementedError

    async def _sleep(self, seconds: float) -> None:
        raise NotImplementedError

    def _peer(self, node: str | None) -> Peer:
        peer = self._peers.get(node)
        if peer is None:
            peer = self._peers[node] = self._new_peer(self.core.endpoint(node))
        return peer

    async def _hello(self, node: str | None) -> HelloReply:
        """``node``'s (or the master's) hello reply, connecting first if need be."""
        try:
            return await self._peer(node).hello()
        except UnauthorizedError as exc:
            raise self.core.token.explain(exc) from None

    async def _perform(self, effect: Effect) -> Any:
        match effect:
            case Call(spec, request, node, payload, into, sums):
                await self._hello(node)
                return await self._peer(node).call(spec, request, payload, into, sums)
            case Greet(node):
                return await self._hello(node)
            case Pause(seconds):
                await self._sleep(seconds)

    async def _run(self, step: Step[T]) -> T:
        return await drive_async(step, self._perform)

    async def run(self, step: Step[T]) -> T:
        """Drive ``step``, one composed of the core's operations (see
        :meth:`kvstored.client.sync.Client.run`)."""
        return await drive_async(step, self._perform)

    async def aclose(self) -> None:
        """Close every connection and unmap every segment."""
        for peer in self._peers.values():
            peer.close()
        self._peers.clear()
        self.core.segments.close()

    async def __aenter__(self: S) -> S:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # -- writes ------------------------------------------------------------------------

    async def put(self, key: str, data: Any) -> bool:
        return (await self.batch_put([key], [data]))[0]

    async def batch_put(self, keys: Sequence[str], values: Sequence[Any]) -> list[bool]:
        return await self._run(self.core.batch_put(keys, values))

    async def put_parts(self, key: str, pieces: Sequence[Any]) -> bool:
        return (await self.batch_put_parts([key], [pieces]))[0]

    async def batch_put_parts(self, keys: Sequence[str], objects: Sequence[Sequence[Any]]
                              ) -> list[bool]:
        return await self._run(self.core.batch_put_parts(keys, objects))

    # -- reads -------------------------------------------------------------------------

    async def get(self, key: str) -> bytes | None:
        return (await self.batch_get([key]))[0]

    async def batch_get(self, keys: Sequence[str]) -> list[bytes | None]:
        return await self._run(self.core.read_values(keys))

    async def get_into(self, key: str, buf: Any) -> int:
        read = self.core.plan_held_read(key, buf)
        if read is not None:  # as the blocking client's get_into
            try:
                await self._hello(read.node)
                reply: GetReply | StoreError = await self._peer(read.node).call(
                    GET_HELD, read.request, into=read.into, sums=read.sums)
            except StoreError as exc:
                reply = exc
            size = self.core.finish_held_read(read, reply)
            if size is not None:
                return size
        return (await self.batch_get_into([key], [buf]))[0]

    async def batch_get_into(self, keys: Sequence[str], buffers: Sequence[Any], *,
                             tiers: list[Tier | None] | None = None) -> list[int]:
        return await self._run(self.core.read_into(keys, buffers, tiers))

    async def get_into_parts(self, key: str, pieces: Sequence[Any]) -> int:
        return (await self.batch_get_into_parts([key], [pieces]))[0]

    async def batch_get_into_parts(self, keys: Sequence[str],
                                   objects: Sequence[Sequence[Any]], *,
                                   tiers: list[Tier | None] | None = None) -> list[int]:
        return await self._run(self.core.read_into_parts(keys, objects, tiers))

    # -- metadata ----------------------------------------------------------------------

    async def exists(self, key: str) -> bool:
        return (await self.batch_exists([key]))[0]

    async def batch_exists(self, keys: Sequence[str]) -> list[bool]:
        return await self._run(self.core.batch_exists(keys))

    async def prefix_hits(self, keys: Sequence[str], *, lock_for: float | None = None
                          ) -> int:
        return await self._run(self.core.prefix_hits(keys, lock_for))

    async def batch_lookup_and_lock(self, keys: Sequence[str], ttl: float) -> list[bool]:
        return await self._run(self.core.batch_lookup_and_lock(keys, ttl))

    async def batch_unlock(self, keys: Sequence[str]) -> list[bool]:
        return await self._run(self.core.batch_unlock(keys))

    async def remove(self, key: str) -> bool:
        return (await self.batch_remove([key]))[0]

    async def batch_remove(self, keys: Sequence[str]) -> list[bool]:
        return await self._run(self.core.batch_remove(keys))

    async def batch_remove_prefix(self, prefix: str) -> int:
        return await self._run(self.core.batch_remove_prefix(prefix))

    async def register_namespace(self, prefix: str) -> int:
        return await self._run(self.core.register_namespace(prefix))

    async def stat(self, key: str) -> ObjectInfo | None:
        return await self._run(self.core.stat(key))

    async def locate(self, key: str) -> dict[str, dict[str, Any]]:
        return await self._run(self.core.locate(key))

    async def call(self, op: str, **args: Any) -> dict[str, Any]:
        return await self._run(self.core.raw(op, args))


class ConnectOptions(TypedDict, total=False):
    """The options of every ``connect()`` (see :func:`kvstored.connect`)."""

    transport: str
    token: str | None
    token_file: str | None
    timeout: float
    connect_timeout: float | None


class Connecting(Generic[S]):
    """What an async ``connect()`` returns: ``await`` it for a client that has heard
    the master's hello (closing it is then the caller's), or ``async with`` it for one
    closed at the end of the block."""

    def __init__(self, shell: type[S], master: str, **options: Unpack[ConnectOptions]
                 ) -> None:
        self._make = lambda: shell(master, **options)
        self._client: S | None = None

    async def _open(self) -> S:
        client = self._make()
        try:
            await client._hello(None)  # fail now if the master cannot be reached
        except BaseException:
            await client.aclose()
            raise
        return client

    def __await__(self) -> Generator[Any, None, S]:
        return self._open().__await__()

    async def __aenter__(self) -> S:
        self._client = await self._open()
        return self._client

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._client is not None
        await self._client.aclose()
