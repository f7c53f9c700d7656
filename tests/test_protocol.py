"""The protocol's declarations: every op's role and fields, the key rule, the hello."""

from __future__ import annotations

import pytest

from kvstored.errors import BadRequestError
from kvstored.protocol import HELLO, MASTER_OPS, NODE_OPS, Hello, Role


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
