"""Framed request/response over trio sockets: the server loop and the async caller.

A :class:`Service` maps op names to handlers. :func:`serve` accepts connections and runs
one loop per connection: read a frame, authenticate the first one (``hello``), dispatch,
answer. A handler receives the :class:`FramedSocket` (to read the request's payload, if
any, straight into its destination) and the header, and returns a response header plus
payload pieces. Whatever the handler leaves unread is discarded, so a failing handler
never desynchronises the stream. A malformed frame closes the connection; every other
connection carries on.
"""

from __future__ import annotations

import hmac
import logging
import socket
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import trio

from kvstored.errors import (
    BadRequestError,
    InternalError,
    ListenError,
    StoreError,
    UnauthorizedError,
    UnreachableError,
    from_wire,
)
from kvstored.wire import (
    DEFAULT_MAX_PAYLOAD,
    PREFIX,
    PROTOCOL_VERSION,
    READ_AHEAD,
    ConnectionClosed,
    FrameError,
    ReadAhead,
    pack_header,
    parse_prefix,
    unpack_header,
)

log = logging.getLogger(__name__)

Payload = Sequence[memoryview | bytes | bytearray]
#: A handler returns (response header, payload), or (None, ()) when it sent the
#: response itself (to stream a payload while holding pins).
Handler = Callable[["FramedSocket", dict[str, Any]],
                   Awaitable[tuple[dict[str, Any] | None, Payload]]]


class FramedSocket:
    """A trio socket that speaks frames, through a small read-ahead buffer.

    A small request (prefix, header, small payload) is read with one ``recv_into`` instead
    of three; every await is a trip through trio's scheduler, and on the latency of a
    single get those trips are most of the daemon's cost. Large payloads still go straight
    into their destination. ``payload_left`` counts the unread bytes of the current
    frame's payload.
    """

    def __init__(self, sock: trio.socket.SocketType, max_payload: int = DEFAULT_MAX_PAYLOAD):
        self.sock = sock
        self.max_payload = max_payload
        self.payload_left = 0
        self.peer: Any = None
        self._ahead = ReadAhead()
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass  # not TCP (a socketpair in tests)

    async def recv_exactly_into(self, view: memoryview) -> None:
        """Fill ``view`` from the socket itself (the read-ahead must be drained first)."""
        got, total = 0, len(view)
        while got < total:
            n = await self.sock.recv_into(view[got:], total - got)
            if n == 0:
                raise ConnectionClosed("the peer closed the connection mid-frame")
            got += n

    async def _fill(self, need: int, *, between_frames: bool = False) -> None:
        """Have at least ``need`` (<= READ_AHEAD) bytes buffered."""
        ahead = self._ahead
        while ahead.buffered < need:
            n = await self.sock.recv_into(ahead.room())
            if n == 0:
                if between_frames and ahead.buffered == 0:
                    raise ConnectionClosed("closed between frames")
                raise ConnectionClosed("the peer closed the connection mid-frame")
            ahead.received(n)

    async def recv_header(self) -> dict[str, Any]:
        await self._fill(PREFIX.size, between_frames=True)
        header_len, payload_len = parse_prefix(self._ahead.consume(PREFIX.size),
                                               self.max_payload)
        if header_len <= READ_AHEAD:
            await self._fill(header_len)
            body = self._ahead.consume(header_len)
        else:
            big = memoryview(bytearray(header_len))
            await self.recv_exactly_into(big[self._ahead.take(big):])
            body = bytes(big)
        self.payload_left = payload_len
        return unpack_header(body)

    async def recv_payload_into(self, view: memoryview) -> None:
        if len(view) > self.payload_left:
            raise FrameError(f"payload is {self.payload_left} bytes, {len(view)} wanted")
        taken = self._ahead.take(view)
        if taken < len(view):
            await self.recv_exactly_into(view[taken:])
        self.payload_left -= len(view)

    async def discard_payload(self) -> None:
        if not self.payload_left:
            return
        scratch = memoryview(bytearray(min(self.payload_left, 1 << 20)))
        while self.payload_left:
            await self.recv_payload_into(scratch[:min(self.payload_left, len(scratch))])

    async def send_frame(self, header: dict[str, Any], payload: Payload = ()) -> None:
        views = [memoryview(p).cast("B") for p in payload if len(p)]
        pieces = [memoryview(pack_header(header, sum(v.nbytes for v in views))), *views]
        while pieces:
            sent = await self.sock.sendmsg(pieces[:512])
            while sent:
                if sent >= pieces[0].nbytes:
                    sent -= pieces[0].nbytes
                    pieces.pop(0)
                else:
                    pieces[0] = pieces[0][sent:]
                    sent = 0


class Service:
    """A set of op handlers plus the shared-secret token they require (if any)."""

    def __init__(self, name: str, token: str | None = None,
                 max_payload: int = DEFAULT_MAX_PAYLOAD) -> None:
        self.name = name
        self.token = token
        self.max_payload = max_payload
        self.handlers: dict[str, Handler] = {}
        self.hello_extra: Callable[[dict[str, Any]], dict[str, Any]] = lambda header: {}
        self.on_disconnect: Callable[[FramedSocket], Awaitable[None]] | None = None

    def op(self, name: str) -> Callable[[Handler], Handler]:
        def register(handler: Handler) -> Handler:
            self.handlers[name] = handler
            return handler
        return register

    async def handle_connection(self, stream: trio.SocketStream) -> None:
        conn = FramedSocket(stream.socket, self.max_payload)
        try:
            conn.peer = stream.socket.getpeername()
        except OSError:
            conn.peer = None
        try:
            if not await self._hello(conn):
                return
            while True:
                header = await conn.recv_header()
                await self._dispatch(conn, header)
        except ConnectionClosed:
            pass
        except FrameError as exc:
            log.info("%s: closing connection from %s: %s", self.name, conn.peer, exc)
            with trio.move_on_after(1):
                try:
                    await conn.send_frame({"ok": False, "error": BadRequestError(
                        f"malformed frame: {exc}").to_wire()})
                except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
                    pass
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            log.debug("%s: connection from %s ended: %s", self.name, conn.peer, exc)
        finally:
            if self.on_disconnect is not None:
                await self.on_disconnect(conn)
            with trio.CancelScope(shield=True):
                await stream.aclose()

    async def _hello(self, conn: FramedSocket) -> bool:
        header = await conn.recv_header()
        if header.get("op") != "hello":
            await conn.send_frame({"ok": False, "error": BadRequestError(
                "the first frame must be hello").to_wire()})
            return False
        token = header.get("token")
        if self.token is not None and not (
                isinstance(token, str) and hmac.compare_digest(token, self.token)):
            await conn.send_frame({"ok": False, "error": UnauthorizedError(
                "missing or wrong token; pass the cluster's --token-file").to_wire()})
            return False
        if header.get("version") != PROTOCOL_VERSION:
            await conn.send_frame({"ok": False, "error": BadRequestError(
                f"protocol version {header.get('version')!r} is not {PROTOCOL_VERSION}; "
                "upgrade the older side").to_wire()})
            return False
        await conn.discard_payload()
        await conn.send_frame({"ok": True, "service": self.name, **self.hello_extra(header)})
        return True

    async def _dispatch(self, conn: FramedSocket, header: dict[str, Any]) -> None:
        op = header.get("op")
        handler = self.handlers.get(op) if isinstance(op, str) else None
        payload: Payload = ()
        try:
            if handler is None:
                known = ", ".join(sorted(self.handlers))
                raise BadRequestError(f"unknown op {op!r}; known: {known}")
            result = await handler(conn, header)
            if result[0] is None:
                return  # the handler streamed its own response
            response, payload = result
            response.setdefault("ok", True)
        except StoreError as exc:
            response = {"ok": False, "error": exc.to_wire()}
        except (FrameError, ConnectionClosed, OSError, trio.BrokenResourceError):
            raise
        except (KeyError, TypeError, ValueError) as exc:
            response = {"ok": False, "error": BadRequestError(
                f"malformed {op} request: {exc!r}").to_wire()}
        except Exception as exc:
            log.exception("%s: op %s failed", self.name, op)
            response = {"ok": False, "error": InternalError(f"{op} failed: {exc!r}").to_wire()}
        await conn.discard_payload()
        await conn.send_frame(response, payload)


async def serve(service: Service, host: str, port: int, *,
                task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Listen on host:port and serve ``service`` until cancelled. Reports the bound
    (host, port) through ``task_status``."""
    try:
        listeners = await trio.open_tcp_listeners(port, host=host)
    except OSError as exc:
        raise ListenError((host, port), exc) from exc
    bound = listeners[0].socket.getsockname()[:2]
    task_status.started(bound)
    await trio.serve_listeners(service.handle_connection, listeners)


class RpcClient:
    """An async caller over one connection; calls are serialised by a lock."""

    def __init__(self, address: tuple[str, int], *, token: str | None = None,
                 role: str = "client", hello: dict[str, Any] | None = None,
                 max_payload: int = DEFAULT_MAX_PAYLOAD) -> None:
        self.address = address
        self.token = token
        self.role = role
        self.hello_args = dict(hello or {})
        self.max_payload = max_payload
        self.conn: FramedSocket | None = None
        self.server_hello: dict[str, Any] = {}
        self._lock = trio.Lock()

    async def connect(self) -> dict[str, Any]:
        try:
            stream = await trio.open_tcp_stream(*self.address)
        except OSError as exc:
            raise UnreachableError(f"cannot reach {self.address[0]}:{self.address[1]} "
                                   f"({exc.strerror or exc}); is the daemon running?") from None
        conn = FramedSocket(stream.socket, self.max_payload)
        await conn.send_frame({"op": "hello", "version": PROTOCOL_VERSION, "token": self.token,
                               "role": self.role, **self.hello_args})
        reply = await conn.recv_header()
        if not reply.get("ok"):
            stream.socket.close()
            raise from_wire(reply.get("error") or {})
        self.conn = conn
        self.server_hello = reply
        return reply

    async def call(self, op: str, payload: Payload = (), **args: Any) -> dict[str, Any]:
        """Send a request and return the response header (raising its error). A response
        payload, if any, is left for :meth:`call_into` callers; here it is discarded."""
        async with self._lock:
            conn = await self._ready()
            try:
                await conn.send_frame({"op": op, **args}, payload)
                reply = await conn.recv_header()
                await conn.discard_payload()
            except (OSError, ConnectionClosed, FrameError, trio.BrokenResourceError) as exc:
                self.close()
                raise UnreachableError(f"{op}: lost the connection to "
                                       f"{self.address[0]}:{self.address[1]}: {exc}") from None
        if not reply.get("ok"):
            raise from_wire(reply.get("error") or {})
        return reply

    async def _ready(self) -> FramedSocket:
        if self.conn is None:
            await self.connect()
        assert self.conn is not None
        return self.conn

    def close(self) -> None:
        if self.conn is not None:
            self.conn.sock.close()
            self.conn = None
