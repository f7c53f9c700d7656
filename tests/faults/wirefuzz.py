"""A protocol fuzzer for real kvstored processes: valid requests for every op, and every
way of breaking each field of each one.

:func:`cases` yields :class:`Case` objects: a role to connect as (``None``: send it as the
first frame, unauthenticated), the port (``"master"`` or ``"node"``), and the frame bytes.
:class:`Peer` sends a case over a real socket and classifies what came back. The fuzzer
needs nothing of kvstored but the wire format, so it runs against any version.

Randomness is seeded (:data:`DEFAULT_SEED`, or ``KVSTORED_FUZZ_SEED``) and the seed is in
every failure message.
"""

from __future__ import annotations

import copy
import math
import os
import random
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import msgpack
from crc32c import crc32c

from kvstored.wire import MAGIC, PREFIX, ConnectionClosed, FrameError, FrameReader

DEFAULT_SEED = 20261201
MAX_BATCH = 65536

#: Packs to a str whose bytes are not UTF-8 (swapped in after packing).
_BAD_UTF8 = "\ue000\ue001"
_BAD_UTF8_PACKED = msgpack.packb(_BAD_UTF8)
_BAD_UTF8_BYTES = b"\xa6\xff\xfe\xc0\x80\xed\xa0"


class BadUtf8:
    """Marker: this value goes on the wire as a msgpack str of invalid UTF-8."""


def pack(header: Any, payload_len: int = 0) -> bytes:
    """A frame's prefix and header (``header`` may hold :class:`BadUtf8` markers, and
    need not be a map)."""
    body = msgpack.packb(_swap(header), use_bin_type=True)
    body = body.replace(_BAD_UTF8_PACKED, _BAD_UTF8_BYTES)
    return PREFIX.pack(MAGIC, len(body), payload_len) + body


def _swap(value: Any) -> Any:
    if isinstance(value, BadUtf8):
        return _BAD_UTF8
    if isinstance(value, dict):
        return {_swap(k): _swap(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_swap(v) for v in value]
    return value


#: What a field is replaced with: wrong types, extremes, nested garbage, bad text.
BAD_VALUES: tuple[Any, ...] = (
    None, True, 0, -1, 2**64 - 1, -(2**63), 1.5, -0.0, math.nan, math.inf, -math.inf,
    "", "é∂ü\u2028", "\x00", "x" * 3000, b"\xff\x00\x01", BadUtf8(), [], [None],
    [[[[[[]]]]]], {}, {"a": [1, {"b": None}]}, {"": ""}, [2**64 - 1, -1, "k"],
)


def templates(tokens: dict[str, str | None], node_name: str) -> dict[str, dict[str, Any]]:
    """A valid request for every op, by ``"port/op"``. ``node_name`` is a node name the
    fuzzer may register (never the live node's)."""
    value = b"abc"
    k, crc = "fuzz/k", crc32c(value)
    done = {"offloaded": {"keys": [k], "checksums": [crc]},
            "offload_failed": [{"key": k, "reason": "no_space", "message": "because"}],
            "dropped": {"keys": [k, k], "tiers": ["dram", "ssd"], "versions": [4096, None]},
            "ssd_evicted": [k],
            "promoted": {"keys": [k], "offsets": [4096], "checksums": [crc]},
            "recovered": [{"id": 1, "repaired": False, "records_checked": 0, "problems": [
                {"kind": "bad-record", "detail": "d", "key": k, "path": "/p",
                 "action": None}]}]}
    return {
        "master/register": {"op": "register", "node": node_name, "contact": {
            "endpoint": {"host": "127.0.0.1", "port": 1}, "host_id": "fuzz-host",
            "segment": "kvstored-fuzz", "segment_token": "00" * 16},
            "dram_capacity": 0, "ssd_capacity": 0, "backend": "fuzz", "shared": False,
            "max_value_size": 1 << 20},
        "master/register_objects": {"op": "register_objects", "node": node_name,
                                    "keys": [k], "sizes": [3], "checksums": [crc],
                                    "tiers": ["ssd"], "offsets": [-1]},
        "master/register_done": {"op": "register_done", "node": node_name},
        "master/commit": {"op": "commit", "node": node_name, "keys": [k], "sizes": [3],
                          "checksums": [crc], "offsets": [4096]},
        "master/heartbeat": {"op": "heartbeat", "node": node_name, "done": done,
                             "stats": {"dram_used": 0, "ssd_used": 0, "ssd_objects": 0,
                                       "corrupt_reads": 0, "quarantined": 0,
                                       "offload_problem": "its SSD is full"},
                             "held_reads": ["fuzz/k"]},
        "master/ssd_evicted": {"op": "ssd_evicted", "node": node_name, "keys": ["fuzz/k"]},
        "master/leaving": {"op": "leaving", "node": node_name},
        "master/unregister": {"op": "unregister", "node": node_name},
        "master/put_target": {"op": "put_target", "keys": ["fuzz/t"], "sizes": [3],
                              "host": "fuzz-host"},
        "master/put_abort": {"op": "put_abort", "keys": ["fuzz/t"]},
        "master/lookup": {"op": "lookup", "keys": ["fuzz/k", "fuzz/k"], "lease": True},
        "master/exists": {"op": "exists", "keys": ["fuzz/k"]},
        "master/prefix_hits": {"op": "prefix_hits", "keys": ["fuzz/k", "fuzz/l"]},
        "master/stat": {"op": "stat", "key": "fuzz/k"},
        "master/remove": {"op": "remove", "keys": ["fuzz/gone"]},
        "master/lock": {"op": "lock", "keys": ["fuzz/k", "fuzz/l"], "holder": "fuzz-holder",
                        "ttl": 1.0, "leading": True},
        "master/unlock": {"op": "unlock", "keys": ["fuzz/k"], "holder": "fuzz-holder"},
        "master/remove_prefix": {"op": "remove_prefix", "prefix": "fuzz/gone/",
                                 "dry_run": True},
        "master/add_namespace": {"op": "add_namespace", "prefix": "fuzz/ns/"},
        "master/list": {"op": "list", "prefix": "fuzz/", "after": "fuzz/a", "limit": 10,
                        "node": None, "tier": "dram"},
        "master/status": {"op": "status"},
        "master/flush": {"op": "flush", "node": None, "wait": True, "timeout": 5},
        "master/evict": {"op": "evict", "tier": "ssd", "keys": ["fuzz/none"], "prefix": None,
                         "bytes": 1, "dry_run": True, "drop": False},
        "master/recover": {"op": "recover", "node": "no-such-node", "repair": False,
                           "timeout": 5},
        "node/put": {"op": "put", "keys": ["fuzz/p"], "sizes": [3],
                     "checksums": [crc32c(value)]},
        "node/alloc": {"op": "alloc", "keys": ["fuzz/a"], "sizes": [3],
                       "checksums": [crc32c(value)]},
        "node/seal": {"op": "seal", "keys": ["fuzz/a"]},
        "node/abort": {"op": "abort", "keys": ["fuzz/a"]},
        "node/get": {"op": "get", "keys": ["fuzz/p", "fuzz/p"], "checksums": [1, None]},
        "node/get_held": {"op": "get_held", "keys": ["fuzz/p", "fuzz/p"],
                          "checksums": [crc32c(value), 1]},
        "node/revoke": {"op": "revoke", "keys": ["fuzz/r"]},
        "node/locate": {"op": "locate", "keys": ["fuzz/p"]},
        "node/report_corrupt": {"op": "report_corrupt", "keys": ["fuzz/p"],
                                "checksums": [crc32c(value)]},
        # Refused (the fuzzer's process 1 does not hold its connection), never followed.
        "node/register_memory": {"op": "register_memory", "pid": 1, "fd": 0, "device": 0,
                                 "inode": 0, "size": 4096, "host_id": "fuzz-host"},
        "node/copy_in": {"op": "copy_in", "keys": ["fuzz/a"], "region": 1,
                         "token": "00" * 16, "extents": [[0, 3]]},
        "node/copy_out": {"op": "copy_out", "keys": ["fuzz/p"], "region": 1,
                          "token": "00" * 16, "extents": [[0, 3, 4096, 1]],
                          "checksums": [crc]},
    }


#: The ops only a node may send (to the master; ``revoke`` is the master's, as a node, to
#: a node's data server).
NODE_ONLY = ("register", "register_objects", "register_done", "commit", "heartbeat",
             "ssd_evicted", "leaving", "unregister", "revoke")


def _paths(value: Any, prefix: tuple = ()) -> Iterator[tuple]:
    """Every place in ``value`` a mutation can hit: map fields, and the first item of
    each list (recursively)."""
    if isinstance(value, dict):
        for key, inner in value.items():
            yield (*prefix, key)
            yield from _paths(inner, (*prefix, key))
    elif isinstance(value, list) and value:
        yield (*prefix, 0)
        yield from _paths(value[0], (*prefix, 0))


def _at(header: Any, path: tuple) -> tuple[Any, Any]:
    parent = header
    for step in path[:-1]:
        parent = parent[step]
    return parent, path[-1]


def mutations(header: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(description, mutated copy) for every field of ``header``."""
    for path in _paths(header):
        where = ".".join(map(str, path))
        for bad in BAD_VALUES:
            mutated = copy.deepcopy(header)
            parent, last = _at(mutated, path)
            parent[last] = copy.deepcopy(bad)
            yield f"{where}={bad!r:.30}", mutated
        mutated = copy.deepcopy(header)
        parent, last = _at(mutated, path)
        if isinstance(parent, dict):
            del parent[last]
            yield f"{where} missing", mutated
        else:
            parent.pop(last)
            yield f"{where} removed (shorter list)", mutated
        original = _at(header, path)
        item = original[0][original[1]]
        if isinstance(item, list) and item:
            for label, longer in (("one more item", [*item, item[0]]),
                                  ("over MAX_BATCH items", [item[0]] * (MAX_BATCH + 1))):
                mutated = copy.deepcopy(header)
                parent, last = _at(mutated, path)
                parent[last] = longer
                yield f"{where}: {label}", mutated
    for bad in ({"deep": [[{"x": [None, {"y": [1.5]}]}]]}, BadUtf8(), b"\x00" * 64):
        mutated = copy.deepcopy(header)
        mutated["zz_extra"] = bad
        yield f"an extra field {bad!r:.30}", mutated


@dataclass(frozen=True)
class Case:
    what: str
    port: str                 # "master" or "node"
    role: str | None          # the hello sent first; None: this frame is the first
    frame: bytes
    payload: bytes = b""
    #: Shut our side down after sending: the daemon sees the frame end where it stops.
    hangup: bool = False

    def __str__(self) -> str:
        return f"[{self.role or 'unauthenticated'} -> {self.port}] {self.what}"


#: The protocol version the templates are written in (kvstored.protocol.PROTOCOL_VERSION).
VERSION = 5


def hello(role: str, token: str | None) -> dict[str, Any]:
    return {"op": "hello", "version": VERSION, "role": role, "token": token}


def cases(tokens: dict[str, str | None], node_name: str, seed: int,
          random_cases: int = 200) -> Iterator[Case]:
    """Every case, in a fixed order, then ``random_cases`` random ones from ``seed``."""
    shapes = templates(tokens, node_name)
    # Unauthenticated: every way of breaking the hello, then every op as the first frame.
    for port in ("master", "node"):
        for token_role in ("client", "node"):
            valid = hello(token_role, tokens[token_role])
            for what, mutated in mutations(valid):
                yield Case(f"hello ({token_role} token) {what}", port, None, pack(mutated))
        for what, token, role in (("non-ASCII token", "ébahi", "client"),
                                  ("client token claiming node", tokens["client"], "node"),
                                  ("no token", None, "client"),
                                  ("long token", "t" * 3000, "client")):
            yield Case(f"hello with {what}", port, None, pack(hello(role, token)))
        for name, shape in shapes.items():
            if name.startswith(port + "/"):
                yield Case(f"{name} before hello", port, None, pack(shape))
    # Authenticated: every field of every op, as a client; node ops also as a node.
    for name, shape in shapes.items():
        port, op = name.split("/")
        payload = b"abc" if op == "put" else b""
        as_roles = ["client"] + (["node"] if op in NODE_ONLY else [])
        for role in as_roles:
            for what, mutated in [("valid", shape), *mutations(shape)]:
                if role == "client" and op in NODE_ONLY and what != "valid" \
                        and not what.startswith("node="):
                    continue  # refused by role before its fields are looked at
                yield Case(f"{name} {what}", port, role, pack(mutated, len(payload)),
                           payload)
    rng = random.Random(seed)
    names = sorted(shapes)
    for n in range(random_cases):
        name = rng.choice(names)
        port, op = name.split("/")
        mutated = copy.deepcopy(shapes[name])
        hits = []
        for _ in range(rng.randint(2, 4)):
            paths = list(_paths(mutated))
            if not paths:
                break
            path = rng.choice(paths)
            parent, last = _at(mutated, path)
            parent[last] = copy.deepcopy(rng.choice(BAD_VALUES))
            hits.append(".".join(map(str, path)))
        role = "node" if op in NODE_ONLY else "client"
        yield Case(f"random #{n} (seed {seed}) {name}: {', '.join(hits)}", port, role,
                   pack(mutated))


def frame_edge_cases(tokens: dict[str, str | None]) -> Iterator[Case]:
    """Broken prefixes and headers: empty, truncated, oversized, undecodable."""
    ok = pack({"op": "status"})
    prefix = ok[:PREFIX.size]
    for port in ("master", "node"):
        for role in (None, "client"):
            raw = [
                ("zero-length header", PREFIX.pack(MAGIC, 0, 0)),
                ("header of the largest allowed length, not sent",
                 PREFIX.pack(MAGIC, 8 * 1024 * 1024, 0)),
                ("header one byte over the largest length",
                 PREFIX.pack(MAGIC, 8 * 1024 * 1024 + 1, 0)),
                ("header length 2**32-1", PREFIX.pack(MAGIC, 2**32 - 1, 0)),
                ("payload length 2**64-1", PREFIX.pack(MAGIC, len(ok) - PREFIX.size,
                                                       2**64 - 1) + ok[PREFIX.size:]),
                ("a hello declaring a payload",
                 pack(hello("client", tokens["client"]), 10) + b"0123456789"),
                ("wrong magic", b"HTTP" + prefix[4:]),
                ("an array claiming 4G items",
                 PREFIX.pack(MAGIC, 5, 0) + b"\xdd\xff\xff\xff\xff"),
                ("a str claiming 4 GiB", PREFIX.pack(MAGIC, 15, 0) + b"\xdb\xff\xff\xff\xff"
                 + b"a" * 10),
                ("a reserved msgpack byte", PREFIX.pack(MAGIC, 1, 0) + b"\xc1"),
                ("an ext type", PREFIX.pack(MAGIC, 3, 0) + b"\xd4\x01\x00"),
                ("a map with an integer key", pack({1: "x"})),
                ("a list, not a map", pack([1, 2, 3])),
                ("nesting 10000 deep", PREFIX.pack(MAGIC, 10001, 0) + b"\x91" * 10000
                 + b"\xc0"),
                ("a header truncated by the peer", ok[:PREFIX.size + 3]),
                *((f"a prefix truncated after {n} bytes", prefix[:n]) for n in range(16)),
            ]
            for what, frame in raw:
                yield Case(what, port, role, frame, hangup=True)


class Peer:
    """Connections to one daemon's ports, speaking as whichever role a case needs."""

    def __init__(self, ports: dict[str, tuple[str, int]], tokens: dict[str, str | None],
                 timeout: float = 20.0) -> None:
        self.ports = ports
        self.tokens = tokens
        self.timeout = timeout
        self._open: dict[tuple[str, str], tuple[socket.socket, FrameReader]] = {}

    def _connect(self, port: str, role: str | None) -> tuple[socket.socket, FrameReader]:
        sock = socket.create_connection(self.ports[port], timeout=self.timeout)
        reader = FrameReader(sock)
        if role is not None:
            sock.sendall(pack(hello(role, self.tokens[role])))
            reply = reader.recv_header()
            if not reply.get("ok"):
                sock.close()
                raise AssertionError(f"the {role} hello to the {port} was refused: {reply}")
        return sock, reader

    def send(self, case: Case) -> str:
        """Send ``case``; return what happened: ``"ok"``, ``"error <code>"`` or
        ``"closed"``. Raises AssertionError if the daemon neither answers nor closes."""
        # Each case on a connection of its own: one case must not build on another (a
        # registration is tied to its connection), and a close is the case's own doing.
        key = (case.port, case.role or "")
        self._drop(key)
        self._open[key] = self._connect(case.port, case.role)
        sock, reader = self._open[key]
        try:
            sock.sendall(case.frame + case.payload)
            if case.hangup:
                sock.shutdown(socket.SHUT_WR)
            reply = reader.recv_header()
            reader.discard_payload()
        except (ConnectionClosed, ConnectionError, FrameError):
            self._drop(key)
            return "closed"
        except TimeoutError:
            self._drop(key)
            raise AssertionError(f"no answer and no close within {self.timeout}s: "
                                 f"{case}") from None
        self._drop(key)
        if reply.get("ok") is True:
            return "ok"
        error = reply.get("error") if isinstance(reply.get("error"), dict) else {}
        return f"error {error.get('code')}: {error.get('message')}"

    def _drop(self, key: tuple[str, str]) -> None:
        entry = self._open.pop(key, None)
        if entry is not None:
            entry[0].close()

    def close(self) -> None:
        while self._open:
            self._open.popitem()[1][0].close()


def seed_from_env() -> int:
    return int(os.environ.get("KVSTORED_FUZZ_SEED", DEFAULT_SEED))
