"""Framed request/response over trio sockets: the server loop and the async caller.

A :class:`Service` serves the ops of one table (:data:`~kvstored.protocol.MASTER_OPS`,
:data:`~kvstored.protocol.NODE_OPS`) with an explicit table of handlers, one
:class:`Binding` per op: ``Binding(ops.COMMIT, master.commit)`` ties an op's
:class:`~kvstored.protocol.OpSpec` to a coroutine that takes the op's request message and
returns its reply message, so the type checker sees every handler's types. :func:`serve`
accepts connections and runs one loop per connection: read a frame, authenticate the
first one (``hello``), then for each request check it against its op's declaration (the
connection's role, the fields, a payload only where one is allowed), decode it, dispatch,
answer. A handler receives the :class:`FramedSocket` (to read the request's payload, if
any, straight into its destination, or to send its reply itself with
:meth:`FramedSocket.answer`) and the request. Whatever the handler leaves unread is
discarded, so a failing handler never desynchronises the stream.

Until a peer has authenticated, what it can make the server hold is bounded
(:class:`ServerLimits`): a small header, no payload, a deadline for the hello, and a
limit on connections per peer address and in total. Nothing a peer sends, before or after
the hello, raises past the connection's handler: a malformed frame closes that connection
and every other one carries on.

:class:`RpcClient` is the async caller (nodes to their master, the trio client to
everyone); its blocking twin is :class:`kvstored.client.connection.Connection`.
"""

from __future__ import annotations

import errno
import logging
import math
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic

import trio

from kvstored.checksum import crc32c
from kvstored.errors import (
    BadRequestError,
    InternalError,
    ListenError,
    StoreError,
    UnauthorizedError,
    UnreachableError,
)
from kvstored.protocol import HELLO, PROTOCOL_VERSION, Hello, HelloReply, OpSpec, Role
from kvstored.protocol.ops import BROKEN, Rep, Req, connect_failures, exchange_failures
from kvstored.security import Credentials
from kvstored.wire import (
    DEFAULT_MAX_PAYLOAD,
    MAX_HEADER,
    PREFIX,
    READ_AHEAD,
    AsyncFrames,
    Buffer,
    ConnectionClosed,
    FrameError,
    Into,
    Outgoing,
)

log = logging.getLogger(__name__)

Payload = Sequence[Buffer]
_BROKEN = (OSError, trio.BrokenResourceError, trio.ClosedResourceError)
_EXCHANGE_BROKEN = (*BROKEN, *_BROKEN)
_TOO_SLOW = (trio.TooSlowError,)
#: accept() errors that mean "out of descriptors or memory for now", not "stop serving".
_ACCEPT_CAPACITY = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}
#: A connection whose reads never wait yields to other tasks at least this often.
CHECKPOINT_EVERY = 0.0005
#: TCP keepalive: probe after 60 s idle, every 10 s, give up after 6 unanswered.
#: A frame with more than this left after its first send goes on in a worker thread, in
#: blocking ``sendmsg`` calls (see :meth:`FramedSocket.send_frame`).
THREADED_SEND = 1 << 20
KEEPALIVE = tuple((getattr(socket, name), value) for name, value in (
    ("TCP_KEEPIDLE", 60), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 6)) if hasattr(socket, name))


class Answered:
    """What a handler returns when it sent its reply itself (:meth:`FramedSocket.answer`:
    to stream a payload while it holds pins)."""

    __slots__ = ()


ANSWERED = Answered()


class FramedSocket(AsyncFrames):
    """A trio socket that speaks frames: the trio shell of :class:`~kvstored.wire.FrameDecoder`.

    A small request (prefix, header, small payload) is read with one ``recv_into`` instead
    of three; every await is a trip through trio's scheduler, and on the latency of a
    single get those trips are most of the daemon's cost. Large payloads still go straight
    into their destination. ``role`` is what the hello granted (None before).
    """

    def __init__(self, sock: trio.socket.SocketType, max_payload: int = DEFAULT_MAX_PAYLOAD,
                 *, max_header: int = MAX_HEADER, read_ahead: int = READ_AHEAD,
                 send_stall: float = math.inf):
        super().__init__(sock, max_payload, max_header=max_header, read_ahead=read_ahead)
        #: A send that makes no progress for this long breaks the connection: a peer that
        #: stopped reading must not hold the pins and buffers of its answer forever.
        self.send_stall = send_stall
        #: The stdlib socket under ``sock``, for the first try of each send (see
        #: :meth:`send_frame`); None where trio does not expose one.
        self._raw: socket.socket | None = getattr(sock, "_sock", None)
        #: When this connection last let other tasks run (time.monotonic()).
        self._yielded = 0.0
        self.peer: Any = None
        self.role: Role | None = None
        #: The peer address this connection counts against until it authenticates.
        self.admitted_as: str | None = None
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            # A peer that vanished without closing (a host gone, a cable pulled) is found
            # in about two minutes, and its descriptor freed.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            for option, value in KEEPALIVE:
                sock.setsockopt(socket.IPPROTO_TCP, option, value)
        except OSError:
            pass  # not TCP (a socketpair in tests)

    async def _pump(self) -> None:
        raw = self._raw
        if raw is None:
            await super()._pump()
            return
        # trio's recv_into, without its wrappers (an async context manager and two
        # cancellation checks around each try, a good part of a small request's cost):
        # try the stdlib socket, wait for it to be readable only when it would block.
        # trio also yields after every read that did not wait: a scheduler pass, on the
        # critical path of most single gets (the client's next request is often in
        # before the node is back to read it). This yields only if the connection has
        # not for CHECKPOINT_EVERY seconds: other tasks (and a cancellation) still get
        # their turn within that, however fast a client sends.
        decoder = self.decoder
        read = waited = False
        while (room := decoder.room()) is not None:
            try:
                got = raw.recv_into(room)
            except BlockingIOError:
                await trio.lowlevel.wait_readable(raw)
                waited = True
                continue
            read = True
            decoder.received(got)
        now = time.monotonic()
        if waited:
            self._yielded = now
        elif read and now - self._yielded >= CHECKPOINT_EVERY:
            self._yielded = now
            await trio.lowlevel.checkpoint()

    def authenticated(self, role: Role, max_payload: int) -> None:
        """The hello succeeded: lift the pre-authentication bounds."""
        self.role = role
        self.decoder.max_header = MAX_HEADER
        self.decoder.max_payload = max_payload
        self.decoder.grow(READ_AHEAD)

    async def send_frame(self, header: dict[str, Any] | None, payload: Sequence[Buffer] = (),
                         payload_len: int | None = None) -> None:
        """Send a frame, or a part of one (``header`` None: more of the payload a header
        announced with ``payload_len``; see :class:`~kvstored.wire.Outgoing`). A large
        one (a batch of objects) that the socket's buffer cannot take at once is finished
        in a worker thread with blocking ``sendmsg`` calls: the kernel then sends each
        buffer's worth as the peer drains it, in one call, where non-blocking sends from
        this thread took one call per partial write (about 160 per 32 MiB on loopback,
        each building its scatter list again) and a trip through the scheduler per
        drain. This thread serves other connections meanwhile."""
        out = Outgoing(header, payload, payload_len)
        raw = self._raw
        if raw is not None and out.left > THREADED_SEND:
            try:
                out.sent(raw.sendmsg(out.pieces()))
            except BlockingIOError:
                pass
            if out.left > THREADED_SEND:
                await self._send_in_thread(raw, out)
                return
        while pieces := out.pieces():
            out.sent(await self._send(pieces))

    async def _send_in_thread(self, raw: socket.socket, out: Outgoing) -> None:
        """The rest of ``out`` in blocking sends from a worker thread. Cancelled, the
        socket is shut down, which ends the thread's send at once, and this returns only
        once the thread is out of it: the caller's pins (the payload's memory) must
        outlive every read of it."""
        out_of_it = threading.Event()

        def send() -> bool:
            try:
                return _send_blocking(raw, out, self.send_stall)
            finally:
                out_of_it.set()

        try:
            stalled = await trio.to_thread.run_sync(send, abandon_on_cancel=True)
        except trio.Cancelled:
            try:
                raw.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(out_of_it.wait)
            raise
        if stalled:
            raise trio.BrokenResourceError(f"the peer read nothing for {self.send_stall:g}s")

    async def _send(self, pieces: list[memoryview]) -> int:
        if self._raw is not None:
            # One try without trio: what fits the socket's buffer (every small reply,
            # and a 64 KiB get on loopback) costs one system call instead of that plus a
            # trip through the scheduler and a timer, which on a single get is a good
            # part of the node's time. The connection still yields to other tasks when
            # it reads its next request.
            try:
                return self._raw.sendmsg(pieces)
            except BlockingIOError:
                pass
        sent = None
        with trio.move_on_after(self.send_stall):
            sent = await self.sock.sendmsg(pieces)
        if sent is None:
            raise trio.BrokenResourceError(f"the peer read nothing for {self.send_stall:g}s")
        return sent

    async def answer(self, reply: Any, payload: Payload = ()) -> Answered:
        """Send ``reply`` (a message) with ``payload`` now, from inside a handler."""
        await self.send_frame(OpSpec.reply_header(reply), payload)
        return ANSWERED


def _send_blocking(sock: socket.socket, out: Outgoing, stall: float) -> bool:
    """Send the rest of ``out`` over ``sock`` (a non-blocking socket, made blocking for
    the while: its connection's task waits for this and nothing else uses it); True if
    the peer read nothing for ``stall`` seconds (``SO_SNDTIMEO``)."""
    if math.isfinite(stall):
        seconds = int(stall)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO,
                        struct.pack("ll", seconds, int((stall - seconds) * 1e6)))
    sock.setblocking(True)
    try:
        while pieces := out.pieces():
            out.sent(sock.sendmsg(pieces))
    except BlockingIOError:  # SO_SNDTIMEO ran out with nothing sent
        return True
    finally:
        sock.setblocking(False)
    return False


Handler = Callable[[FramedSocket, Req], Awaitable[Rep | Answered]]


@dataclass(frozen=True, slots=True)
class Binding(Generic[Req, Rep]):
    """One op of a service and the handler that serves it."""

    spec: OpSpec[Req, Rep]
    handler: Handler[Req, Rep]


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


def _error_reply(exc: StoreError) -> dict[str, Any]:
    return {"ok": False, "error": exc.to_wire()}


class Service:
    """The ops of one server (master or node data server), their handlers, the
    credentials its peers must present, and the limits on what unauthenticated peers can
    make it hold.

    ``bindings`` must serve every op of ``ops`` once and nothing else: an op without a
    declaration would have no role to check. ``hello`` is the reply to a peer's hello,
    given the role it was granted."""

    def __init__(self, name: str, ops: Mapping[str, OpSpec[Any, Any]],
                 bindings: Iterable[Binding[Any, Any]], *,
                 credentials: Credentials | None = None, limits: ServerLimits | None = None,
                 max_payload: int = DEFAULT_MAX_PAYLOAD,
                 hello: Callable[[Role], HelloReply] | None = None) -> None:
        self.name = name
        self.credentials = credentials or Credentials.open()
        self.limits = limits or ServerLimits()
        self.max_payload = max_payload
        self.hello_reply = hello or (lambda role: HelloReply(service=name, role=role))
        self.handlers: dict[str, Binding[Any, Any]] = {}
        for binding in bindings:
            op = binding.spec.name
            if ops.get(op) is not binding.spec:
                raise TypeError(f"{name}: op {op!r} is not one of this service's ops "
                                "(kvstored/protocol/ops.py)")
            if op in self.handlers:
                raise TypeError(f"{name}: op {op!r} has two handlers")
            self.handlers[op] = binding
        missing = sorted(set(ops) - set(self.handlers))
        if missing:
            raise TypeError(f"{name}: declared ops without a handler: {missing}")
        self.on_disconnect: Callable[[FramedSocket], Awaitable[None]] | None = None
        self.connections = 0
        self.unauthenticated: Counter[str] = Counter()
        self._refusing = 0
        self._quiet = _QuietLog()

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
        conn = self._preauth_socket(stream, min(READ_AHEAD,
                                                PREFIX.size + self.limits.preauth_header_limit))
        conn.peer = peer
        conn.admitted_as = address
        try:
            await self.handle_connection(stream, conn)
        finally:
            self.connections -= 1
            if conn.admitted_as is not None:
                self._authenticated(conn.admitted_as)

    def _preauth_socket(self, stream: trio.SocketStream, read_ahead: int) -> FramedSocket:
        return FramedSocket(stream.socket, 0, max_header=self.limits.preauth_header_limit,
                            read_ahead=read_ahead, send_stall=self.limits.send_stall)

    async def _refuse(self, stream: trio.SocketStream, address: str, reason: str) -> None:
        """Tell a refused peer why (within a second), then close."""
        self._quiet(logging.WARNING, "%s: refused a connection from %s: %s", self.name,
                    address, reason)
        self._refusing += 1
        try:
            # Bounded too: past this many refusals in flight, just close.
            if self._refusing <= 64:
                with trio.move_on_after(1):
                    await self._preauth_socket(stream, PREFIX.size).send_frame(
                        _error_reply(UnreachableError(reason)))
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
            conn = self._preauth_socket(stream, READ_AHEAD)
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
                    await conn.send_frame(_error_reply(BadRequestError(
                        f"malformed frame: {exc}")))
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
                await conn.send_frame(_error_reply(exc))
                return False
            conn.authenticated(role, self.max_payload)
            if conn.admitted_as is not None:
                self._authenticated(conn.admitted_as)
                conn.admitted_as = None
            await conn.answer(self.hello_reply(role))
            return True
        self._quiet(logging.INFO, "%s: %s sent no hello within %gs (security.hello_timeout); "
                    "closed", self.name, conn.peer, self.limits.hello_timeout)
        return False

    async def _dispatch(self, conn: FramedSocket, header: dict[str, Any]) -> None:
        op = header.get("op")
        binding = self.handlers.get(op) if isinstance(op, str) else None
        if conn.payload_left and (binding is None or not binding.spec.payload):
            # Reading a payload nobody wants would cost up to max_payload: hang up instead.
            raise FrameError(f"op {op!r:.60} takes no payload, but the frame carries "
                             f"{conn.payload_left} bytes")
        try:
            if binding is None:
                known = ", ".join(sorted(self.handlers))
                raise BadRequestError(f"unknown op {op!r:.60}; known: {known}")
            spec = binding.spec
            assert conn.role is not None
            if not conn.role.may_call(spec.role):
                raise UnauthorizedError(f"{op} is a {spec.role.value} operation and this "
                                        f"connection is authenticated as a {conn.role.value}")
            result = await binding.handler(conn, spec.check(header))
            if isinstance(result, Answered):
                return
            response = OpSpec.reply_header(result)
        except StoreError as exc:
            response = _error_reply(exc)
        except (FrameError, ConnectionClosed, OSError, trio.BrokenResourceError):
            raise
        except (KeyError, TypeError, ValueError) as exc:
            log.warning("%s: op %s from %s: %r", self.name, op, conn.peer, exc)
            response = _error_reply(BadRequestError(f"malformed {op} request: {exc!r}"))
        except Exception as exc:
            log.exception("%s: op %s failed", self.name, op)
            response = _error_reply(InternalError(f"{op} failed: {exc!r}"))
        await conn.discard_payload()
        await conn.send_frame(response)


async def serve(service: Service, host: str, port: int, *,
                task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED
                ) -> None:
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


async def say_hello(conn: AsyncFrames, role: Role, token: str | None) -> HelloReply:
    """The hello of a new connection, and the server's answer (a refusal raises)."""
    await conn.send_frame(HELLO.request_header(Hello(role, token)))
    return HELLO.decode_reply(await conn.recv_header())


async def exchange(conn: AsyncFrames, spec: OpSpec[Req, Rep], request: Req,
                   payload: Payload = (), into: Sequence[Into] | None = None,
                   sums: list[int | None] | None = None) -> Rep:
    """One call over ``conn`` (trio's or asyncio's): send ``request`` with ``payload``,
    return the reply (raising the error the peer answered), its payload received into
    ``into`` (see :meth:`OpSpec.payload_items`) or discarded, and ``sums[i]``, if
    given, set to the CRC-32C of item ``i`` as it lands. Whatever breaks the exchange
    is the caller's to map (and the connection is then out of step)."""
    await conn.send_frame(spec.request_header(request), payload)
    header = await conn.recv_header()
    try:
        reply = spec.decode_reply(header)
    except StoreError:
        await conn.discard_payload()
        raise
    if into is not None:
        for i, views in spec.payload_items(reply, into):
            crc = 0
            for view in views:
                await conn.recv_payload_into(view)
                if sums is not None:
                    crc = crc32c(view, crc)
            if sums is not None:
                sums[i] = crc
    await conn.discard_payload()
    if spec.trailer_follows(reply):
        reply = spec.with_trailer(reply, await conn.recv_header())
    return reply


class RpcClient:
    """An async caller over one connection; calls are serialised by a lock.

    ``connect_timeout`` bounds reaching the peer and its answer to the hello, so a port
    that serves something else, or nothing, fails in seconds with the address named;
    ``timeout`` bounds each call after that. A call that fails on the way (the
    connection broke, timed out, or the peer answered something that is not this op's
    reply) closes the connection and raises :class:`UnreachableError`; the next call
    connects again. An error the peer answered (a ``StoreError``) leaves it open.
    """

    def __init__(self, address: tuple[str, int], *, token: str | None = None,
                 role: Role = Role.CLIENT, connect_timeout: float = 10.0,
                 timeout: float = math.inf, max_payload: int = DEFAULT_MAX_PAYLOAD) -> None:
        self.address = address
        self.token = token
        self.role = role
        self.connect_timeout = connect_timeout
        self.timeout = timeout
        self.max_payload = max_payload
        self.conn: FramedSocket | None = None
        self.server_hello: HelloReply | None = None
        self._lock = trio.Lock()

    @property
    def where(self) -> str:
        return f"{self.address[0]}:{self.address[1]}"

    async def connect(self) -> HelloReply:
        """Open the connection and say hello; on any failure nothing stays open."""
        with connect_failures(self.where, self.connect_timeout, timeouts=_TOO_SLOW):
            with trio.fail_after(self.connect_timeout):
                stream = await trio.open_tcp_stream(*self.address)
        conn = FramedSocket(stream.socket, self.max_payload)
        with exchange_failures(self.where, self.connect_timeout, stream.socket.close,
                               timeouts=_TOO_SLOW, broken=_EXCHANGE_BROKEN):
            with trio.fail_after(self.connect_timeout):
                reply = await say_hello(conn, self.role, self.token)
        self.conn = conn
        self.server_hello = reply
        return reply

    async def call(self, spec: OpSpec[Req, Rep], request: Req, payload: Payload = (),
                   into: Sequence[Into] | None = None, sums: list[int | None] | None = None) -> Rep:
        """Send ``request`` and return the reply (raising the error the peer answered).
        A reply payload is received into ``into``, or discarded; ``sums`` as in
        :func:`exchange`."""
        async with self._lock:
            conn = await self._ready()
            with exchange_failures(self.where, self.timeout, self.close, op=spec.name,
                                   timeouts=_TOO_SLOW, broken=_EXCHANGE_BROKEN):
                with trio.fail_after(self.timeout):
                    return await exchange(conn, spec, request, payload, into, sums)

    async def hello(self) -> HelloReply:
        """The server's answer to the hello, connecting first if need be."""
        async with self._lock:
            await self._ready()
        assert self.server_hello is not None
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
