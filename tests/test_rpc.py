"""The RPC server and caller in one process, over real loopback sockets: the hello and its
bounds, roles, request checks, connection limits, and what a failed connect leaves open."""

from __future__ import annotations

import math
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Annotated, Any

import pytest
import trio

from kvstored import rpc
from kvstored.errors import BadRequestError, UnauthorizedError, UnreachableError
from kvstored.node.regions import holds_socket
from kvstored.protocol import PROTOCOL_VERSION, Message, Op, OpSpec, Role, message
from kvstored.protocol.master_api import Empty
from kvstored.protocol.shapes import Int
from kvstored.rpc import Binding, RpcClient, ServerLimits, Service, serve
from kvstored.security import Credentials
from kvstored.wire import MAGIC, PREFIX, FrameReader, pack_header


@message
class Echo(Message):
    n: Annotated[int, Int(0, 100)]


@message
class Echoed(Message):
    n: int
    role: Role


# Test ops borrow names of the protocol's (a service serves one table of specs).
ECHO = OpSpec(Op.LOOKUP, Role.CLIENT, Echo, Echoed)
BOOM = OpSpec(Op.STAT, Role.CLIENT, Empty, Empty)
REPORT = OpSpec(Op.COMMIT, Role.NODE, Empty, Empty)
OPS = {spec.name: spec for spec in (ECHO, BOOM, REPORT)}


async def echo(conn, request: Echo) -> Echoed:
    return Echoed(request.n, conn.role)


async def boom(conn, request: Empty) -> Empty:
    raise AttributeError("a bug")


async def report(conn, request: Empty) -> Empty:
    return Empty()


BINDINGS = [Binding(ECHO, echo), Binding(BOOM, boom), Binding(REPORT, report)]


def _service(**limits: Any) -> Service:
    return Service("test", OPS, BINDINGS, credentials=Credentials(True, client="c-token",
                                                                   node="n-token"),
                   limits=ServerLimits(**limits))


def _run(service: Service, scenario: Callable[[tuple[str, int]], None]) -> None:
    """Serve ``service`` on a free loopback port while ``scenario(address)`` runs in a
    worker thread (blocking sockets), then stop."""
    async def main() -> None:
        async with trio.open_nursery() as nursery:
            address = await nursery.start(serve, service, "127.0.0.1", 0)
            await trio.to_thread.run_sync(scenario, address)
            nursery.cancel_scope.cancel()

    trio.run(main)


def _hello(address, role="client", token="c-token", **extra) -> tuple[socket.socket,
                                                                     FrameReader, dict]:
    sock = socket.create_connection(address, timeout=10)
    reader = FrameReader(sock)
    sock.sendall(pack_header({"op": "hello", "version": PROTOCOL_VERSION, "role": role,
                              "token": token,
                              **extra}))
    return sock, reader, reader.recv_header()


def _ask(sock, reader, header) -> dict:
    sock.sendall(pack_header(header))
    return reader.recv_header()


def test_a_non_ascii_token_is_refused_and_the_server_serves_on():
    def scenario(address):
        for token in ("é", "☃" * 100, "\x00"):
            sock, _, reply = _hello(address, token=token)
            assert reply["error"]["code"] == "unauthorized", reply
            sock.close()
        sock, reader, reply = _hello(address)
        assert reply["ok"] and reply["role"] == "client"
        assert _ask(sock, reader, {"op": "lookup", "n": 3})["n"] == 3
        sock.close()

    _run(_service(), scenario)


def test_roles_come_from_the_token_and_node_ops_need_the_node_token():
    def scenario(address):
        sock, reader, reply = _hello(address)
        refused = _ask(sock, reader, {"op": "commit"})
        assert refused["error"]["code"] == "unauthorized"
        assert "node operation" in refused["error"]["message"]
        assert _ask(sock, reader, {"op": "lookup", "n": 1})["ok"]  # still usable
        sock.close()
        sock, _, reply = _hello(address, role="node", token="c-token")
        assert reply["error"]["code"] == "unauthorized" and "node token" in \
            reply["error"]["message"]
        sock.close()
        sock, reader, reply = _hello(address, role="node", token="n-token")
        assert reply["role"] == "node"
        assert _ask(sock, reader, {"op": "commit"})["ok"]
        assert _ask(sock, reader, {"op": "lookup", "n": 2})["role"] == "node"
        sock.close()

    _run(_service(), scenario)


def test_requests_are_checked_against_their_declaration_before_the_handler():
    def scenario(address):
        sock, reader, _ = _hello(address)
        for bad, words in (({"op": "lookup"}, "n is missing"),
                           ({"op": "lookup", "n": -1}, "from 0 to 100, not -1"),
                           ({"op": "lookup", "n": True}, "not a boolean"),
                           ({"op": "lookup", "n": [1]}, "not a list"),
                           ({"op": "nope"}, "unknown op 'nope'")):
            reply = _ask(sock, reader, bad)
            assert reply["error"]["code"] == "bad_request" and words in \
                reply["error"]["message"], (bad, reply)
        assert _ask(sock, reader, {"op": "lookup", "n": 5, "extra": {"ignored": [1]}})["n"] == 5
        # A handler's own bug is an internal error for that request only.
        assert _ask(sock, reader, {"op": "stat"})["error"]["code"] == "internal"
        assert _ask(sock, reader, {"op": "lookup", "n": 6})["n"] == 6
        # A payload on an op that takes none: answered, then hung up (not read).
        sock.sendall(pack_header({"op": "lookup", "n": 1}, payload_len=1 << 30))
        reply = reader.recv_header()
        assert "takes no payload" in reply["error"]["message"]
        assert sock.recv(1) == b""
        sock.close()

    _run(_service(), scenario)


def test_a_service_serves_each_op_of_its_table_once_and_nothing_else():
    with pytest.raises(TypeError, match=r"'put' is not one of this service's ops"):
        Service("test", OPS, [*BINDINGS, Binding(OpSpec(Op.PUT, Role.CLIENT, Empty, Empty),
                                                 report)])
    with pytest.raises(TypeError, match=r"without a handler: \['commit'\]"):
        Service("test", OPS, BINDINGS[:2])
    with pytest.raises(TypeError, match="two handlers"):
        Service("test", OPS, [*BINDINGS, BINDINGS[0]])


def test_before_the_hello_headers_are_small_payloads_absent_and_time_short():
    def scenario(address):
        # An 8 MiB header declared up front is refused at the prefix, nothing allocated.
        sock = socket.create_connection(address, timeout=10)
        sock.sendall(PREFIX.pack(MAGIC, 8 << 20, 0))
        reply = FrameReader(sock).recv_header()
        assert "header length 8388608 exceeds 1024" in reply["error"]["message"]
        sock.close()
        sock = socket.create_connection(address, timeout=10)
        sock.sendall(pack_header({"op": "hello", "version": PROTOCOL_VERSION,
                                  "token": "c-token"}, 10))
        assert "payload length 10 exceeds the limit 0" in \
            FrameReader(sock).recv_header()["error"]["message"]
        sock.close()
        # A silent peer is dropped at the deadline.
        sock = socket.create_connection(address, timeout=10)
        assert sock.recv(1) == b""
        sock.close()
        # After the hello, the usual header limit applies.
        sock, reader, _ = _hello(address)
        assert _ask(sock, reader, {"op": "lookup", "n": 1, "pad": "x" * 100_000})["ok"]
        sock.close()

    _run(_service(preauth_header_limit=1024, hello_timeout=0.3), scenario)


def test_connection_limits_per_peer_and_in_total():
    def scenario(address):
        silent = []
        for _ in range(2):
            s = socket.socket()
            s.bind(("127.0.0.2", 0))
            s.connect(address)
            silent.append(s)
        s = socket.socket()
        s.bind(("127.0.0.2", 0))
        s.settimeout(10)
        s.connect(address)
        reply = FrameReader(s).recv_header()
        assert "max_unauthenticated_per_peer" in reply["error"]["message"]
        s.close()
        held = [_hello(address)[0] for _ in range(2)]  # another address: let in
        sock, _, reply = _hello(address)
        assert "security.max_connections" in reply["error"]["message"], reply
        for s in [*silent, *held, sock]:
            s.close()

    _run(_service(max_unauthenticated_per_peer=2, max_connections=4), scenario)


def _sockets_on_port(port: int) -> list[str]:
    """This process's open TCP sockets with ``port`` at either end, as /proc/net/tcp lists
    them. Counting every descriptor of the process would be racy: other tests' threads and
    the garbage collector open and close descriptors while this test waits."""
    found = []
    with open("/proc/net/tcp") as table:
        next(table)
        for line in table:
            fields = line.split()
            local, remote, inode = fields[1], fields[2], fields[9]
            ends = {int(local.split(":")[1], 16), int(remote.split(":")[1], 16)}
            if port in ends and holds_socket(os.getpid(), int(inode)):
                found.append(f"{local} -> {remote}")
    return found


@pytest.mark.parametrize("server", ["refuses", "hangs_up", "garbage", "silent"])
def test_a_failed_connect_leaves_nothing_open(server):
    """Every way the hello can fail closes the socket (the error keeps its traceback, so a
    socket the code forgot would still be referenced and open)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]

    def peer() -> None:
        conn, _ = listener.accept()
        conn.recv(4096)
        if server == "refuses":
            conn.sendall(pack_header({"ok": False, "error": {"code": "unauthorized",
                                                             "message": "no"}}))
        elif server == "garbage":
            conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n" + b"x" * 100)
        elif server == "silent":
            conn.recv(1)  # until the client gives up
        conn.close()

    async def main() -> BaseException:
        client = RpcClient(listener.getsockname(), token="t", connect_timeout=0.5)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.to_thread.run_sync, peer)
            try:
                await client.connect()
            except (UnauthorizedError, UnreachableError) as exc:
                caught = exc
        assert client.conn is None
        return caught

    error = trio.run(main)
    assert len(_sockets_on_port(port)) == 1  # the listener: the check sees this test's sockets
    listener.close()
    left = _sockets_on_port(port)
    assert left == [], f"{server}: a socket was left open ({error}): {left}"
    assert ("no answer within 0.5s" in str(error)) == (server == "silent")
    assert ("bad frame magic" in str(error)) == (server == "garbage")


def test_a_call_cancelled_midway_closes_its_connection():
    async def slow(conn, request: Empty) -> Empty:
        await trio.sleep_forever()  # never answers: the caller gives up first

    spec = OpSpec(Op.STATUS, Role.CLIENT, Empty, Empty)
    service = Service("test", {spec.name: spec}, [Binding(spec, slow)])

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            address = await nursery.start(serve, service, "127.0.0.1", 0)
            client = RpcClient(address)
            with trio.move_on_after(0.2):
                await client.call(spec, Empty())
            assert client.conn is None  # a later call must not read this call's answer
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_a_peer_that_stops_reading_is_disconnected():
    big = b"x" * (32 << 20)
    gone = threading.Event()

    async def flood(conn, request: Empty):
        return await conn.answer(Empty(), [big])

    async def disconnected(conn) -> None:
        gone.set()

    spec = OpSpec(Op.STATUS, Role.CLIENT, Empty, Empty)
    service = Service("test", {spec.name: spec}, [Binding(spec, flood)],
                      limits=ServerLimits(send_stall=0.3))
    service.on_disconnect = disconnected

    def scenario(address):
        sock, _, _ = _hello(address)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.sendall(pack_header({"op": "status"}))
        # Read nothing of the answer: the server gives up on this connection.
        assert gone.wait(20), "the server kept sending to a peer that reads nothing"
        sock.close()

    _run(service, scenario)


def test_a_large_answer_arrives_whole_through_the_worker_thread(monkeypatch):
    """An answer larger than the socket's buffer is finished by blocking sends in a
    worker thread; the peer gets every byte, in order, and the connection goes on."""
    big = os.urandom(1 << 20) * 24
    threaded = []
    real = rpc._send_blocking

    def spy(*args):
        threaded.append(True)
        return real(*args)

    monkeypatch.setattr(rpc, "_send_blocking", spy)

    async def answer(conn, request: Empty):
        return await conn.answer(Empty(), [big[:8 << 20], big[8 << 20:]])

    spec = OpSpec(Op.STATUS, Role.CLIENT, Empty, Empty)
    service = Service("test", {spec.name: spec}, [Binding(spec, answer)])

    def scenario(address):
        sock, reader, _ = _hello(address)
        for _ in range(2):
            sock.sendall(pack_header({"op": "status"}))
            assert reader.recv_header()["ok"] is True
            got = memoryview(bytearray(reader.payload_left))
            reader.recv_payload_into(got)
            assert got == big
        sock.close()

    _run(service, scenario)
    assert threaded, "a 24 MiB answer was sent without the worker thread"


def test_cancelling_a_threaded_send_ends_it_before_the_handler_lets_go(monkeypatch):
    """A node shutting down while a large answer waits on a peer that reads nothing:
    the worker thread's send is ended at once (the socket is shut down), and the
    handler, whose pins hold the answer's memory, returns only after the thread is out."""
    big = b"x" * (32 << 20)
    entered = threading.Event()
    order: list[str] = []
    real = rpc._send_blocking

    def spy(*args):
        entered.set()
        try:
            return real(*args)
        finally:
            order.append("thread out")

    monkeypatch.setattr(rpc, "_send_blocking", spy)

    async def flood(conn, request: Empty):
        try:
            return await conn.answer(Empty(), [big])
        finally:
            order.append("handler out")

    spec = OpSpec(Op.STATUS, Role.CLIENT, Empty, Empty)
    service = Service("test", {spec.name: spec}, [Binding(spec, flood)],
                      limits=ServerLimits(send_stall=math.inf))
    socks = []

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            address = await nursery.start(serve, service, "127.0.0.1", 0)

            def ask():
                sock, _, _ = _hello(address)
                socks.append(sock)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                sock.sendall(pack_header({"op": "status"}))
                assert entered.wait(20), "the answer never reached the worker thread"

            await trio.to_thread.run_sync(ask)
            nursery.cancel_scope.cancel()

    started = time.monotonic()
    trio.run(main)
    assert time.monotonic() - started < 20
    assert order == ["thread out", "handler out"]
    socks[0].close()


def test_bad_request_error_is_the_one_a_spec_raises():
    with pytest.raises(BadRequestError, match="malformed lookup request: n must be"):
        ECHO.check({"n": "x"})
