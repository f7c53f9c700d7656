"""Framed request/response over trio sockets: the server loop and the async caller.

A :class:`Service` serves the ops declared in a table of :class:`~kvstored.protocol.OpSpec`
(:data:`~kvstored.protocol.MASTER_OPS`, :data:`~kvstored.protocol.NODE_OPS`) with the
handlers bound to it. :func:`serve` accepts connections and runs one loop per connection:
read a frame, authenticate the first one (``hello``), then for each request check it
against its op's declaration (the connection's role, the fields, a payload only where one
is allowed), dispatch, answer. A handler receives the :class:`FramedSocket` (to read the
request's payload, if any, straight into its destination) and the header, and returns a
response header plus payload pieces. Whatever the handler leaves unread is discarded, so
a failing handler never desynchronises the stream.

Until a peer has authenticated, what it can make the server hold is bounded
(:class:`ServerLimits`): a small header, no payload, a deadline for the hello, and a
limit on connections per peer address and in total. Nothing a peer sends, before or after
the hello, raises past the connection's handler: a malformed frame closes that connection
and every other one carries on.
"""

from __future__ import annotations

import errno
import logging
import math
import socket
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
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
from kvstored.protocol import PROTOCOL_VERSION, Hello, OpSpec, Role
from kvstored.security import Credentials
from kvstored.wire import (
    DEFAULT_MAX_PAYLOAD,
    MAX_HEADER,
    PREFIX,
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
_BROKEN = (OSError, trio.BrokenResourceError, trio.ClosedResourceError)
#: accept() errors that mean "out of descriptors or memory for now", not "stop serving".
_ACCEPT_CAPACITY = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}
#: TCP keepalive: probe after 60 s idle, every 10 s, give up after 6 unanswered.
KEEPALIVE = tuple((getattr(socket, name), value) for name, value in (
    ("TCP_KEEPIDLE", 60), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 6)) if hasattr(socket, name))


class FramedSocket:
    """A trio socket that speaks frames, through a small read-ahead buffer.

    A small request (prefix, header, small payload) is read with one ``recv_into`` instead
    of three; every await is a trip through trio's scheduler, and on the latency of a
    single get those trips are most of the daemon's cost. Large payloads still go straight
    into their destination. ``payload_left`` counts the unread bytes of the current
    frame's payload; ``max_header`` and ``max_payload`` bound what the next frame may
    declare; ``role`` is what the hello granted (None before).
    """

    def __init__(self, sock: trio.socket.SocketType, max_payload: int = DEFAULT_MAX_PAYLOAD,
                 *, max_header: int = MAX_HEADER, read_ahead: int = READ_AHEAD,
                 send_stall: float = math.inf):
        self.sock = sock
        self.max_payload = max_payload
        self.max_header = max_header
        #: A send that makes no progress for this long breaks the connection: a peer that
        #: stopped reading must not hold the pins and buffers of its answer forever.
        self.send_stall = send_stall
        self.payload_left = 0
        self.peer: Any = None
        self.role: Role | None = None
        #: The peer address this connection counts against until it authenticates.
        self.admitted_as: str | None = None
        self._ahead = ReadAhead(read_ahead)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            # A peer that vanished without closing (a host gone, a cable pulled) is found
            # in about two minutes, and its descriptor freed.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            for option, value in KEEPALIVE:
                sock.setsockopt(socket.IPPROTO_TCP, option, value)
        except OSError:
            pass  # not TCP (a socketpair in tests)

    def authenticated(self, role: Role, max_payload: int) -> None:
        """The hello succeeded: lift the pre-authentication bounds."""
        self.role = role
        self.max_header = MAX_HEADER
        self.max_payload = max_payload
        self._ahead.grow(READ_AHEAD)

    async def recv_exactly_into(self, view: memoryview) -> None:
        """Fill ``view`` from the socket itself (the read-ahead must be drained first)."""
        got, total = 0, len(view)
        while got < total:
            n = await self.sock.recv_into(view[got:], total - got)
            if n == 0:
                raise ConnectionClosed("the peer closed the connection mid-frame")
            got += n

    async def _fill(self, need: int, *, between_frames: bool = False) -> None:
        """Have at least ``need`` (<= the read-ahead's size) bytes buffered."""
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
                                               self.max_payload, self.max_header)
        if header_len <= self._ahead.size:
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
            sent = None
            with trio.move_on_after(self.send_stall):
                sent = await self.sock.sendmsg(pieces[:512])
            if sent is None:
                raise trio.BrokenResourceError(f"the peer read nothing for {self.send_stall:g}s")
            while sent:
                if sent >= pieces[0].nbytes:
                    sent -= pieces[0].nbytes
                    pieces.pop(0)
                else:
                    pieces[0] = pieces[0][sent:]
                    sent = 0


@dataclass(frozen=True)
class ServerLimits:
    """What a peer that has not authenticated can make a server hold (the
    ``security.*`` settings of the same names)."""

    hello_timeout: float = 10.0
    preauth_header_limit: int = 4096
    max_connections: int = 1024
    max_unauthenticated_per_peer: int = 32
    #: A peer that reads nothing of an answer for this long is disconnected.
    send_stall: float = 120.0


class _QuietLog:
    """At most ``burst`` lines per ``window`` seconds for one kind of event (refused
    connections, garbage), then one line saying how many were left out: an attacker
    must not be able to fill the disk through the log."""

    def __init__(self, burst: int = 20, window: float = 10.0) -> None:
        self.burst, self.window = burst, window
        self._start = 0.0
        self._count = 0

    def __call__(self, level: int, message: str, *args: Any) -> None:
        now = time.monotonic()
        if now - self._start > self.window:
            if self._count > self.burst:
                log.log(level, "(%d similar lines left out in the last %.0fs)",
                        self._count - self.burst, self.window)
            self._start, self._count = now, 0
        self._count += 1
        if self._count <= self.burst:
            log.log(level, message, *args)


class Service:
    """The ops of one server (master or node data server), the credentials its peers
    must present, and the limits on what unauthenticated peers can make it hold."""

    def __init__(self, name: str, ops: Mapping[str, OpSpec], *,
                 credentials: Credentials | None = None, limits: ServerLimits | None = None,
                 max_payload: int = DEFAULT_MAX_PAYLOAD) -> None:
        self.name = name
        self.ops = dict(ops)
        self.credentials = credentials or Credentials.open()
        self.limits = limits or ServerLimits()
        self.max_payload = max_payload
        self.handlers: dict[str, tuple[OpSpec, Handler]] = {}
        self.hello_extra: Callable[[dict[str, Any]], dict[str, Any]] = lambda header: {}
        self.on_disconnect: Callable[[FramedSocket], Awaitable[None]] | None = None
        self.connections = 0
        self.unauthenticated: Counter[str] = Counter()
        self._refusing = 0
        self._quiet = _QuietLog()

    def add(self, name: str, handler: Handler) -> None:
        """Serve the declared op ``name`` with ``handler``."""
        if name not in self.ops:
            raise TypeError(f"{self.name}: op {name!r} is not declared in the protocol "
                            "(kvstored/protocol.py), so it has no role and no fields")
        self.handlers[name] = (self.ops[name], handler)

    def bind(self, owner: object) -> None:
        """Serve every declared op with ``owner.op_<name>``. Every ``op_*`` method of
        ``owner`` must be declared and every declared op must have one: an op nobody
        declared would have no role to check."""
        defined = {attr[3:] for attr in dir(owner) if attr.startswith("op_")}
        undeclared, missing = sorted(defined - set(self.ops)), sorted(set(self.ops) - defined)
        if undeclared or missing:
            raise TypeError(f"{self.name}: handlers without a declaration in "
                            f"kvstored/protocol.py: {undeclared}; declared ops without a "
                            f"handler: {missing}")
        for name in self.ops:
            self.add(name, getattr(owner, "op_" + name))

    # -- connections -------------------------------------------------------------------

    async def accept_loop(self, listener: trio.SocketListener, nursery: trio.Nursery) -> None:
        """Accept connections until cancelled; each runs in its own task in ``nursery``."""
        async with listener:
            while True:
                try:
                    stream = await listener.accept()
                except OSError as exc:
                    if exc.errno not in _ACCEPT_CAPACITY:
                        raise
                    self._quiet(logging.WARNING, "%s: cannot accept connections: %s; lower "
                                "security.max_connections or raise the open-files limit "
                                "(ulimit -n)", self.name, exc.strerror or exc)
                    await trio.sleep(0.1)
                    continue
                nursery.start_soon(self._serve_stream, stream)

    def _admit(self, address: str) -> str | None:
        """Count a new connection in, or say why it is refused."""
        if self.connections >= self.limits.max_connections:
            return (f"{self.name} has {self.connections} connections open, its limit "
                    "(security.max_connections); retry later")
        if self.unauthenticated[address] >= self.limits.max_unauthenticated_per_peer:
            return (f"{self.unauthenticated[address]} connections from {address} have not "
                    "authenticated yet, the limit (security.max_unauthenticated_per_peer)")
        self.connections += 1
        self.unauthenticated[address] += 1
        return None

    def _authenticated(self, address: str) -> None:
        self.unauthenticated[address] -= 1
        if not self.unauthenticated[address]:
            del self.unauthenticated[address]

    async def _serve_stream(self, stream: trio.SocketStream) -> None:
        try:
            peer = stream.socket.getpeername()
        except OSError:
            peer = None  # gone already
        address = str(peer[0]) if isinstance(peer, tuple) and peer else "?"
        refusal = self._admit(address)
        if refusal is not None:
            await self._refuse(stream, address, refusal)
            return
        conn = FramedSocket(stream.socket, 0, max_header=self.limits.preauth_header_limit,
                            read_ahead=min(READ_AHEAD,
                                           PREFIX.size + self.limits.preauth_header_limit),
                            send_stall=self.limits.send_stall)
        conn.peer = peer
        conn.admitted_as = address
        try:
            await self.handle_connection(stream, conn)
        finally:
            self.connections -= 1
            if conn.admitted_as is not None:
                self._authenticated(conn.admitted_as)

    async def _refuse(self, stream: trio.SocketStream, address: str, reason: str) -> None:
        """Tell a refused peer why (within a second), then close."""
        self._quiet(logging.WARNING, "%s: refused a connection from %s: %s", self.name,
                    address, reason)
        self._refusing += 1
        try:
            # Bounded too: past this many refusals in flight, just close.
            if self._refusing <= 64:
                with trio.move_on_after(1):
                    await FramedSocket(stream.socket, 0, read_ahead=PREFIX.size).send_frame(
                        {"ok": False, "error": UnreachableError(reason).to_wire()})
                    await stream.send_eof()
                    # Closing with the peer's hello unread would reset the connection,
                    # and the reset can overtake the answer: read until the peer hangs up.
                    while await stream.receive_some(4096):
                        pass
        except _BROKEN:
            pass
        finally:
            self._refusing -= 1
            with trio.CancelScope(shield=True):
                await stream.aclose()

    async def handle_connection(self, stream: trio.SocketStream,
                                conn: FramedSocket | None = None) -> None:
        """Serve one connection until it closes; nothing it sends raises past here."""
        if conn is None:
            conn = FramedSocket(stream.socket, 0, max_header=self.limits.preauth_header_limit)
            try:
                conn.peer = stream.socket.getpeername()
            except OSError:
                conn.peer = None
        try:
            if await self._hello(conn):
                while True:
                    header = await conn.recv_header()
                    await self._dispatch(conn, header)
        except ConnectionClosed:
            pass
        except FrameError as exc:
            self._quiet(logging.INFO, "%s: closing the connection from %s: %s", self.name,
                        conn.peer, exc)
            with trio.move_on_after(1):
                try:
                    await conn.send_frame({"ok": False, "error": BadRequestError(
                        f"malformed frame: {exc}").to_wire()})
                except _BROKEN:
                    pass
        except _BROKEN as exc:
            log.debug("%s: connection from %s ended: %s", self.name, conn.peer, exc)
        except Exception:  # a bug: keep it to this connection, and say where it was
            log.exception("%s: the connection from %s failed; closed it", self.name,
                          conn.peer)
        finally:
            try:
                if self.on_disconnect is not None:
                    await self.on_disconnect(conn)
            except Exception:
                log.exception("%s: cleaning up after %s failed", self.name, conn.peer)
            finally:
                with trio.CancelScope(shield=True):
                    await stream.aclose()

    async def _hello(self, conn: FramedSocket) -> bool:
        """Read and check the hello, within the hello deadline. True if the peer is in."""
        with trio.move_on_after(self.limits.hello_timeout):
            header = await conn.recv_header()
            try:
                hello = Hello.parse(header)
                role = self.credentials.grant(hello)
                if hello.version != PROTOCOL_VERSION:
                    raise BadRequestError(f"protocol version {hello.version} is not "
                                          f"{PROTOCOL_VERSION}; upgrade the older side")
            except StoreError as exc:
                self._quiet(logging.INFO, "%s: refused the hello of %s: %s", self.name,
                            conn.peer, exc)
                await conn.send_frame({"ok": False, "error": exc.to_wire()})
                return False
            conn.authenticated(role, self.max_payload)
            if conn.admitted_as is not None:
                self._authenticated(conn.admitted_as)
                conn.admitted_as = None
            await conn.send_frame({"ok": True, "service": self.name,
                                   "role": role.value, **self.hello_extra(header)})
            return True
        self._quiet(logging.INFO, "%s: %s sent no hello within %gs (security.hello_timeout); "
                    "closed", self.name, conn.peer, self.limits.hello_timeout)
        return False

    async def _dispatch(self, conn: FramedSocket, header: dict[str, Any]) -> None:
        op = header.get("op")
        entry = self.handlers.get(op) if isinstance(op, str) else None
        if conn.payload_left and (entry is None or not entry[0].payload):
            # Reading a payload nobody wants would cost up to max_payload: hang up instead.
            raise FrameError(f"op {op!r:.60} takes no payload, but the frame carries "
                             f"{conn.payload_left} bytes")
        payload: Payload = ()
        try:
            if entry is None:
                known = ", ".join(sorted(self.handlers))
                raise BadRequestError(f"unknown op {op!r:.60}; known: {known}")
            spec, handler = entry
            assert conn.role is not None
            if not conn.role.may_call(spec.role):
                raise UnauthorizedError(f"{op} is a {spec.role.value} operation and this "
                                        f"connection is authenticated as a {conn.role.value}")
            spec.check(header)
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
            log.warning("%s: op %s from %s: %r", self.name, op, conn.peer, exc)
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
    async with trio.open_nursery() as nursery:
        for listener in listeners:
            nursery.start_soon(service.accept_loop, listener, nursery)
        task_status.started(bound)


class RpcClient:
    """An async caller over one connection; calls are serialised by a lock.

    ``connect_timeout`` bounds reaching the peer and its answer to the hello, so a port
    that serves something else, or nothing, fails in seconds with the address named.
    """

    def __init__(self, address: tuple[str, int], *, token: str | None = None,
                 role: Role = Role.CLIENT, connect_timeout: float = 10.0,
                 max_payload: int = DEFAULT_MAX_PAYLOAD) -> None:
        self.address = address
        self.token = token
        self.role = role
        self.connect_timeout = connect_timeout
        self.max_payload = max_payload
        self.conn: FramedSocket | None = None
        self.server_hello: dict[str, Any] = {}
        self._lock = trio.Lock()

    @property
    def where(self) -> str:
        return f"{self.address[0]}:{self.address[1]}"

    async def connect(self) -> dict[str, Any]:
        """Open the connection and say hello; on any failure nothing stays open."""
        try:
            with trio.fail_after(self.connect_timeout):
                stream = await trio.open_tcp_stream(*self.address)
        except OSError as exc:
            raise UnreachableError(f"cannot reach {self.where} ({exc.strerror or exc}); "
                                   "is the daemon running?") from None
        except trio.TooSlowError:
            raise UnreachableError(f"cannot reach {self.where}: no answer within "
                                   f"{self.connect_timeout:g}s") from None
        conn = FramedSocket(stream.socket, self.max_payload)
        try:
            with trio.fail_after(self.connect_timeout):
                await conn.send_frame(Hello(self.role, self.token).to_wire())
                reply = await conn.recv_header()
        except trio.TooSlowError:
            stream.socket.close()
            raise UnreachableError(f"{self.where} did not answer the hello within "
                                   f"{self.connect_timeout:g}s; is it a kvstored master or "
                                   "node?") from None
        except (*_BROKEN, ConnectionClosed, FrameError) as exc:
            stream.socket.close()
            raise UnreachableError(f"hello to {self.where} failed: {exc}") from None
        except BaseException:
            stream.socket.close()
            raise
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
                raise UnreachableError(f"{op}: lost the connection to {self.where}: "
                                       f"{exc}") from None
            except BaseException:
                self.close()  # cancelled mid-call: the stream is out of step now
                raise
        if not reply.get("ok"):
            raise from_wire(reply.get("error") or {})
        return reply

    async def hello(self) -> dict[str, Any]:
        """The server's answer to the hello, connecting first if need be."""
        async with self._lock:
            await self._ready()
        return self.server_hello

    async def _ready(self) -> FramedSocket:
        if self.conn is None:
            await self.connect()
        assert self.conn is not None
        return self.conn

    def close(self) -> None:
        if self.conn is not None:
            self.conn.sock.close()
            self.conn = None
