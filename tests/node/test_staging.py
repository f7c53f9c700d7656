"""The node's staging pool: a byte budget over every connection, and bounded reuse."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from kvstored.errors import BadRequestError
from kvstored.node.staging import MIN_BUFFER, StagingPool

MiB = 1 << 20


def test_a_request_larger_than_the_budget_is_refused_at_once():
    pool = StagingPool(8 * MiB)

    async def main():
        with pytest.raises(BadRequestError, match=r"security\.max_read_staging"):
            async with pool.lend(8 * MiB + 1):
                pass

    trio.run(main)


def test_requests_wait_for_room_and_get_it_back_when_cancelled():
    pool = StagingPool(8 * MiB)
    order = []

    async def hold(name, size, release: trio.Event):
        async with pool.lend(size) as view:
            assert len(view) == size
            order.append((name, pool.lent))
            await release.wait()

    async def main():
        first, second = trio.Event(), trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(hold, "a", 6 * MiB, first)
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(hold, "b", 4 * MiB, second)
            await trio.testing.wait_all_tasks_blocked()
            assert order == [("a", 6 * MiB)]  # b waits: 6 + 4 > 8
            first.set()
            await trio.testing.wait_all_tasks_blocked()
            assert order == [("a", 6 * MiB), ("b", 4 * MiB)]
            nursery.cancel_scope.cancel()  # b is cancelled while holding its buffer
        assert pool.lent == 0

    trio.run(main)


def test_buffers_are_reused_and_what_is_kept_is_bounded():
    pool = StagingPool(64 * MiB)

    async def main():
        async with pool.lend(100) as small:
            first = small.obj
        async with pool.lend(MIN_BUFFER) as again:
            assert again.obj is first  # reused, not allocated again
        async with pool.lend(40 * MiB):
            pass
        assert pool.kept <= pool.keep == 16 * MiB  # the 40 MiB buffer was not kept

    trio.run(main)
