"""The blocking, the trio and the asyncio clients are three shells over one core: driven
through the same scenarios against one real store, they give the same results and raise
the same errors (type, message and key), to the letter; and a peer that cannot be
reached, never answers, or answers something else fails each of them the same way.

Each shell works under a key prefix of its own; results are compared with the prefix
taken out. One scenario reads a key whose only replica sits on a node that accepts
connections and never answers: both shells must give up on it within their timeout and
miss, not hang (the trio client had no timeout on nodes).
"""

from __future__ import annotations

import asyncio
import functools
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

import kvstored
import kvstored.aio
import kvstored.asyncio
from kvstored.errors import StoreError
from kvstored.protocol import HelloReply, OpSpec, Role, Tier, ops
from kvstored.protocol.master_api import (
    CommitRequest,
    Endpoint,
    NodeContact,
    NodeRequest,
    RegisterRequest,
)
from kvstored.rpc import RpcClient
from kvstored.wire import ConnectionClosed, FrameReader, send_frame
from tests.daemon.conftest import embedded, spawn  # noqa: F401 - fixtures

MiB = 1 << 20
TIMEOUT = 2.0
BIG = os.urandom(MiB + 3)

#: (method, argument builder given the key prefix): what both shells are asked, in order.
Scenario = list[tuple[str, Callable[[str], tuple[Any, ...]]]]

SCENARIO: Scenario = [
    ("batch_put", lambda p: ([f"{p}a", f"{p}empty", f"{p}big"], [b"alpha", b"", BIG])),
    ("put", lambda p: (f"{p}a", b"again")),                       # written once: False
    ("get", lambda p: (f"{p}a",)),
    ("batch_get", lambda p: ([f"{p}big", f"{p}nothing", f"{p}empty", f"{p}a"],)),
    ("batch_get_into", lambda p: ([f"{p}a", f"{p}nothing"],
                                  [bytearray(10), bytearray(10)])),
    ("get_into", lambda p: (f"{p}big", bytearray(10))),           # too small: an error
    ("batch_get_into", lambda p: ([f"{p}a"], [])),                 # lengths differ
    ("batch_exists", lambda p: ([f"{p}a", f"{p}nothing"],)),
    ("prefix_hits", lambda p: ([f"{p}a", f"{p}big", f"{p}nothing", f"{p}empty"],)),
    ("stat", lambda p: (f"{p}big",)),
    ("stat", lambda p: (f"{p}nothing",)),
    ("put", lambda p: ("", b"x")),                                 # not a key
    ("put", lambda p: (p + "k" * 1100, b"x")),                     # a key too long
    ("batch_put", lambda p: ([f"{p}x", f"{p}y"], [b"x"])),         # lengths differ
    ("put", lambda p: (f"{p}huge", bytes(80 * MiB))),              # larger than DRAM
    ("call", lambda p: ("nope",)),
    ("call", lambda p: ("list", f"{p}")),
    ("get", lambda p: ("parity-ghost",)),                          # its node is silent
    ("remove", lambda p: (f"{p}a",)),
    ("batch_remove", lambda p: ([f"{p}a", f"{p}big"],)),
    ("get", lambda p: (f"{p}a",)),
    ("batch_put", lambda p: ([f"{p}ns/1", f"{p}ns/2"], [b"1", b"22"])),
    ("register_namespace", lambda p: (f"{p}ns/",)),
    ("register_namespace", lambda p: (f"{p}ns",)),                 # no '/' at its end
    ("batch_lookup_and_lock", lambda p: ([f"{p}ns/1", f"{p}nothing"], 5.0)),
    ("batch_unlock", lambda p: ([f"{p}ns/1", f"{p}ns/2"],)),
    ("batch_lookup_and_lock", lambda p: ([f"{p}ns/1"], 0)),        # not a lock's length
    ("batch_remove_prefix", lambda p: (f"{p}ns/",)),
    ("batch_remove_prefix", lambda p: ("",)),                      # the whole store: no
    # Scatter/gather objects: pieces in, pieces out, and what the pieces cannot take.
    ("batch_put_parts", lambda p: ([f"{p}parts", f"{p}parts0"],
                                   [[b"he", bytearray(b"llo"), memoryview(BIG)], []])),
    ("get", lambda p: (f"{p}parts",)),
    ("batch_get_into_parts", lambda p: ([f"{p}parts", f"{p}nothing", f"{p}parts0"],
                                        [[bytearray(4), bytearray(MiB + 4)], [bytearray(1)],
                                         []])),
    ("get_into_parts", lambda p: (f"{p}parts", [bytearray(5), bytearray(MiB)])),  # short
    ("put_parts", lambda p: (f"{p}x", [b"x", 3])),                 # not a buffer
    ("get_into_parts", lambda p: (f"{p}parts", [bytes(MiB + 8)])),  # read-only
    ("batch_put_parts", lambda p: ([f"{p}x"], [])),                # lengths differ
]


def _outcome(prefix: str, call: Callable[[], Any]) -> Any:
    try:
        return ("ok", _strip(call(), prefix))
    except StoreError as exc:
        return ("error", type(exc).__name__, _strip(exc.message, prefix),
                _strip(exc.key, prefix))


def _strip(value: Any, prefix: str) -> Any:
    """``value`` with the shell's key prefix taken out (results, messages, keys)."""
    if isinstance(value, str):
        return value.replace(prefix, "<p>")
    if isinstance(value, bytes | bytearray):
        return bytes(value)
    if isinstance(value, list | tuple):
        return type(value)(_strip(v, prefix) for v in value)
    if isinstance(value, dict):
        return {k: _strip(v, prefix) for k, v in value.items() if k != "after"}
    if isinstance(value, kvstored.ObjectInfo):
        # The eager offload adds an SSD copy when it gets to it: compare the DRAM ones.
        return (_strip(value.key, prefix), value.size, value.checksum,
                sorted((r.node, r.state) for r in value.replicas if r.tier is Tier.DRAM))
    return value


def _list_args(method: str, args: tuple[Any, ...]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if method == "call" and len(args) == 2:
        return (args[0],), {"prefix": args[1], "limit": 100}
    return args, {}


def _run_blocking(address: str, transport: str, prefix: str) -> list[Any]:
    out = []
    with kvstored.connect(address, transport=transport, timeout=TIMEOUT) as c:
        for method, build in SCENARIO:
            args, kwargs = _list_args(method, build(prefix))
            out.append(_outcome(prefix, functools.partial(getattr(c, method), *args,
                                                          **kwargs)))
        out.append(("stats", c.stats.node_failures, c.stats.checksum_failures))
    return out


async def _run_async(connect: Callable[..., Any], address: str, transport: str,
                     prefix: str) -> list[Any]:
    """The scenario through an async client (trio's or asyncio's: same calls)."""
    out = []
    async with connect(address, transport=transport, timeout=TIMEOUT) as c:
        for method, build in SCENARIO:
            args, kwargs = _list_args(method, build(prefix))
            try:
                result = ("ok", _strip(await getattr(c, method)(*args, **kwargs), prefix))
            except StoreError as exc:
                result = ("error", type(exc).__name__, _strip(exc.message, prefix),
                          _strip(exc.key, prefix))
            out.append(result)
        out.append(("stats", c.stats.node_failures, c.stats.checksum_failures))
    return out


def _run_trio(address: str, transport: str, prefix: str) -> list[Any]:
    return trio.run(_run_async, kvstored.aio.connect, address, transport, prefix)


def _run_asyncio(address: str, transport: str, prefix: str) -> list[Any]:
    return asyncio.run(_run_async(kvstored.asyncio.connect, address, transport, prefix))


class SilentNode:
    """A node registered with the master whose data server accepts connections and never
    answers, holding one committed object (``parity-ghost``)."""

    def __init__(self, master: tuple[str, int], node_token: str) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.held: list[socket.socket] = []
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._accepting = threading.Thread(target=self._accept, daemon=True)
        self._accepting.start()
        self._session = threading.Thread(target=trio.run, args=(self._register, master,
                                                               node_token), daemon=True)
        self._session.start()
        assert self._ready.wait(30), "the silent node did not register"

    def _accept(self) -> None:
        self.listener.settimeout(0.1)
        while not self._stop.is_set():
            try:
                self.held.append(self.listener.accept()[0])
            except TimeoutError:
                continue

    async def _register(self, master: tuple[str, int], token: str) -> None:
        rpc = RpcClient(master, token=token, role=Role.NODE)
        port = self.listener.getsockname()[1]
        await rpc.call(ops.REGISTER, RegisterRequest(
            "parity-silent", NodeContact(Endpoint("127.0.0.1", port), "elsewhere", "none",
                                         "00"), dram_capacity=MiB, ssd_capacity=0))
        await rpc.call(ops.REGISTER_DONE, NodeRequest("parity-silent"))
        await rpc.call(ops.COMMIT, CommitRequest("parity-silent", ["parity-ghost"], [5],
                                                 [7], [0]))
        self._ready.set()
        await trio.to_thread.run_sync(self._stop.wait)  # the session (and node) lives on
        rpc.close()

    def close(self) -> None:
        self._stop.set()
        self._session.join(10)
        self._accepting.join(10)
        for conn in self.held:
            conn.close()
        self.listener.close()


@pytest.mark.parametrize("transport", ["tcp", "auto"])
def test_the_three_shells_give_the_same_results_and_errors(embedded, transport):  # noqa: F811
    up = embedded(dram="64MiB")
    node_token = (Path(os.environ["XDG_CONFIG_HOME"]) / "kvstored" / "node-token").read_text()
    silent = SilentNode(up.address, node_token.strip())
    try:
        blocking = _run_blocking(up.addr, transport, f"sync-{transport}/")
        trio_side = _run_trio(up.addr, transport, f"trio-{transport}/")
        asyncio_side = _run_asyncio(up.addr, transport, f"asio-{transport}/")
    finally:
        silent.close()
    for (method, _), mine, trios, asyncios in zip(SCENARIO, blocking, trio_side,
                                                   asyncio_side):
        assert mine == trios == asyncios, method
    assert blocking[-1] == trio_side[-1] == asyncio_side[-1] == ("stats", 1, 0)
    # What the scenario expects, beyond agreeing.
    by_step = dict(zip([f"{i}:{m}" for i, (m, _) in enumerate(SCENARIO)], blocking))
    assert by_step["0:batch_put"] == ("ok", [True, True, True])
    assert by_step["1:put"] == ("ok", False)
    assert by_step["3:batch_get"] == ("ok", [BIG, None, b"", b"alpha"])
    assert by_step["5:get_into"][:2] == ("error", "BadRequestError")
    assert by_step["14:put"][1] == "NoSpaceError"
    assert by_step["17:get"] == ("ok", None)
    assert by_step["20:get"] == ("ok", None)
    assert by_step["22:register_namespace"] == ("ok", 2)
    assert by_step["23:register_namespace"][:2] == ("error", "BadRequestError")
    assert by_step["24:batch_lookup_and_lock"] == ("ok", [True, False])
    assert by_step["25:batch_unlock"] == ("ok", [True, False])
    assert by_step["26:batch_lookup_and_lock"][:2] == ("error", "BadRequestError")
    assert by_step["27:batch_remove_prefix"] == ("ok", 2)
    assert by_step["28:batch_remove_prefix"][:2] == ("error", "BadRequestError")
    assert by_step["29:batch_put_parts"] == ("ok", [True, True])
    assert by_step["30:get"] == ("ok", b"hello" + BIG)
    assert by_step["31:batch_get_into_parts"] == ("ok", [MiB + 8, -1, 0])
    for step in ("32:get_into_parts", "33:put_parts", "34:get_into_parts",
                 "35:batch_put_parts"):
        assert by_step[step][:2] == ("error", "BadRequestError"), step


def test_a_trio_read_from_a_node_that_never_answers_misses_within_the_timeout(embedded):  # noqa: F811
    """The trio client bounds node requests (connecting included) by its timeout."""
    up = embedded()
    node_token = (Path(os.environ["XDG_CONFIG_HOME"]) / "kvstored" / "node-token").read_text()
    silent = SilentNode(up.address, node_token.strip())

    async def main() -> tuple[bytes | None, float]:
        async with kvstored.aio.connect(up.addr, transport="tcp", timeout=1.0) as c:
            started = trio.current_time()
            with trio.fail_after(20):
                got = await c.get("parity-ghost")
            return got, trio.current_time() - started

    try:
        got, took = trio.run(main)
    finally:
        silent.close()
    assert got is None and took < 10


@pytest.mark.parametrize("transport", ["tcp", "auto"])
def test_a_get_says_which_tier_served_each_key_in_both_shells(embedded, transport):  # noqa: F811
    up = embedded()
    with kvstored.connect(up.addr, transport=transport) as client:
        client.batch_put(["cold", "hot"], [b"on ssd", b"in dram"])
        client.call("flush", wait=True, timeout=30)
        client.call("evict", tier="dram", keys=["cold"])
        deadline = time.monotonic() + 60
        while {r.tier for r in client.stat("cold").replicas} != {Tier.SSD}:
            assert time.monotonic() < deadline, "the DRAM copy of cold was never freed"
            time.sleep(0.02)
        keys = ["cold", "hot", "nothing"]
        tiers: list[Tier | None] = []
        buffers = [bytearray(10) for _ in keys]
        assert client.batch_get_into(keys, buffers, tiers=tiers) == [6, 7, -1]
        assert tiers == [Tier.SSD, Tier.DRAM, None]

    async def trio_side() -> list[Tier | None]:
        async with kvstored.aio.connect(up.addr, transport=transport) as c:
            got: list[Tier | None] = []
            await c.batch_get_into(keys, [bytearray(10) for _ in keys], tiers=got)
            return got

    assert trio.run(trio_side) == [Tier.SSD, Tier.DRAM, None]


class OddPeer:
    """A listener that misbehaves one way for every connection: ``silent`` accepts and
    never answers; ``garbage`` answers the hello with something that is not a frame;
    ``mute`` answers the hello as a master does, then no request."""

    def __init__(self, how: str) -> None:
        self.how = how
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.addr = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.held: list[socket.socket] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn = self.listener.accept()[0]
            except OSError:
                return  # closed
            self.held.append(conn)
            if self.how == "silent":
                continue
            try:
                FrameReader(conn).recv_header()
                if self.how == "garbage":
                    conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
                else:
                    send_frame(conn, OpSpec.reply_header(HelloReply(service="master")))
            except (OSError, ConnectionClosed):
                pass

    def close(self) -> None:
        self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accept (Linux)
        self.listener.close()
        self._thread.join(10)
        for conn in self.held:
            conn.close()


def _connect_outcome(shell: str, address: str) -> tuple[str, str]:
    """The error of connecting with ``shell`` to ``address`` (and, if that works, of a
    status call)."""
    options = {"transport": "tcp", "timeout": 0.5, "token": "t"}

    async def via(connect: Callable[..., Any]) -> None:
        async with connect(address, **options) as c:
            await c.call("status")

    try:
        if shell == "blocking":
            with kvstored.connect(address, **options) as c:
                c.call("status")
        elif shell == "trio":
            trio.run(via, kvstored.aio.connect)
        else:
            asyncio.run(via(kvstored.asyncio.connect))
    except StoreError as exc:
        return type(exc).__name__, exc.message
    raise AssertionError(f"{shell}: connecting to {address} did not fail")


@pytest.mark.parametrize("how", ["closed", "silent", "garbage", "mute"])
def test_a_peer_that_fails_fails_the_three_shells_with_one_error(how):
    if how == "closed":
        probe = socket.create_server(("127.0.0.1", 0))
        address = f"127.0.0.1:{probe.getsockname()[1]}"
        probe.close()
        peer = None
    else:
        peer = OddPeer(how)
        address = peer.addr
    try:
        outcomes = [_connect_outcome(shell, address)
                    for shell in ("blocking", "trio", "asyncio")]
    finally:
        if peer is not None:
            peer.close()
    assert outcomes[0] == outcomes[1] == outcomes[2], outcomes
    kind, message = outcomes[0]
    assert kind == "UnreachableError"
    expected = {
        "closed": f"cannot reach {address} (Connection refused); is kvstored running?",
        "silent": f"{address} did not answer the hello as kvstored does (no answer within "
                  "0.5s); is that a kvstored master's or node's address?",
        "mute": f"the connection to {address} failed during status: no answer within 0.5s",
    }
    if how in expected:
        assert message == expected[how]
    else:
        assert message.startswith(f"{address} did not answer the hello as kvstored does "
                                  "(bad frame magic")
