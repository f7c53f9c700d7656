"""The node's staging pool: a byte budget over every connection, and bounded reuse."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from kvstored.errors import BadRequestError
from kvstored.node.staging import StagingPool

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


def test_requests_share_one_kept_arena_and_what_does_not_fit_gets_its_own_buffer():
    pool = StagingPool(64 * MiB)

    async def main():
        assert pool.kept == 0  # allocated on first use (or by prepare() at start)
        async with pool.lend(100) as small:
            small[:5] = b"hello"
            arena = small.obj
        assert pool.kept == pool.keep == 16 * MiB
        async with pool.lend(MiB) as again, pool.lend(3 * MiB) as other:
            assert again.obj is arena and other.obj is arena  # the same arena, reused
            assert bytes(again[:5]) == b"hello"  # the same pages: no fresh ones
            again[:] = b"a" * MiB
            other[:] = b"b" * (3 * MiB)
            assert bytes(again) == b"a" * MiB  # disjoint extents
        async with pool.lend(10 * MiB) as one, pool.lend(10 * MiB) as two:
            assert one.obj is arena and two.obj is not arena  # the arena is full
            assert len(two) == 10 * MiB
        async with pool.lend(40 * MiB) as big:
            assert big.obj is not arena and len(big) == 40 * MiB
        assert pool.kept == 16 * MiB and pool.lent == 0

    trio.run(main)
