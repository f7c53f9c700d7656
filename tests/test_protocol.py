"""The protocol's declarations: every op's role and fields, the key rule, the hello."""

from __future__ import annotations

import pytest

from kvstored.errors import BadRequestError
from kvstored.protocol import HELLO, MASTER_OPS, NODE_OPS, Hello, OpSpec, Role, ops
from kvstored.protocol.node_api import GetReply
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
    # get_held never streams: a reply saying otherwise is not this protocol.
    with pytest.raises(FrameError):
        ops.GET_HELD.decode_reply(OpSpec.reply_header(GetReply([1], trailer=True)))
    assert not ops.GET.trailer_follows(ops.GET.decode_reply(OpSpec.reply_header(
        GetReply([1]))))
