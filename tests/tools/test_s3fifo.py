"""S3-FIFO adapted to the prefix rule: scan resistance, bounds, and the trie invariant."""

from __future__ import annotations

import numpy as np
import pytest

from kvstored.tools import events
from kvstored.tools.core import Replay
from kvstored.tools.runs import PolicySpec

from .conftest import random_requests


def _trace(requests):
    counts = np.array([len(r) for r in requests], dtype=np.int64)
    return events.build(np.array([i for r in requests for i in r], dtype=np.int64), counts,
                        counts.copy(), np.arange(len(requests), dtype=np.float64),
                        np.zeros(len(requests), dtype=np.int64), 1, "mooncake",
                        sources=["generated"])


def _hot_and_scans(rounds=30):
    """Five hot two-block prefixes, re-sent every round, between bursts of one-off
    blocks that are never seen again (a scan)."""
    hot = [[100 + 2 * k, 101 + 2 * k] for k in range(5)]
    requests, fresh = [], 10_000
    for _ in range(rounds):
        requests += [list(h) for h in hot]
        for _ in range(15):
            requests.append([fresh])
            fresh += 1
    return requests


def test_scan_resistant_where_lru_is_not():
    replay = Replay(_trace(_hot_and_scans()), 0.5)
    lru = replay.run(PolicySpec("lru", 20))
    s3 = replay.run(PolicySpec("s3fifo", 20))
    ceiling = replay.ceiling()
    assert not lru.underfilled and not s3.underfilled
    assert lru.hit_tokens < s3.hit_tokens <= ceiling.hit_tokens
    # The hot blocks are 10 of the 25 tokens of each round: S3-FIFO keeps nearly all.
    assert s3.hit_tokens >= 0.9 * ceiling.hit_tokens


@pytest.mark.parametrize("seed", range(8))
def test_bounds_and_determinism(seed):
    replay = Replay(_trace(random_requests(seed, requests=150)), 0.5)
    ceiling = replay.ceiling().hit_tokens
    for capacity in (1, 2, 5, 10, 30, 60):
        for small in (0.1, 0.3):
            spec = PolicySpec("s3fifo", capacity, small_fraction=small)
            a = replay.run(spec)
            assert a == replay.run(spec)
            assert 0 <= a.hit_tokens <= ceiling


def test_small_queue_size():
    assert PolicySpec("s3fifo", 100).small_capacity == 10
    assert PolicySpec("s3fifo", 5).small_capacity == 1
    assert PolicySpec("s3fifo", 100, small_fraction=0.25).small_capacity == 25
