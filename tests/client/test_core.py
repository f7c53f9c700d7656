"""The client core without any I/O: each step is driven by a script of the replies a
master and its nodes give, so what a reply means (a result, a retry, which error with
which key) is checked once for every shell."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from kvstored.client.core import Call, ClientCore, Effect, Greet, Pause, drive
from kvstored.errors import CorruptDataError, NoSpaceError, UnreachableError
from kvstored.protocol import PutStatus, ops
from kvstored.protocol.master_api import Empty, Endpoint, NodeContact, PutTargetReply
from kvstored.protocol.node_api import PutReply
from kvstored.security import ClientToken

NODES = {"n1": NodeContact(Endpoint("127.0.0.1", 1), "elsewhere", "s", "00")}


class Script:
    """Answers each effect with the next scripted answer for its op, and records what
    was asked."""

    def __init__(self, answers: dict[str, list[Callable[[Call], Any]]]) -> None:
        self.answers = answers
        self.asked: list[tuple[str, Any]] = []
        self.paused = 0.0

    def __call__(self, effect: Effect) -> Any:
        if isinstance(effect, Pause):
            self.paused += effect.seconds
            return None
        if isinstance(effect, Greet):
            raise AssertionError("no hello expected")
        self.asked.append((effect.spec.name, effect.request))
        answer = self.answers[effect.spec.name].pop(0)
        return answer(effect)


def _core(clock: Callable[[], float] = lambda: 0.0) -> ClientCore:
    return ClientCore("127.0.0.1:1", transport="tcp", token=ClientToken(None, "none"),
                      clock=clock)


def _placed(effect: Call) -> PutTargetReply:
    return PutTargetReply(["n1"] * len(effect.request.keys), NODES)


def _node_says(*statuses: PutStatus, no_space: str | None = None):
    return lambda effect: PutReply(list(statuses), no_space)


def test_a_put_the_node_received_corrupt_is_released_and_raised_with_its_key():
    script = Script({"put_target": [_placed], "put": [_node_says(PutStatus.OK,
                                                                  PutStatus.CORRUPT)],
                     "put_abort": [lambda effect: Empty()]})
    with pytest.raises(CorruptDataError, match="received bytes that fail") as caught:
        drive(_core().batch_put(["good", "bad"], [b"1", b"2"]), script)
    assert caught.value.key == "bad"
    assert script.asked[-1] == ("put_abort", ops.KeysRequest(["bad"]))


def test_a_seal_that_finds_no_room_left_raises_unreachable_naming_the_key():
    script = Script({"put_target": [_placed], "put": [_node_says(PutStatus.MISSING)],
                     "put_abort": [lambda effect: Empty()]})
    with pytest.raises(UnreachableError, match=r"master\.put_timeout") as caught:
        drive(_core().batch_put(["late"], [b"1"]), script)
    assert caught.value.key == "late"


def test_no_room_is_retried_until_the_deadline_then_names_the_first_key_left():
    now = [0.0]

    def clock() -> float:
        now[0] += 1.0
        return now[0]

    rounds = 10
    script = Script({"put_target": [_placed] * rounds,
                     "put": [_node_says(PutStatus.OK, PutStatus.NO_SPACE,
                                        no_space="node n1's DRAM tier is full")]
                     + [_node_says(PutStatus.NO_SPACE, no_space="full")] * rounds,
                     "put_abort": [lambda effect: Empty()] * rounds})
    with pytest.raises(NoSpaceError, match=r"no DRAM room for 1 object\(s\) after 5s: full"
                       ) as caught:
        drive(_core(clock).batch_put(["stored", "waits"], [b"1", b"2"]), script)
    assert caught.value.key == "waits"
    assert script.paused > 0
    # Only the key that found no room was sent again; each round released its hold.
    retried = [r.keys for op, r in script.asked if op == "put"][1:]
    assert retried and all(keys == ["waits"] for keys in retried)
    assert all(r.keys == ["waits"] for op, r in script.asked if op == "put_abort")


def test_a_node_that_fails_the_put_releases_every_key_sent_there():
    def unreachable(effect: Call) -> Any:
        raise UnreachableError("the connection to 127.0.0.1:1 failed during put: no answer "
                               "within 5s")

    script = Script({"put_target": [_placed], "put": [unreachable],
                     "put_abort": [lambda effect: Empty()]})
    with pytest.raises(UnreachableError, match="no answer within 5s"):
        drive(_core().batch_put(["a", "b"], [b"1", b"2"]), script)
    assert script.asked[-1] == ("put_abort", ops.KeysRequest(["a", "b"]))
