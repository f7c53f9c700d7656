"""Coalescing: requests that arrive while a call runs share the next call, each gets its
own results, and a failed call fails exactly the requests it carried."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from kvstored.errors import InternalError, UnreachableError
from kvstored.node.coalesce import Coalescer


def _run(fn):
    return trio.run(fn, clock=trio.testing.MockClock(autojump_threshold=0))


def test_requests_waiting_behind_a_call_share_the_next_one():
    calls: list[list[int]] = []

    async def call(items: list[int]) -> list[int]:
        calls.append(items)
        await trio.sleep(1)
        return [i * 10 for i in items]

    async def main() -> None:
        coalescer = Coalescer(call)
        got: dict[int, list[int]] = {}
        answered = [trio.Event() for _ in range(3)]

        async def request(n: int, items: list[int]) -> None:
            got[n] = await coalescer.submit(items)
            answered[n].set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(coalescer.run)
            nursery.start_soon(request, 0, [1])
            await trio.testing.wait_all_tasks_blocked()  # the first call is in flight:
            assert calls == [[1]]                        # these two wait together
            nursery.start_soon(request, 1, [2, 3])
            nursery.start_soon(request, 2, [4])
            for event in answered:
                await event.wait()
            assert await coalescer.submit([]) == []
            nursery.cancel_scope.cancel()
        assert calls[0] == [1] and sorted(calls[1]) == [2, 3, 4] and len(calls) == 2
        assert got == {0: [10], 1: [20, 30], 2: [40]}

    _run(main)


def test_a_failed_call_fails_its_requests_and_the_next_call_still_runs():
    async def call(items: list[str]) -> list[str]:
        if "bad" in items:
            raise UnreachableError("the master is gone")
        return items

    async def main() -> None:
        coalescer = Coalescer(call)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(coalescer.run)
            with pytest.raises(UnreachableError):
                await coalescer.submit(["bad"])
            assert await coalescer.submit(["good"]) == ["good"]
            nursery.cancel_scope.cancel()

    _run(main)


def test_a_bug_in_a_call_reaches_its_requests_and_the_supervisor():
    async def call(items: list[int]) -> list[int]:
        raise ZeroDivisionError("bug")

    async def main() -> None:
        coalescer = Coalescer(call, in_flight=2)
        errors: list[BaseException] = []

        async def request() -> None:
            with pytest.raises(InternalError, match="ZeroDivisionError"):
                await coalescer.submit([1])

        async def runner() -> None:
            try:
                await coalescer.run()
            except BaseException as exc:  # a group of the callers' errors
                errors.append(exc)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(runner)
            await request()
        assert errors and errors[0].subgroup(ZeroDivisionError) is not None

    _run(main)
