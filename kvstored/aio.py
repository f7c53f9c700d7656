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

from typing import Unpack

import trio

from kvstored.client.core import ObjectInfo
from kvstored.client.read import MISSING
from kvstored.client.shell import AsyncShell, Connecting, ConnectOptions
from kvstored.rpc import RpcClient

__all__ = ["MISSING", "AsyncClient", "ObjectInfo", "connect"]


class AsyncClient(AsyncShell):
    """A trio client; use :func:`connect`. Its calls are :class:`AsyncShell`'s."""

    def _now(self) -> float:
        return trio.current_time()

    def _new_peer(self, address: tuple[str, int]) -> RpcClient:
        return RpcClient(address, token=self.core.token.token,
                         connect_timeout=self.connect_timeout, timeout=self.timeout)

    async def _sleep(self, seconds: float) -> None:
        await trio.sleep(seconds)


def connect(master: str = "127.0.0.1:7700", **options: Unpack[ConnectOptions]
            ) -> Connecting[AsyncClient]:
    """The trio client (``async with connect(...) as c``, or ``c = await connect(...)``
    and ``await c.aclose()``), with :func:`kvstored.connect`'s options; the token is
    found as there, and the master must answer (as there)."""
    return Connecting(AsyncClient, master, **options)
