"""The tiered policy on small traces worked out by hand, and its limits.

Blocks of one token (block size 1, input length = block count), four requests
[a b] [c d] [a b] [c d]; the first one warms the cache (warm-up 0.25), the other three
(6 tokens) are measured. DRAM holds 2 blocks, the SSD 4.
"""

from __future__ import annotations

import numpy as np
import pytest

from kvstored.tools import events, simulate, tiered
from kvstored.tools.core import Replay
from kvstored.tools.runs import PolicySpec

from . import bruteforce_tiered
from .conftest import random_requests

A, B, C, D = 1, 2, 3, 4


def _trace(requests):
    counts = np.array([len(r) for r in requests], dtype=np.int64)
    return events.build(np.array([i for r in requests for i in r], dtype=np.int64), counts,
                        counts.copy(), np.arange(len(requests), dtype=np.float64) * 60,
                        np.zeros(len(requests), dtype=np.int64), 1, "mooncake",
                        sources=["hand"])


@pytest.fixture
def replay():
    return Replay(_trace([[A, B], [C, D], [A, B], [C, D]]), 0.25)


def _tiered(replay, *, write_through, promote, dram=2, ssd=4):
    return replay.run(PolicySpec("tiered", dram, ssd, write_through, promote))


def test_write_through_with_promotion(replay):
    # r0: DRAM {a,b}, SSD {a,b}.  r1: c, d miss; DRAM evicts b then a: DRAM {c,d};
    # SSD {a,b,c,d}.  r2: a, b hit on the SSD and are promoted (DRAM evicts d, then c).
    # r3: c, d hit on the SSD again, promoted in turn. 4 hits of 6, all from the SSD.
    r = _tiered(replay, write_through=True, promote=True)
    assert (r.hit_tokens, r.ssd_hit_tokens, r.total_tokens) == (4, 4, 6)
    assert (r.promotions, r.ssd_writes) == (4, 4)


def test_write_through_without_promotion(replay):
    # As above, but r2's SSD hits stay on the SSD, so DRAM still holds c, d for r3.
    r = _tiered(replay, write_through=True, promote=False)
    assert (r.hit_tokens, r.ssd_hit_tokens, r.total_tokens) == (4, 2, 6)
    assert (r.promotions, r.ssd_writes) == (0, 4)


def test_offload_on_evict_without_promotion(replay):
    # r0: DRAM {a,b}, SSD empty.  r1: DRAM evicts b (offloaded), then a (offloaded):
    # DRAM {c,d}, SSD {b,a} - b arrived before its parent a, which is still not a leaf
    # on the SSD.  r2: a, b hit on the SSD.  r3: c, d hit in DRAM.
    r = _tiered(replay, write_through=False, promote=False)
    assert (r.hit_tokens, r.ssd_hit_tokens) == (4, 2)
    assert (r.promotions, r.ssd_writes) == (0, 2)


def test_offload_on_evict_with_promotion(replay):
    # r2 promotes a, b: DRAM evicts d then c, both offloaded (SSD {b,a,d,c}).
    # r3: c, d hit on the SSD and are promoted; b and a, evicted from DRAM to make room,
    # are on the SSD already: no further writes.
    r = _tiered(replay, write_through=False, promote=True)
    assert (r.hit_tokens, r.ssd_hit_tokens) == (4, 4)
    assert (r.promotions, r.ssd_writes) == (4, 4)


def test_dram_only_lru_gets_nothing_here(replay):
    assert replay.run(PolicySpec("lru", 2)).hit_tokens == 0


def test_ssd_smaller_than_needed_drops_writes():
    # SSD of 1 block: write-through keeps only the last written block that fits.
    replay = Replay(_trace([[A, B], [C, D], [A, B], [C, D]]), 0.25)
    r = replay.run(PolicySpec("tiered", 2, 1, True, False))
    assert r.hit_tokens <= 4 and r.ssd_hit_tokens <= r.hit_tokens


@pytest.mark.parametrize("seed", range(8))
def test_no_ssd_is_lru_and_no_dram_is_lru_on_the_ssd(seed):
    counts_requests = random_requests(seed, requests=80)
    replay = Replay(_trace(counts_requests), 0.5)
    for capacity in (2, 5, 9, 17, 40):
        lru = replay.run(PolicySpec("lru", capacity))
        for write_through in (True, False):
            for promote in (True, False):
                no_ssd = replay.run(PolicySpec("tiered", capacity, 0, write_through, promote))
                assert (no_ssd.hit_tokens, no_ssd.underfilled, no_ssd.ssd_hit_tokens) == \
                    (lru.hit_tokens, lru.underfilled, 0)
        no_dram = replay.run(PolicySpec("tiered", 0, capacity, True, True))
        assert (no_dram.hit_tokens, no_dram.ssd_hit_tokens, no_dram.underfilled) == \
            (lru.hit_tokens, lru.hit_tokens, lru.underfilled)


@pytest.mark.parametrize("seed", range(4))
def test_bounds(seed):
    # A tier can lose against DRAM-only LRU (promotions push useful blocks out of a tiny
    # DRAM, as in the hand-worked case above), so only the bounds hold in general.
    replay = Replay(_trace(random_requests(seed, requests=120)), 0.5)
    ceiling = replay.ceiling().hit_tokens
    for dram in (2, 4, 8):
        for ssd in (4, 16, 64):
            for write_through in (True, False):
                r = replay.run(PolicySpec("tiered", dram, ssd, write_through, True))
                assert 0 <= r.ssd_hit_tokens <= r.hit_tokens <= ceiling


def test_ttft_model():
    cfg = tiered.TierConfig(ssd_blocks=10, prefill_tokens_per_s=1000.0, dram_gbps=1.0,
                            ssd_gbps=0.5)
    out = tiered.ttft(cfg, total_tokens=10_000, dram_tokens=4_000, ssd_tokens=2_000,
                      requests=2, bytes_per_token=100_000)
    # 4000 missed tokens at 1000/s = 4 s; 4000 * 1e5 B at 1 GB/s = 0.4 s;
    # 2000 * 1e5 B at 0.5 GB/s = 0.4 s; per request: half of each.
    assert out["recomputeSeconds"] == pytest.approx(2.0)
    assert out["dramLoadSeconds"] == pytest.approx(0.2)
    assert out["ssdLoadSeconds"] == pytest.approx(0.2)
    assert out["meanSeconds"] == pytest.approx(2.4)
    assert out["noCacheSeconds"] == pytest.approx(5.0)
    assert out["speedup"] == pytest.approx(5.0 / 2.4)


def test_write_through_reaches_the_ssd_when_dram_is_smaller_than_a_request():
    # DRAM 2, SSD 8, write-through, no promotion. r0 [a b]: DRAM {a,b}, SSD {a,b}.
    # r1 [a b c d]: a, b hit and are protected, so DRAM can take neither c nor d; the SSD
    # still takes both. r2 [a b c d]: a, b from DRAM, c, d from the SSD. r1 and r2 are
    # measured (warm-up: 1 request): 6 hits of 8 tokens, 2 from the SSD.
    replay = Replay(_trace([[A, B], [A, B, C, D], [A, B, C, D]]), 0.5)
    r = replay.run(PolicySpec("tiered", 2, 8, True, False))
    assert (r.hit_tokens, r.ssd_hit_tokens, r.total_tokens) == (6, 2, 8)
    assert r.ssd_writes == 4


def test_offload_writes_what_dram_refuses_to_the_ssd():
    # As above in offload mode: DRAM refuses c and d, so they go to the SSD at once.
    replay = Replay(_trace([[A, B], [A, B, C, D], [A, B, C, D]]), 0.5)
    r = replay.run(PolicySpec("tiered", 2, 8, False, False))
    assert (r.hit_tokens, r.ssd_hit_tokens) == (6, 2)
    assert r.ssd_writes == 2


def _paths(requests):
    """Trie nodes of each request, built here independently of the C core."""
    edges: dict[tuple[int, int], int] = {}
    parent = {0: 0}
    paths = []
    for ids in requests:
        at, path = 0, []
        for block in ids:
            node = edges.get((at, block))
            if node is None:
                node = edges[(at, block)] = len(parent)
                parent[node] = at
            path.append(node)
            at = node
        paths.append(path)
    return paths, parent


class _BesideTheModel:
    """Random requests replayed by the C core and by bruteforce_tiered's model."""

    def __init__(self, seed: int, requests: int, warmup: float) -> None:
        drawn = random_requests(seed, requests=requests)
        self.replay = Replay(_trace(drawn), warmup)
        self.paths, self.parent = _paths(drawn)
        self.weights = [[1] * len(p) for p in self.paths]

    def run(self, dram: int, ssd: int, write_through: bool, promote: bool, reads: int = 1,
            *, ssd_fifo: bool = False, full_run: bool = False):
        """The core's result and the model's, for one tiered policy."""
        got = self.replay.run(PolicySpec("tiered", dram, ssd, write_through, promote,
                                         full_run=full_run, promote_reads=reads,
                                         ssd_fifo=ssd_fifo))
        want = bruteforce_tiered.tiered(self.paths, self.weights, self.parent,
                                        self.replay.warmup_requests, dram, ssd, write_through,
                                        promote, reads, ssd_fifo=ssd_fifo)
        return got, want


@pytest.mark.parametrize("seed", range(4))
def test_tiered_promote_reads_matches_a_brute_force_model(seed):
    """A block promoted on its k-th SSD hit (the store's policy.promote_reads)."""
    model = _BesideTheModel(seed + 10, 80, 0.25)
    differs = 0
    for dram, ssd in ((2, 9), (3, 25), (6, 25), (1, 4)):
        first = None
        for reads in (1, 2, 3):
            got, want = model.run(dram, ssd, True, True, reads, full_run=True)
            where = (seed, dram, ssd, reads)
            assert (got.hit_tokens, got.ssd_hit_tokens, got.promotions, got.evictions) == (
                want.hit_tokens, want.ssd_hit_tokens, want.promotions, want.evictions), where
            if first is None:
                first = got
            differs += got.promotions != first.promotions
    assert differs, "promote_reads never changed a replay: the test proves nothing"


@pytest.mark.parametrize("seed", range(4))
def test_tiered_fifo_ssd_matches_a_brute_force_model(seed):
    """The SSD tier evicting oldest write first, as the store's backends do."""
    model = _BesideTheModel(seed + 20, 80, 0.25)
    differs = 0
    for dram, ssd in ((0, 6), (2, 9), (3, 25), (6, 12), (1, 4)):
        for write_through in (True, False):
            for reads in (1, 2):
                lru = model.replay.run(PolicySpec("tiered", dram, ssd, write_through, True,
                                                  full_run=True, promote_reads=reads))
                got, want = model.run(dram, ssd, write_through, True, reads, ssd_fifo=True,
                                      full_run=True)
                where = (seed, dram, ssd, write_through, reads)
                assert (got.hit_tokens, got.ssd_hit_tokens, got.promotions,
                        got.ssd_writes, got.evictions) == (
                    want.hit_tokens, want.ssd_hit_tokens, want.promotions,
                    want.ssd_writes, want.evictions), where
                differs += (got.hit_tokens, got.ssd_hit_tokens) != (lru.hit_tokens,
                                                                     lru.ssd_hit_tokens)
    assert differs, "FIFO never differed from LRU on the SSD: the test proves nothing"


def test_replay_tiers_promote_reads_one_is_promotion_on_the_first_hit():
    trace = _trace(random_requests(7, requests=120))
    once = tiered.replay_tiers(trace, 3, 30, promote_reads=1)
    default = tiered.replay_tiers(trace, 3, 30)
    later = tiered.replay_tiers(trace, 3, 30, promote_reads=2)
    assert once.rates() == default.rates() and once.promotions == default.promotions
    assert later.promotions < once.promotions
    assert later.promote_reads == 2
    with pytest.raises(ValueError):
        tiered.replay_tiers(trace, 3, 30, promote_reads=0)


@pytest.mark.parametrize("seed", range(4))
def test_tiered_matches_a_brute_force_model(seed):
    model = _BesideTheModel(seed, 60, 0.5)
    checked = 0
    for dram in (0, 1, 2, 3, 6, 12):
        for ssd in (0, 1, 4, 9, 25):
            if dram == 0 and ssd == 0:
                continue
            for write_through in (True, False):
                for promote in (True, False):
                    got, want = model.run(dram, ssd, write_through, promote)
                    where = (seed, dram, ssd, write_through, promote)
                    assert (got.hit_tokens, got.ssd_hit_tokens, got.total_tokens,
                            got.underfilled) == (want.hit_tokens, want.ssd_hit_tokens,
                                                 want.total_tokens, want.underfilled), where
                    if not got.underfilled:
                        assert (got.promotions, got.ssd_writes, got.evictions) == (
                            want.promotions, want.ssd_writes, want.evictions), where
                    checked += 1
    assert checked == 29 * 4


def test_sweep_runs_tiered_at_zero_dram_as_lru_on_the_ssd(tmp_path):
    requests = random_requests(3, requests=120)
    trace = _trace(requests)
    ssd = 20
    result = simulate.simulate([], simulate.SimOptions(
        blocks=[0, ssd], policies=["lru", "tiered"], ssd_blocks=ssd), trace=trace)
    zero, at_ssd = result["points"][0], result["points"][1]
    assert zero["cacheBlocks"] == 0 and zero["results"]["lru"]["hitTokens"] == 0
    lru_at_ssd = at_ssd["results"]["lru"]["hitTokens"]
    assert lru_at_ssd > 0
    assert zero["results"]["tiered"]["hitTokens"] == lru_at_ssd
    assert zero["results"]["tiered"]["ssdHitTokens"] == lru_at_ssd


def test_replay_tiers_library_call_per_request_and_windows():
    trace = _trace(random_requests(5, requests=150))
    replay = Replay(trace, 0.5)
    run = replay.run(PolicySpec("tiered", 4, 20, True, True))
    assert not run.underfilled
    got = tiered.replay_tiers(trace, 4, 20, warmup=0.5)
    assert got.filled
    assert (got.hit_tokens, got.ssd_hit_tokens, got.total_tokens) == \
        (run.hit_tokens, run.ssd_hit_tokens, run.total_tokens)
    assert got.rates()["hit_rate"] == pytest.approx(run.hit_rate)
    # per request: every request, warm-up included; per window: they add up
    assert len(got.request_tokens) == trace.requests
    assert int(got.request_tokens.sum()) == int(trace.tokens.sum())
    windows = got.windows(600.0)  # requests are 60 s apart: 10 per window
    assert [w["requests"] for w in windows] == [10] * 15
    assert sum(w["tokens"] for w in windows) == int(trace.tokens.sum())
    hits = sum(w["hit_rate"] * w["tokens"] for w in windows)
    assert hits == pytest.approx(int(got.request_dram_hit_tokens.sum()
                                     + got.request_ssd_hit_tokens.sum()))
    # a cache that never fills in the warm-up is replayed to the end all the same
    big = tiered.replay_tiers(trace, 10_000, 10_000, warmup=0.5)
    assert not big.filled and big.hit_tokens == replay.ceiling().hit_tokens
    assert big.ssd_hit_tokens == 0
    assert tiered.replay_tiers(trace, 0, 0).hit_tokens == 0
