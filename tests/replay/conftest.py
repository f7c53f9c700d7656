"""Fixtures of the replay tests: small traces built in the test, and a real embedded
store (``kvstored up``) per test that needs one."""

from __future__ import annotations

import numpy as np
import pytest

from kvstored.replay.embedded import EmbeddedStore
from kvstored.tools import events


def trace_of(requests: list[list[int]], block: int = 16, times: list[float] | None = None,
             lengths: list[int] | None = None) -> events.EventTrace:
    """An EventTrace of requests given as lists of block ids (every block full unless
    ``lengths`` says otherwise)."""
    ids = np.array([i for r in requests for i in r], dtype=np.int64)
    counts = np.array([len(r) for r in requests])
    lengths = lengths or [len(r) * block for r in requests]
    times = times if times is not None else [float(i) for i in range(len(requests))]
    return events.build(ids, counts, lengths, times, [1] * len(requests), block, "mooncake",
                        sources=["test"])


def random_trace(seed: int, requests: int = 80, block: int = 16,
                 stems: int = 6) -> events.EventTrace:
    """Requests that share prefixes of ``stems`` roots, some long, some repeated."""
    rng = np.random.default_rng(seed)
    stems = [[int(x) for x in rng.integers(1, 1 << 40, size=int(rng.integers(2, 8)))]
             for _ in range(stems)]
    out = []
    for _ in range(requests):
        stem = stems[int(rng.integers(len(stems)))]
        tail = [int(x) for x in rng.integers(1, 1 << 40, size=int(rng.integers(0, 6)))]
        out.append(stem[:int(rng.integers(1, len(stem) + 1))] + tail)
    return trace_of(out, block)


@pytest.fixture
def store():
    """A fresh embedded store: 16 MiB DRAM, 256 MiB SSD, default everything else."""
    with EmbeddedStore(dram=16 << 20, ssd=256 << 20, label="test") as running:
        yield running
