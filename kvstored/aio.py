"""The trio client: the same calls as :func:`kvstored.connect`, as coroutines.

::

    async with kvstored.aio.connect("127.0.0.1:7700") as c:
        await c.put("k", b"v")
        n = await c.get_into("k", buf)

A shell over :mod:`kvstored.client.core`, which decides everything (the blocking client
is the other shell, so both give the same results and the same errors); this module only
moves bytes. One instance may be shared by many tasks: each request holds its
connection's lock for the length of one round trip. ``timeout`` bounds every request, to
the master and to the nodes alike.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import trio

from kvstored.client.core import (
    Call,
    Effect,
    Greet,
    ObjectInfo,
    Pause,
    Step,
)
from kvstored.client.read import MISSING
from kvstored.client.shell import CoreShell
from kvstored.errors import StoreError, UnauthorizedError
from kvstored.protocol import HelloReply, Tier
from kvstored.rpc import RpcClient

__all__ = ["MISSING", "AsyncClient", "ObjectInfo", "connect"]

T = TypeVar("T")


class AsyncClient(CoreShell):
    """A trio client; use :func:`connect`."""

    def __init__(self, master: str, *, transport: str = "auto", token: str | None = None,
                 token_file: str | None = None, timeout: float = 30.0,
                 connect_timeout: float | None = None) -> None:
        self._start_core(master, transport, token, token_file, clock=trio.current_time)
        self.timeout = timeout
        self.connect_timeout = timeout if connect_timeout is None else connect_timeout
        self._peers: dict[str | None, RpcClient] = {}

    # -- the shell ---------------------------------------------------------------------

    def _peer(self, node: str | None) -> RpcClient:
        peer = self._peers.get(node)
        if peer is None:
            peer = self._peers[node] = RpcClient(
                self.core.endpoint(node), token=self.core.token.token,
                connect_timeout=self.connect_timeout, timeout=self.timeout)
        return peer

    async def _hello(self, node: str | None) -> HelloReply:
        try:
            return await self._peer(node).hello()
        except UnauthorizedError as exc:
            raise self.core.token.explain(exc) from None

    async def _perform(self, effect: Effect) -> Any:
        match effect:
            case Call(spec, request, node, payload, into):
                await self._hello(node)
                return await self._peer(node).call(spec, request, payload, into)
            case Greet(node):
                return await self._hello(node)
            case Pause(seconds):
                await trio.sleep(seconds)

    async def _run(self, step: Step[T]) -> T:
        """:func:`kvstored.client.core.drive`, awaiting each effect."""
        result: Any = None
        error: StoreError | None = None
        while True:
            try:
                effect = step.send(result) if error is None else step.throw(error)
            except StopIteration as done:
                return done.value
            result, error = None, None
            try:
                result = await self._perform(effect)
            except StoreError as exc:
                error = exc

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

    # -- lifecycle ---------------------------------------------------------------------

    async def aclose(self) -> None:
        for peer in self._peers.values():
            peer.close()
        self.core.segments.close()


@asynccontextmanager
async def connect(master: str = "127.0.0.1:7700", *, transport: str = "auto",
                  token: str | None = None, token_file: str | None = None,
                  timeout: float = 30.0, connect_timeout: float | None = None
                  ) -> AsyncIterator[AsyncClient]:
    """The trio client; the token is found as :func:`kvstored.connect` finds it, and the
    master must answer (as there)."""
    client = AsyncClient(master, transport=transport, token=token, token_file=token_file,
                         timeout=timeout, connect_timeout=connect_timeout)
    try:
        await client._hello(None)
        yield client
    finally:
        await client.aclose()
