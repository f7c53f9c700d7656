"""Protocol fuzzing against a real `kvstored up`: no frame, before or after the hello, takes
the daemon down, hangs it, or leaks a descriptor.

The cases come from :mod:`tests.faults.wirefuzz`: every field of every op of the master
and the node (and of the hello) broken every way it knows, unauthenticated, as a client
and as a node, plus broken prefixes and headers, plus seeded random combinations (the seed
is printed; set ``KVSTORED_FUZZ_SEED`` to replay one). ``KVSTORED_SOAK=1`` runs the long
soak as well.
"""

from __future__ import annotations

import os
import socket
import struct
import time
from pathlib import Path

import pytest
from crc32c import crc32c

import kvstored
from kvstored.protocol import MASTER_OPS, NODE_OPS, PROTOCOL_VERSION
from kvstored.wire import MAGIC, PREFIX
from tests.daemon.harness import Daemon
from tests.faults import wirefuzz

#: Small enough that silent peers are dropped while the test watches.
HELLO_TIMEOUT = "2s"


CLIENT_TOKEN = "fuzz-client-token"


def _tokens() -> dict[str, str | None]:
    """The client token the daemon was given, and the node token it generated where its
    user's nodes find it (a daemon with one token for both roles has no such file)."""
    node_token = Path(os.environ["XDG_CONFIG_HOME"]) / "kvstored" / "node-token"
    return {"client": CLIENT_TOKEN,
            "node": node_token.read_text().strip() if node_token.exists() else CLIENT_TOKEN}


@pytest.fixture
def up(embedded, tmp_path) -> Daemon:
    """`kvstored up` with a client token of its own and a short hello timeout."""
    token_file = tmp_path / "client-token"
    token_file.write_text(CLIENT_TOKEN + "\n")
    token_file.chmod(0o600)
    return embedded("--token-file", str(token_file),
                    env={"KVSTORED_SECURITY_HELLO_TIMEOUT": HELLO_TIMEOUT})


def _ports(up: Daemon) -> dict[str, tuple[str, int]]:
    with kvstored.connect(up.addr, token=CLIENT_TOKEN) as c:
        c.put("fuzz/survivor", b"still here")
        node = next(iter(c.nodes.values())).endpoint
    return {"master": up.address, "node": (node.host, node.port)}


@pytest.fixture
def peer(up):
    """A fuzzing peer of ``up``'s master and node ports (it connects per case), closed
    after the test whatever happens."""
    peer = wirefuzz.Peer(_ports(up), _tokens())
    yield peer
    peer.close()


def _still_serving(up: Daemon) -> None:
    assert up.proc.poll() is None, f"the daemon died:\n{up.log}"
    with kvstored.connect(up.addr, token=CLIENT_TOKEN) as c:
        key = f"fuzz/after-{time.monotonic_ns()}"
        assert c.put(key, b"fine") and c.get(key) == b"fine"
    tracebacks = [line for line in up.lines if "Traceback" in line]
    assert not tracebacks, "the daemon logged a traceback:\n" + up.log


def _run(up: Daemon, peer: wirefuzz.Peer, cases) -> dict[str, int]:
    outcomes: dict[str, int] = {}
    for case in cases:
        try:
            got = peer.send(case)
        except Exception as exc:
            raise AssertionError(f"{case}: {exc!r}\n{up.log}") from None
        assert not got.startswith("error internal"), f"{case} -> {got}"
        outcomes[got.split(":")[0]] = outcomes.get(got.split(":")[0], 0) + 1
    return outcomes


def test_a_bad_hello_closes_only_its_connection(up, peer):
    """The hello that killed the whole daemon: a token that is not ASCII, on both ports."""
    for port in ("master", "node"):
        for token in ("é", "\u2603" * 40, "tok\x00en"):
            case = wirefuzz.Case(f"hello with token {token!r}", port, None,
                                 wirefuzz.pack(wirefuzz.hello("client", token)))
            got = peer.send(case)
            assert got.startswith("error unauthorized"), f"{case} -> {got}"
    peer.close()
    _still_serving(up)


def test_fuzzing_every_field_of_every_op_leaves_the_daemon_serving(up, peer):
    seed = wirefuzz.seed_from_env()
    print(f"fuzz seed {seed} (KVSTORED_FUZZ_SEED)")
    outcomes = _run(up, peer, wirefuzz.cases(peer.tokens, "fuzz-node", seed))
    for what, n in _run(up, peer, wirefuzz.frame_edge_cases(peer.tokens)).items():
        outcomes[what] = outcomes.get(what, 0) + n
    peer.close()
    print("outcomes:", outcomes)
    assert outcomes.get("error bad_request", 0) > 1000  # the checks did the refusing
    _still_serving(up)


def test_a_put_of_a_key_no_backend_accepts_is_refused_at_the_door(up, peer):
    """An empty key was stored in DRAM, then its offload raised and took the daemon down."""
    for key in ("", "k" * 1025, "é" * 513):
        case = wirefuzz.Case(f"put of key {key[:8]!r}…", "node", "client", wirefuzz.pack(
            {"op": "put", "keys": [key], "sizes": [3], "checksums": [crc32c(b"abc")]}, 3),
            b"abc")
        got = peer.send(case)
        assert got.startswith("error bad_request") and "key" in got, f"{case} -> {got}"
    peer.close()
    with kvstored.connect(up.addr, token=CLIENT_TOKEN) as c:
        assert c.call("flush", wait=True)["done"]  # an offload round has run
    _still_serving(up)


def test_every_op_of_the_protocol_is_fuzzed_from_a_valid_request():
    templates = wirefuzz.templates({"client": None, "node": None}, "n")
    declared = {f"master/{op}": spec for op, spec in MASTER_OPS.items()}
    declared |= {f"node/{op}": spec for op, spec in NODE_OPS.items()}
    assert set(templates) == set(declared), \
        "give every new op a template in tests/faults/wirefuzz.py"
    for name, header in templates.items():
        declared[name].check(header)  # a mutation of a valid request tests one field
    assert set(wirefuzz.NODE_ONLY) == {op for op, spec in (MASTER_OPS | NODE_OPS).items()
                                       if spec.role.value == "node"}
    assert wirefuzz.VERSION == PROTOCOL_VERSION


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _slow_clients(ports: dict[str, tuple[str, int]], tokens
                  ) -> tuple[list[socket.socket], list[socket.socket]]:
    """Peers that stall and stay connected: (before the hello: silent, mid-prefix,
    mid-hello; after it: stuck mid-request, or not reading a large answer)."""
    preauth, postauth = [], []
    for port in ("master", "node"):
        address = ports[port]
        for stall in (b"", MAGIC + b"\x10", wirefuzz.pack(wirefuzz.hello(
                "client", tokens["client"]))[:PREFIX.size + 5]):
            for _ in range(8):
                s = socket.create_connection(address, timeout=10)
                s.sendall(stall)
                preauth.append(s)
        for _ in range(4):
            s = socket.create_connection(address, timeout=10)
            s.sendall(wirefuzz.pack(wirefuzz.hello("client", tokens["client"])))
            s.recv(4096)
            s.sendall(wirefuzz.pack({"op": "status"})[:PREFIX.size + 2])  # then nothing
            postauth.append(s)
    # A reader that asks for a large answer and never reads it (its receive buffer fills,
    # and the node's send blocks).
    s = socket.create_connection(ports["node"], timeout=10)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.sendall(wirefuzz.pack(wirefuzz.hello("client", tokens["client"])))
    s.recv(4096)
    s.sendall(wirefuzz.pack({"op": "get", "keys": ["fuzz/big"] * 64, "checksums": None}))
    postauth.append(s)
    return preauth, postauth


def _wait_fds(pid: int, most: int, what: str) -> None:
    deadline = time.monotonic() + 30
    while _fds(pid) > most:
        if time.monotonic() > deadline:
            held = sorted(os.readlink(f"/proc/{pid}/fd/{fd}")
                          for fd in os.listdir(f"/proc/{pid}/fd"))
            raise AssertionError(f"{what}: the daemon still holds {_fds(pid)} descriptors "
                                 f"after 30 s, expected at most {most}: {held}")
        time.sleep(0.1)


def test_descriptors_return_to_the_baseline_after_fuzzing_and_slow_clients(up, peer):
    ports, tokens = peer.ports, peer.tokens
    with kvstored.connect(up.addr, token=CLIENT_TOKEN) as c:
        assert c.put("fuzz/big", os.urandom(4 << 20))
    pid = up.proc.pid
    baseline = _fds(pid)
    preauth, postauth = _slow_clients(ports, tokens)
    try:
        cases = list(wirefuzz.cases(tokens, "fuzz-node", wirefuzz.seed_from_env(), 50))
        _run(up, peer, cases[::7])
        _run(up, peer, wirefuzz.frame_edge_cases(tokens))
        # Connections reset by the peer (SO_LINGER 0) right after connecting.
        for port in ("master", "node"):
            for _ in range(10):
                s = socket.create_connection(ports[port], timeout=10)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                s.close()
        # The peers that never said hello are dropped by the daemon (hello_timeout) while
        # they still hold their end; only the authenticated ones keep a descriptor.
        _wait_fds(pid, baseline + len(postauth), "silent peers still connected")
        for s in preauth:
            assert s.recv(4096) == b"", "the daemon kept talking to a peer that never said hello"
    finally:
        peer.close()
        for s in preauth + postauth:
            s.close()
    _wait_fds(pid, baseline, "every peer gone")
    _still_serving(up)
    _wait_fds(pid, baseline, "after a put and a get")


@pytest.mark.soak
@pytest.mark.skipif(os.environ.get("KVSTORED_SOAK") != "1", reason="soak: KVSTORED_SOAK=1")
def test_soak_random_fuzzing(up, peer):
    seed = wirefuzz.seed_from_env()
    print(f"fuzz seed {seed}")
    cases = wirefuzz.cases(peer.tokens, "fuzz-node", seed, random_cases=20000)
    _run(up, peer, (c for c in cases if c.what.startswith("random")))
    peer.close()
    _still_serving(up)
