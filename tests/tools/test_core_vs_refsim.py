"""The compiled core against the plain-Python replay (refsim), on many small traces.

refsim restates docs/simulator.md directly (victims found by scanning the leaves); the
core uses linked lists and indexed heaps. Same inputs must give the same integers for
every policy, capacity and warm-up - including the corner cases: capacity 1, a request
that evicts its own new blocks, bypass in optimal, orphans in fifo.
"""

from __future__ import annotations

import numpy as np
import pytest

from kvstored.tools import core, events
from kvstored.tools.core import Replay
from kvstored.tools.runs import PolicySpec

from .conftest import random_requests


def _trace(requests: list[list[int]], block_size: int = 4, seed: int = 0) -> events.EventTrace:
    rng = np.random.default_rng(seed)
    counts = np.array([len(r) for r in requests], dtype=np.int64)
    lengths = np.maximum(1, counts * block_size - rng.integers(0, 2 * block_size, len(counts)))
    return events.build(np.array([i for r in requests for i in r], dtype=np.int64), counts,
                        lengths, np.arange(len(requests), dtype=np.float64),
                        np.zeros(len(requests), dtype=np.int64), block_size, "mooncake",
                        sources=["generated"])


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("warmup", [0.3, 0.5])
def test_core_equals_refsim(seed, warmup):
    trace = _trace(random_requests(seed), seed=seed)
    fast = Replay(trace, warmup, engine="c")
    slow = Replay(trace, warmup, engine="python")
    assert np.array_equal(fast.node_of_event, slow.node_of_event)
    assert np.array_equal(fast.parent, slow.parent)
    assert np.array_equal(fast.next_use, slow.next_use)
    assert fast.ceiling() == slow.ceiling()
    for capacity in (1, 2, 3, 5, 8, 13, 21, 34, 55):
        for policy in ("fifo", "lru", "optimal"):
            spec = PolicySpec(policy, capacity)
            a, b = fast.run(spec), slow.run(spec)
            assert (a.hit_tokens, a.total_tokens, a.underfilled) == \
                (b.hit_tokens, b.total_tokens, b.underfilled), (policy, capacity)


def test_own_new_blocks_evicted_when_nothing_else_can_go():
    # Capacity 1: the request inserts a, then must evict a to insert b, whose parent is
    # then gone, so insertion stops and the cache ends up empty (as the reference does).
    trace = _trace([[1, 2], [3], [1, 2], [1, 2], [1, 2]], block_size=1)
    for engine in ("c", "python"):
        replay = Replay(trace, 0.2, engine=engine)
        result = replay.run(PolicySpec("lru", 1))
        assert result.hit_tokens == 0 and not result.underfilled


def test_engine_detection_and_fallback():
    assert core.core_available()
    trace = _trace(random_requests(3))
    replay = Replay(trace, 0.5, engine="python")
    assert replay.engine == "python"
    with pytest.raises(core.UnavailableError, match="compiled simulator core"):
        replay.run(PolicySpec("tiered", 4, 8))
    assert Replay(trace, 0.5).engine == "c"
