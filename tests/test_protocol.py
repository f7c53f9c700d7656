"""The protocol's declarations: every op's role and fields, the key rule, the hello."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from typing import Any

import pytest

from kvstored.errors import BadRequestError
from kvstored.protocol import HELLO, MASTER_OPS, NODE_OPS, Hello, OpSpec, Role, ops
from kvstored.protocol.node_api import GetReply, GetRequest
from kvstored.protocol.shapes import (
    Bool,
    EnumOf,
    Fields,
    Int,
    KeyStr,
    List,
    Map,
    Name,
    Number,
    Opt,
    Shape,
    Str,
    Tagged,
)
from kvstored.wire import FrameError


def _refused(spec, header: dict) -> str:
    with pytest.raises(BadRequestError) as caught:
        spec.check(header)
    return caught.value.message


def test_node_operations_are_the_ones_that_change_what_the_cluster_believes():
    node_only = {name for name, spec in MASTER_OPS.items() if spec.role is Role.NODE}
    assert node_only == {"register", "register_objects", "register_done", "commit",
                         "heartbeat", "ssd_evicted", "leaving", "unregister"}
    # A node's data server takes only the master's revoke from a node (the master).
    assert {name for name, spec in NODE_OPS.items() if spec.role is Role.NODE} == {"revoke"}
    assert Role.NODE.may_call(Role.CLIENT) and not Role.CLIENT.may_call(Role.NODE)


def test_a_request_names_the_field_that_is_wrong():
    put = NODE_OPS["put"]
    put.check({"keys": ["a"], "sizes": [1], "checksums": [7], "extra": {"x": [None]}})
    assert "sizes[0] must be an integer from 0" in _refused(
        put, {"keys": ["a"], "sizes": [-1], "checksums": [7]})
    assert "keys has 2, sizes has 1, checksums has 1" in _refused(
        put, {"keys": ["a", "b"], "sizes": [1], "checksums": [7]})
    assert "checksums is missing" in _refused(put, {"keys": ["a"], "sizes": [1]})
    assert "checksums[0] must be an integer from 0 to 4294967295, not 4294967296" in \
        _refused(put, {"keys": ["a"], "sizes": [1], "checksums": [2**32]})
    heartbeat = MASTER_OPS["heartbeat"]
    assert "done.dropped.tiers[0] must be 'dram' or 'ssd'" in _refused(
        heartbeat, {"node": "n", "done": {"dropped": {"keys": ["k"], "tiers": ["tape"],
                                                      "versions": [1]}}})
    assert "done.dropped one entry per key expected, but keys has 1, tiers has 2" in \
        _refused(heartbeat, {"node": "n", "done": {"dropped": {
            "keys": ["k"], "tiers": ["ssd", "ssd"], "versions": [1]}}})
    assert "stats must be a map" in _refused(heartbeat, {"node": "n", "stats": [1]})
    flush = MASTER_OPS["flush"]
    for timeout in (-1, float("nan"), float("inf"), 10**9, True):
        assert "timeout" in _refused(flush, {"timeout": timeout})


def test_keys_follow_the_backend_rule():
    lookup = MASTER_OPS["lookup"]
    lookup.check({"keys": ["k", "é" * 256, "x" * 1024, "\x00/../"]})
    for bad in ("", "x" * 1025, "é" * 513, b"bytes", 7):
        assert "keys[0]" in _refused(lookup, {"keys": [bad]}), bad
    assert "has 65537 items" in _refused(lookup, {"keys": ["k"] * 65537})


def test_the_hello_is_typed():
    hello = Hello.parse({"op": "hello", "version": 1, "role": "node", "token": "t", "x": 1})
    assert hello == Hello(Role.NODE, "t", 1)
    assert Hello.parse({"op": "hello", "version": 1}).role is Role.CLIENT
    assert Hello.parse(HELLO.request_header(hello)) == hello
    for bad in ({"op": "lookup"}, {"op": "hello"}, {"op": "hello", "version": "1"},
                {"op": "hello", "version": 1, "role": "admin"},
                {"op": "hello", "version": 1, "token": b"bin"}):
        with pytest.raises(BadRequestError):
            Hello.parse(bad)


def test_a_get_trailer_may_only_turn_announced_items_into_misses():
    reply = ops.GET.decode_reply(OpSpec.reply_header(
        GetReply([5, -1, 3, 0], from_ssd=[0, 2], trailer=True)))
    assert ops.GET.trailer_follows(reply)
    final = ops.GET.with_trailer(reply, ops.GET.trailer_header([5, -1, -2, 0]))
    assert final.sizes == [5, -1, -2, 0] and final.from_ssd == [0, 2]
    for bad in ([5, -1, 3], [5, 4, 3, 0], [6, -1, 3, 0], [5, -1, 3, 0, 1]):
        with pytest.raises(FrameError):
            ops.GET.with_trailer(reply, ops.GET.trailer_header(bad))
    with pytest.raises(FrameError):
        ops.GET.with_trailer(reply, {"ok": True, "sizes": "no"})
    with pytest.raises(FrameError):
        ops.GET.with_trailer(reply, {"ok": False, "error": {}})
    # get_held streams SSD copies the same way (protocol 5); an op without a trailer
    # whose reply says otherwise is not this protocol.
    assert ops.GET_HELD.trailer_follows(ops.GET_HELD.decode_reply(OpSpec.reply_header(
        GetReply([1], trailer=True))))
    untrailed = OpSpec(ops.GET.op, Role.CLIENT, GetRequest, GetReply, reply_payload=True)
    with pytest.raises(FrameError):
        untrailed.decode_reply(OpSpec.reply_header(GetReply([1], trailer=True)))
    assert not ops.GET.trailer_follows(ops.GET.decode_reply(OpSpec.reply_header(
        GetReply([1]))))


# -- the generated check, decode and encode (kvstored.protocol.compiled) ---------------------

def _message_shapes() -> list[Fields]:
    """Every message shape the protocol uses: requests, replies, and what they nest."""
    found: dict[str, Fields] = {}

    def visit(shape: Shape) -> None:
        if isinstance(shape, Fields):
            if shape.name in found:
                return
            found[shape.name] = shape
            for inner in shape.fields.values():
                visit(inner)
        elif isinstance(shape, Tagged):
            for variant in shape.variants.values():
                visit(variant)
        elif isinstance(shape, Opt | List | Map):
            visit(shape.inner)

    for spec in [HELLO, *MASTER_OPS.values(), *NODE_OPS.values()]:
        visit(spec.request.shape())
        visit(spec.reply.shape())
    return list(found.values())


def _sample(shape: Shape, rng: random.Random, depth: int = 0) -> Any:
    """A value that fits ``shape`` (lists short, so item-by-item checks run too)."""
    if isinstance(shape, Opt):
        return None if rng.random() < 0.3 else _sample(shape.inner, rng, depth)
    if isinstance(shape, Fields):
        out = {}
        for name, inner in shape.fields.items():
            if name not in shape.optional or rng.random() < 0.7:
                out[name] = _sample(inner, rng, depth + 1)
        count = rng.randint(0, 3)
        for name in shape.same_length:
            if name in out and isinstance(out[name], list):
                out[name] = [_sample(_list_of(shape.fields[name]), rng, depth + 1)
                             for _ in range(count)]
        return out
    if isinstance(shape, Tagged):
        tag, variant = rng.choice(sorted(shape.variants.items()))
        return {**_sample(variant, rng, depth), shape.tag: tag}
    if isinstance(shape, List):
        return [_sample(shape.inner, rng, depth + 1) for _ in range(rng.randint(0, 3))]
    if isinstance(shape, Map):
        return {f"m{i}": _sample(shape.inner, rng, depth + 1) for i in range(rng.randint(0, 2))}
    if isinstance(shape, EnumOf):
        return rng.choice(sorted(shape.members))
    if isinstance(shape, Int):
        lo = -5 if math.isinf(shape.lo) else int(shape.lo)
        hi = lo + 10**6 if math.isinf(shape.hi) else int(shape.hi)
        return rng.choice([lo, hi, rng.randint(lo, hi)])
    if isinstance(shape, Number):
        return max(shape.lo, min(shape.hi, rng.choice([0, 1.5, 7])))
    if isinstance(shape, Bool):
        return rng.random() < 0.5
    if isinstance(shape, Name):
        return "n" * rng.randint(1, shape.max_len)
    if isinstance(shape, KeyStr):
        return rng.choice(["k", "é" * 256, "x" * 1024, "a/b"])
    if isinstance(shape, Str):
        return rng.choice(["", "s", "é"])
    return rng.choice([None, 1, "x", [1], {"a": 1}])  # AnyValue


def _list_of(shape: Shape) -> Shape:
    while isinstance(shape, Opt):
        shape = shape.inner
    assert isinstance(shape, List)
    return shape.inner


_ODD = [None, True, 0, -1, 2**32, 2**63, 1.5, float("nan"), "", "x" * 5000, "é" * 300,
        b"bin", [], [None], [1, "a"], ["k"] * 17, [-1] * 17, {}, {"a": None}, {1: 2}]


def _mutations(value: Any, rng: random.Random) -> Iterator[Any]:
    """Values near ``value``: a field dropped, replaced by something odd, a list grown."""
    yield value
    if not isinstance(value, dict):
        return
    for name in list(value):
        yield {k: v for k, v in value.items() if k != name}
        yield {**value, name: rng.choice(_ODD)}
        if isinstance(value[name], list):
            yield {**value, name: [*value[name], rng.choice(_ODD)]}
            yield {**value, name: value[name] * 20}
        if isinstance(value[name], dict):
            for inner in _mutations(value[name], rng):
                yield {**value, name: inner}


def test_the_generated_code_agrees_with_the_generic_walk():
    """For every message shape, on values that fit and many that do not: the generated
    check says what the generic walk says, and decodes and encodes to the same."""
    rng = random.Random(16)
    shapes = _message_shapes()
    assert {"HeldGetRequest", "GetReply", "HeartbeatRequest", "LookupReply"} <= {
        s.name for s in shapes}
    tried = 0
    for shape in shapes:
        compiled = shape.compiled()
        assert compiled is not None
        for _ in range(40):
            for value in _mutations(_sample(shape, rng), rng):
                tried += 1
                ok = shape.walk_ok(value)
                assert compiled.check(value) is ok, (shape.name, value)
                parsed = compiled.parse(value)
                if not ok:
                    assert parsed is None, (shape.name, value)
                    continue
                assert parsed == shape.walk_decode(value), (shape.name, value)
                assert compiled.decode(value) == parsed
                assert compiled.encode_into(parsed, {}) == shape.walk_encode(parsed)
    assert tried > 10000


def test_a_refused_request_still_names_its_field():
    held = NODE_OPS["get_held"]
    assert held.check({"keys": ["k"], "checksums": [1]}).keys == ["k"]
    assert "checksums[0] must be an integer from 0 to 4294967295" in _refused(
        held, {"keys": ["k"], "checksums": [-1]})
    assert "one entry per key expected, but keys has 1, checksums has 2" in _refused(
        held, {"keys": ["k"], "checksums": [1, 2]})
    assert "keys[16] must be a key" in _refused(held, {"keys": ["k"] * 16 + [""]})
    assert "keys[0] must be a key" in _refused(held, {"keys": ["x" * 1025]})
