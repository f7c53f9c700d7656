"""The background-task supervisor: failures are logged once per state change, counted,
reported and survived; loops back off; one-shot tasks retry."""

from __future__ import annotations

import itertools
import logging

import pytest
import trio
import trio.testing
from prometheus_client import CollectorRegistry

from kvstored.metrics import background_errors
from kvstored.supervisor import Backoff, Supervisor, describe_keys


@pytest.fixture
def supervisor() -> Supervisor:
    return Supervisor("node n1", background_errors(CollectorRegistry()))


def _count(supervisor: Supervisor, task: str) -> float:
    return supervisor.errors.labels(task=task)._value.get()


def test_guard_counts_reports_and_swallows(supervisor):
    seen = []
    with supervisor.guard("drop", subject="1 key: 'k'", on_error=seen.append):
        raise OSError(5, "Input/output error")
    assert _count(supervisor, "drop") == 1
    assert isinstance(seen[0], OSError)
    assert supervisor.failures("drop") == 1
    with supervisor.guard("drop"):
        pass
    assert supervisor.failures("drop") == 0


def test_guard_never_catches_cancellation_or_keyboard_interrupt(supervisor):
    with pytest.raises(KeyboardInterrupt), supervisor.guard("reaper"):
        raise KeyboardInterrupt

    async def main() -> None:
        with trio.move_on_after(0.01) as scope:
            with supervisor.guard("reaper"):
                await trio.sleep_forever()
        assert scope.cancelled_caught

    trio.run(main)
    assert _count(supervisor, "reaper") == 0


def test_one_warning_per_state_change(supervisor, caplog):
    caplog.set_level(logging.DEBUG, logger="kvstored.supervisor")
    for _ in range(50):
        with supervisor.guard("offload"):
            raise OSError(28, "No space left on device")
    with supervisor.guard("offload"):
        raise ValueError("something else")
    with supervisor.guard("offload"):
        pass
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2, warnings
    assert "node n1: offload failed: OSError" in warnings[0]
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert infos == ["node n1: offload works again after 51 failure(s)"]
    assert _count(supervisor, "offload") == 51


def test_a_failing_handler_does_not_escape(supervisor):
    def broken(exc: Exception) -> None:
        raise RuntimeError("handler bug")

    with supervisor.guard("recover", on_error=broken):
        raise OSError("disk")
    assert _count(supervisor, "recover") == 1


def test_forever_backs_off_and_keeps_going(supervisor):
    calls: list[float] = []

    async def step() -> None:
        calls.append(trio.current_time())
        if len(calls) <= 4:
            raise OSError("flaky")
        await trio.sleep(1)

    async def main() -> None:
        with trio.move_on_after(20):
            await supervisor.forever("housekeeping", step, backoff=Backoff(1.0, 4.0))

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    gaps = [round(b - a, 3) for a, b in itertools.pairwise(calls)]
    assert gaps[:5] == [1.0, 2.0, 4.0, 4.0, 1.0]  # doubling to the cap; a success resets
    assert _count(supervisor, "housekeeping") == 4


def test_spawn_retries_then_reports_the_last_failure(supervisor):
    attempts, reported = [], []

    async def drop() -> None:
        attempts.append(1)
        raise OSError("still failing")

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            supervisor.spawn(nursery, "drop", drop, attempts=3, on_error=reported.append,
                             backoff=Backoff(0.1, 1.0))

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert len(attempts) == 3 and len(reported) == 1
    assert _count(supervisor, "drop") == 3


def test_backoff_and_key_descriptions():
    backoff = Backoff(0.5, 3.0)
    assert [backoff.failed() for _ in range(4)] == [0.5, 1.0, 2.0, 3.0]
    backoff.reset()
    assert backoff.next_delay == 0.5
    assert describe_keys(["a"]) == "1 key: 'a'"
    assert describe_keys(list("abcd")) == "4 keys: 'a', 'b', 'c', …"
