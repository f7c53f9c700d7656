"""The asyncio client: the same calls as :func:`kvstored.connect`, as coroutines on the
running asyncio loop, with no thread in between.

::

    async with kvstored.asyncio.connect("127.0.0.1:7700") as c:
        await c.put("k", b"v")
        n = await c.get_into("k", buf)

A shell over :mod:`kvstored.client.core`, which decides everything (as under the blocking
and the trio clients, so the three give the same results and the same errors); its calls
are :class:`~kvstored.client.shell.AsyncShell`'s, shared with the trio client. This
module only moves bytes: nonblocking sockets read and written straight from the loop
(``recv_into`` and ``sendmsg`` first, waiting for the loop to say the socket is ready
only when it is not), framed by :class:`~kvstored.wire.AsyncFrames`; values in a DRAM
segment on this host are copied through shared memory as the other clients do.

One instance may be shared by many tasks of one loop: each peer (the master, a node)
keeps a few connections, and a call takes an idle one or opens another, up to
:data:`CONNECTIONS_PER_PEER`. ``timeout`` bounds every request, to the master and to the
nodes alike; ``connect_timeout`` bounds connecting and the hello.
"""

from __future__ import annotations

import asyncio
import math
import socket
from collections.abc import Sequence
from typing import Unpack

from kvstored.client.core import ObjectInfo
from kvstored.client.read import MISSING
from kvstored.client.shell import AsyncShell, Connecting, ConnectOptions
from kvstored.protocol import HelloReply, OpSpec, Role
from kvstored.protocol.ops import Rep, Req, connect_failures, exchange_failures
from kvstored.rpc import exchange, say_hello
from kvstored.security import ClientToken
from kvstored.wire import AsyncFrames, Buffer, Into

__all__ = ["MISSING", "AsyncioClient", "ObjectInfo", "connect"]

#: At most this many connections to one peer: more tasks than that wait their turn
#: (a server refuses many unauthenticated connections from one address at once).
CONNECTIONS_PER_PEER = 8

class _LoopSocket:
    """A nonblocking socket's ``recv_into`` and ``sendmsg`` as coroutines of the running
    loop (what :class:`~kvstored.wire.AsyncFrames` awaits). Each tries the system call
    first (a reply already in the socket's buffer costs no trip through the loop), and
    waits for the loop to say the socket is ready only when it is not.

    The wait takes its reader or writer off the loop as it ends, cancelled or not, so a
    connection closed after a cancelled call leaves nothing registered on its descriptor
    (asyncio's own ``sock_recv_into`` does that later, from a callback that would
    unregister whatever socket has reused the number by then)."""

    __slots__ = ("sock",)

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    async def recv_into(self, view: memoryview) -> int:
        while True:
            try:
                return self.sock.recv_into(view)
            except (BlockingIOError, InterruptedError):
                await self._ready(writing=False)

    async def sendmsg(self, pieces: list[memoryview]) -> int:
        while True:
            try:
                return self.sock.sendmsg(pieces)
            except (BlockingIOError, InterruptedError):
                await self._ready(writing=True)

    async def _ready(self, *, writing: bool) -> None:
        # The loop running now: an idle connection registers nothing, so one client
        # can serve a loop started after it connected (LMCache's, in its thread).
        loop = asyncio.get_running_loop()
        ready = loop.create_future()
        fd = self.sock.fileno()
        add, remove = ((loop.add_writer, loop.remove_writer) if writing
                       else (loop.add_reader, loop.remove_reader))
        add(fd, _wake, ready)
        try:
            await ready
        finally:
            remove(fd)


def _wake(ready: asyncio.Future[None]) -> None:
    if not ready.done():
        ready.set_result(None)


def _deadline(seconds: float) -> asyncio.Timeout:
    return asyncio.timeout(None if math.isinf(seconds) else seconds)


async def _open_socket(address: tuple[str, int]) -> socket.socket:
    """A connected nonblocking TCP socket to ``address`` (each address it resolves to is
    tried in turn, as :func:`socket.create_connection` does); nothing stays open on a
    failure."""
    loop = asyncio.get_running_loop()
    try:  # an IP address needs no lookup, and so no trip to the loop's resolver thread
        infos = socket.getaddrinfo(*address, type=socket.SOCK_STREAM,
                                   flags=socket.AI_NUMERICHOST)
    except socket.gaierror:
        infos = await loop.getaddrinfo(*address, type=socket.SOCK_STREAM)
    error: OSError | None = None
    for family, kind, proto, _, where in infos:
        sock = socket.socket(family, kind, proto)
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            await loop.sock_connect(sock, where)
        except OSError as exc:
            sock.close()
            error = exc
            continue
        except BaseException:  # cancelled, or out of time
            sock.close()
            raise
        return sock
    raise error or OSError(f"{address[0]} resolves to no address")


class _Connection:
    """One connection to the master or a node (the asyncio twin of
    :class:`kvstored.client.connection.Connection`, with the same errors)."""

    def __init__(self, sock: socket.socket, where: str, timeout: float) -> None:
        self.sock = sock
        self.where = where
        self.timeout = timeout
        self.frames = AsyncFrames(_LoopSocket(sock))
        self.hello = HelloReply()

    @classmethod
    async def open(cls, address: tuple[str, int], token: ClientToken, *, timeout: float,
                   connect_timeout: float) -> _Connection:
        where = f"{address[0]}:{address[1]}"
        with connect_failures(where, connect_timeout):
            async with _deadline(connect_timeout):
                sock = await _open_socket(address)
        conn = cls(sock, where, timeout)
        with exchange_failures(where, connect_timeout, conn.close):
            async with _deadline(connect_timeout):
                conn.hello = await say_hello(conn.frames, Role.CLIENT, token.token)
        return conn

    @property
    def closed(self) -> bool:
        return self.sock.fileno() < 0

    async def call(self, spec: OpSpec[Req, Rep], request: Req, payload: Sequence[Buffer],
                   into: Sequence[Into] | None, sums: list[int | None] | None) -> Rep:
        """Send ``request``, return the reply; a broken exchange closes the connection
        and raises UnreachableError, an error the peer answered leaves it open."""
        with exchange_failures(self.where, self.timeout, self.close, op=spec.name):
            async with _deadline(self.timeout):
                return await exchange(self.frames, spec, request, payload, into, sums)

    def close(self) -> None:
        self.sock.close()


class _Peer:
    """The connections to one peer: idle ones are reused, and a call that finds none
    opens another (up to :data:`CONNECTIONS_PER_PEER`), so tasks sharing the client do
    not queue behind one another's round trips."""

    def __init__(self, address: tuple[str, int], token: ClientToken, timeout: float,
                 connect_timeout: float) -> None:
        self.address = address
        self.token = token
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.idle: list[_Connection] = []
        self.greeting: HelloReply | None = None
        self.closed = False
        self._slots = asyncio.Semaphore(CONNECTIONS_PER_PEER)

    async def _take(self) -> _Connection:
        while self.idle:
            conn = self.idle.pop()
            if not conn.closed:
                return conn
        conn = await _Connection.open(self.address, self.token, timeout=self.timeout,
                                      connect_timeout=self.connect_timeout)
        self.greeting = conn.hello
        return conn

    async def hello(self) -> HelloReply:
        """The peer's hello reply, connecting first if this client never has."""
        if self.greeting is None:
            async with self._slots:
                self.idle.append(await self._take())
        assert self.greeting is not None
        return self.greeting

    async def call(self, spec: OpSpec[Req, Rep], request: Req, payload: Sequence[Buffer] = (),
                   into: Sequence[Into] | None = None, sums: list[int | None] | None = None) -> Rep:
        async with self._slots:
            conn = await self._take()
            try:
                return await conn.call(spec, request, payload, into, sums)
            finally:
                if self.closed:
                    conn.close()  # the client closed while this call was out
                elif not conn.closed:
                    self.idle.append(conn)

    def close(self) -> None:
        self.closed = True
        for conn in self.idle:
            conn.close()
        self.idle.clear()


class AsyncioClient(AsyncShell):
    """An asyncio client; use :func:`connect`. Its calls are :class:`AsyncShell`'s."""

    def _new_peer(self, address: tuple[str, int]) -> _Peer:
        return _Peer(address, self.core.token, self.timeout, self.connect_timeout)

    async def _sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


def connect(master: str = "127.0.0.1:7700", **options: Unpack[ConnectOptions]
            ) -> Connecting[AsyncioClient]:
    """The asyncio client (``async with connect(...) as c``, or ``c = await
    connect(...)`` and ``await c.aclose()``), with :func:`kvstored.connect`'s options;
    the token is found as there, and the master must answer (as there)."""
    return Connecting(AsyncioClient, master, **options)
