"""Reads in one trip (``get_held``) in the client core, driven by scripted replies: what a
client remembers, when it asks a node directly, and that whatever the node answers, the
caller gets the right bytes or a read through the master, never bad or removed ones."""

from __future__ import annotations

from typing import Any

import pytest
from crc32c import crc32c

from kvstored.client.core import Call, Effect, Greet, drive
from kvstored.client.metrics import CallKind
from kvstored.errors import BadRequestError, UnreachableError
from kvstored.protocol import HelloReply, PutStatus, Role, Tier
from kvstored.protocol.master_api import (
    LockReply,
    LookupReply,
    PutTargetReply,
    RemoveReply,
    Replicas,
)
from kvstored.protocol.node_api import GetReply, PutReply
from tests.client import test_core
from tests.client.test_core import NODES, _core

OLD, NEW = b"old value " * 100, b"new value!" * 100


class Script(test_core.Script):
    """test_core's script, with each node saying hello (the usual get asks it first)."""

    def __call__(self, effect: Effect) -> Any:
        if isinstance(effect, Greet):
            return HelloReply(service="node", role=Role.CLIENT)
        return super().__call__(effect)


def _put(core, script: Script, key: str, value: bytes) -> None:
    script.answers.setdefault("put_target", []).append(
        lambda effect: PutTargetReply(["n1"], NODES))
    script.answers.setdefault("put", []).append(lambda effect: PutReply([PutStatus.OK]))
    assert drive(core.batch_put([key], [value]), script) == [True]


def _serves(*values: bytes | None, held: list[int] | None = None):
    """A node answer (get or get_held): each value copied into its buffer (None: the
    node does not have it)."""
    def answer(effect: Call) -> GetReply:
        assert effect.into is not None
        for view, value in zip(effect.into, values):
            if value is not None:
                view[:len(value)] = value
        return GetReply([-1 if v is None else len(v) for v in values],
                        held=held or [])
    return answer


def _lookup(value: bytes):
    return lambda effect: LookupReply([len(value)], [crc32c(value)],
                                      Replicas([0], ["n1"], [Tier.DRAM], [0]), 5.0, NODES)


def _ops(script: Script) -> list[str]:
    return [name for name, _ in script.asked]


def test_a_key_put_here_is_read_from_its_node_in_one_trip_and_checked():
    core, script = _core(), Script({})
    _put(core, script, "k", OLD)
    script.answers["get_held"] = [_serves(OLD)]
    tiers: list[Any] = []
    assert drive(core.read_values(["k"]), script) == [OLD]
    assert _ops(script)[-1] == "get_held"  # no lookup
    _, request = script.asked[-1]
    assert request.keys == ["k"] and request.checksums == [crc32c(OLD)]
    assert drive(core.read(["k"], [bytearray(2000)], tiers), Script({
        "get_held": [_serves(OLD)]})) == [len(OLD)]
    assert tiers == [Tier.DRAM]


def test_a_node_that_no_longer_serves_the_key_costs_a_lookup_never_a_wrong_value():
    core, script = _core(), Script({})
    _put(core, script, "k", OLD)
    # Removed and put again elsewhere: the node answers missing for the old version, and
    # the read goes through the master, which knows the new value.
    script.answers.update(get_held=[_serves(None)], lookup=[_lookup(NEW)],
                          get=[_serves(NEW, held=[0])])
    assert drive(core.read_values(["k"]), script) == [NEW]
    assert _ops(script)[-3:] == ["get_held", "lookup", "get"]
    # The get said the node holds the new version for get_held: the next read is direct.
    script.answers["get_held"] = [_serves(NEW)]
    assert drive(core.read_values(["k"]), script) == [NEW]
    assert _ops(script)[-1] == "get_held"
    assert script.asked[-1][1].checksums == [crc32c(NEW)]


def test_bytes_that_fail_the_checksum_are_never_handed_over():
    core, script = _core(), Script({})
    _put(core, script, "k", OLD)
    script.answers.update(get_held=[_serves(NEW)],  # same length, other bytes
                          lookup=[_lookup(OLD)], get=[_serves(OLD)])
    assert drive(core.read_values(["k"]), script) == [OLD]
    assert _ops(script)[-3:] == ["get_held", "lookup", "get"]
    assert core.held.get("k") is None  # the get did not say held: forgotten


def test_an_unreachable_node_falls_back_to_the_lookup():
    def down(effect: Call) -> GetReply:
        raise UnreachableError("gone")

    core, script = _core(), Script({})
    _put(core, script, "k", OLD)
    script.answers.update(get_held=[down], lookup=[lambda effect: LookupReply(
        [None], [None], Replicas(), 5.0, {})])
    assert drive(core.read_values(["k"]), script) == [None]
    assert _ops(script)[-2:] == ["get_held", "lookup"]


def test_a_key_this_client_locked_is_read_through_the_master_which_ends_the_lock():
    core, script = _core(), Script({})
    _put(core, script, "k", OLD)
    script.answers["lock"] = [lambda effect: LockReply([True], 30.0)]
    assert drive(core.batch_lookup_and_lock(["k"], 30.0), script) == [True]
    script.answers.update(lookup=[_lookup(OLD)], get=[_serves(OLD, held=[0])])
    assert drive(core.read_values(["k"]), script) == [OLD]
    assert _ops(script)[-2:] == ["lookup", "get"]
    assert script.asked[-2][1].holder == core.holder
    # That read ended the lock: the next one is direct.
    script.answers["get_held"] = [_serves(OLD)]
    assert drive(core.read_values(["k"]), script) == [OLD]
    assert _ops(script)[-1] == "get_held"


def test_a_remove_here_forgets_the_key_and_a_new_put_is_remembered_with_its_version():
    core, script = _core(), Script({})
    _put(core, script, "k", OLD)
    script.answers["remove"] = [lambda effect: RemoveReply([True])]
    assert drive(core.batch_remove(["k"]), script) == [True]
    assert core.held.get("k") is None
    _put(core, script, "k", NEW)
    held = core.held.get("k")
    assert held is not None and held.checksum == crc32c(NEW)


def test_a_batch_mixes_direct_reads_and_looked_up_ones_in_key_order():
    core, script = _core(), Script({})
    _put(core, script, "a", OLD)
    script.answers.update(get_held=[_serves(OLD)], lookup=[_lookup(NEW)],
                          get=[_serves(NEW)])
    assert drive(core.read_values(["b", "a"]), script) == [NEW, OLD]
    assert script.asked[-2][1].keys == ["b"]  # the lookup is only for what was not held


def test_a_buffer_too_small_for_a_held_key_gets_the_usual_error():
    core, script = _core(), Script({})
    _put(core, script, "k", OLD)
    script.answers.update(lookup=[_lookup(OLD)])
    with pytest.raises(BadRequestError, match="pass a buffer of at least"):
        drive(core.read(["k"], [bytearray(10)]), script)
    assert "get_held" not in _ops(script)


# -- one key in one call: plan_held_read / finish_held_read (what get_into does first) ----

def test_a_single_held_key_is_planned_as_one_call_and_judged_like_a_batch():
    core, script = _core(), Script({})
    _put(core, script, "k", OLD)
    buffer = bytearray(len(OLD) + 7)
    read = core.plan_held_read("k", buffer)
    assert read is not None and read.node == "n1"
    assert read.request.keys == ["k"] and read.request.checksums == [crc32c(OLD)]
    view = read.into[0]
    assert isinstance(view, memoryview)
    view[:len(OLD)] = OLD  # what the node sends
    assert core.finish_held_read(read, GetReply([len(OLD)])) == len(OLD)
    assert bytes(buffer[:len(OLD)]) == OLD
    got = core.metrics.snapshot()[CallKind.GET]
    assert (got.calls, got.keys, got.hits, got.misses, got.bytes) == (1, 1, 1, 0, len(OLD))


def test_what_a_single_held_read_cannot_serve_is_left_to_the_usual_read():
    core, script = _core(), Script({})
    _put(core, script, "k", OLD)
    assert core.plan_held_read("other", bytearray(10)) is None  # not known here
    assert core.plan_held_read("k", bytearray(10)) is None  # too small: the usual error
    assert core.plan_held_read(7, bytearray(10)) is None  # type: ignore[arg-type]
    # Other bytes of the same length: never handed over, counted, forgotten.
    read = core.plan_held_read("k", bytearray(len(OLD)))
    assert read is not None
    view = read.into[0]
    assert isinstance(view, memoryview)
    view[:] = NEW
    assert core.finish_held_read(read, GetReply([len(NEW)])) is None
    assert core.stats.checksum_failures == 1 and core.held.get("k") is None
    # Missing there, or the node failing: forgotten too; a failing node is skipped a while.
    for answer in (GetReply([-1]), GetReply([]), UnreachableError("gone")):
        _put(core, script, "k", OLD)
        read = core.plan_held_read("k", bytearray(len(OLD)))
        assert read is not None
        assert core.finish_held_read(read, answer) is None
        assert core.held.get("k") is None
    assert core.stats.node_failures == 1 and core.health.is_down("n1")
    _put(core, script, "k", OLD)
    assert core.plan_held_read("k", bytearray(len(OLD))) is None  # n1 is down for now
    assert core.metrics.snapshot()[CallKind.GET].calls == 0  # nothing served: not counted


def test_a_single_key_this_client_locked_is_not_read_directly():
    core, script = _core(), Script({})
    _put(core, script, "k", OLD)
    script.answers["lock"] = [lambda effect: LockReply([True], 30.0)]
    assert drive(core.batch_lookup_and_lock(["k"], 30.0), script) == [True]
    assert core.plan_held_read("k", bytearray(len(OLD))) is None
