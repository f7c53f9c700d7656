"""The DRAM + SSD analysis: configuration, the TTFT model, and the two-point estimate.

The TTFT model charges each measured request the recompute of its missed tokens at the
prefill throughput, plus the load of its hit tokens at the bandwidth of the tier that
served them (load and compute add up; no overlap is assumed, so it is a pessimistic
bound for systems that overlap layer loads with compute). It is linear in the tokens, so
the mean over requests follows from the totals the replay returns.

The *two-point estimate* is how the published "512 GB DRAM + 2 TB SSD: 95.1% of hits from
DRAM" figure was made: the hit rate of a DRAM-only LRU cache divided by that of one LRU
cache of DRAM + SSD size. It is reported next to the simulated split so the two can be
compared (docs/simulator.md explains where they part).

``replay_tiers`` is the tiered policy as a library call: capacities in blocks in, hits by
tier per request (and per time window) out, for comparing a live store with the model.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvstored.tools.core import Replay
from kvstored.tools.planning import ideal_speedup
from kvstored.tools.runs import PolicySpec

#: Defaults for one serving instance (documented in docs/simulator.md).
DEFAULT_PREFILL_TOKENS_PER_S = 10_000.0
DEFAULT_DRAM_GBPS = 50.0
DEFAULT_SSD_GBPS = 10.0


@dataclass(frozen=True)
class TierConfig:
    ssd_blocks: int
    write_through: bool = True
    promote: bool = True
    prefill_tokens_per_s: float = DEFAULT_PREFILL_TOKENS_PER_S
    dram_gbps: float = DEFAULT_DRAM_GBPS
    ssd_gbps: float = DEFAULT_SSD_GBPS

    @property
    def mode(self) -> str:
        return "write-through" if self.write_through else "offload-on-evict"

    def describe(self, bytes_per_block: float | None, ssd_gib: float | None = None) -> dict:
        """The configuration for the result; ``ssd_gib`` is the size as given (the
        blocks it holds, times the block size, may fall a little short of it)."""
        if ssd_gib is None and bytes_per_block:
            ssd_gib = self.ssd_blocks * bytes_per_block / (1 << 30)
        return {
            "ssdBlocks": self.ssd_blocks,
            "ssdGib": ssd_gib,
            "mode": self.mode,
            "promotion": self.promote,
            "ttftModel": {"prefillTokensPerSecond": self.prefill_tokens_per_s,
                          "dramGBps": self.dram_gbps, "ssdGBps": self.ssd_gbps},
        }


def ttft(cfg: TierConfig, *, total_tokens: int, dram_tokens: int, ssd_tokens: int,
         requests: int, bytes_per_token: float) -> dict:
    """Mean modelled time to first token (prefill part) per measured request."""
    miss = total_tokens - dram_tokens - ssd_tokens
    compute = miss / cfg.prefill_tokens_per_s
    dram_load = dram_tokens * bytes_per_token / (cfg.dram_gbps * 1e9)
    ssd_load = ssd_tokens * bytes_per_token / (cfg.ssd_gbps * 1e9)
    no_cache = total_tokens / cfg.prefill_tokens_per_s
    total = compute + dram_load + ssd_load
    n = max(1, requests)
    return {"meanSeconds": total / n, "recomputeSeconds": compute / n,
            "dramLoadSeconds": dram_load / n, "ssdLoadSeconds": ssd_load / n,
            "noCacheSeconds": no_cache / n, "speedup": no_cache / total if total else None}


def point(cfg: TierConfig, run, *, lru_dram_hits: int | None, lru_total_hits: int | None,
          requests: int, bytes_per_token: float | None) -> dict:
    """The tiered result of one budget, with the two-point estimate beside it."""
    hits = run.hit_tokens
    ssd = run.ssd_hit_tokens
    dram = hits - ssd
    out = {
        "hitTokens": hits, "totalTokens": run.total_tokens, "hitRate": run.hit_rate,
        "dramHitTokens": dram, "ssdHitTokens": ssd,
        "dramShareOfHits": dram / hits if hits else None,
        "idealSpeedup": ideal_speedup(run.hit_rate),
        "promotions": run.promotions, "ssdWrites": run.ssd_writes,
        "dramEvictions": run.evictions,
        "twoPointDramShare": (lru_dram_hits / lru_total_hits
                              if lru_dram_hits is not None and lru_total_hits else None),
    }
    if bytes_per_token:
        out["ttft"] = ttft(cfg, total_tokens=run.total_tokens, dram_tokens=dram,
                           ssd_tokens=ssd, requests=requests, bytes_per_token=bytes_per_token)
    return out


@dataclass
class TierReplay:
    """What one DRAM + SSD configuration serves on a trace: totals over the measured
    requests, and per request (every request, warm-up included) the tokens, and the hit
    tokens served by DRAM and by the SSD."""

    dram_blocks: int
    ssd_blocks: int
    write_through: bool
    promote: bool
    warmup_requests: int
    filled: bool                    # the cache reached its capacity during the warm-up
    promotions: int
    ssd_writes: int
    dram_evictions: int
    timestamps: np.ndarray          # float64 [requests], seconds
    request_tokens: np.ndarray      # uint64 [requests]
    request_dram_hit_tokens: np.ndarray
    request_ssd_hit_tokens: np.ndarray
    promote_reads: int = 1
    ssd_fifo: bool = False

    def _measured(self, array: np.ndarray) -> int:
        return int(array[self.warmup_requests:].sum(dtype=np.uint64))

    @property
    def total_tokens(self) -> int:
        return self._measured(self.request_tokens)

    @property
    def dram_hit_tokens(self) -> int:
        return self._measured(self.request_dram_hit_tokens)

    @property
    def ssd_hit_tokens(self) -> int:
        return self._measured(self.request_ssd_hit_tokens)

    @property
    def hit_tokens(self) -> int:
        return self.dram_hit_tokens + self.ssd_hit_tokens

    def rates(self) -> dict:
        """Hit rates over the measured requests' tokens, overall and by tier."""
        total = self.total_tokens or 1
        return {"hit_rate": self.hit_tokens / total,
                "dram_hit_rate": self.dram_hit_tokens / total,
                "ssd_hit_rate": self.ssd_hit_tokens / total}

    def windows(self, seconds: float) -> list[dict]:
        """The same per time window of ``seconds`` (from the first request's time), over
        every request: ``start``, ``requests``, ``tokens``, the three rates."""
        if seconds <= 0:
            raise ValueError("the window must be positive")
        if not len(self.timestamps):
            return []
        index = np.floor((self.timestamps - self.timestamps.min()) / seconds).astype(np.int64)
        n = int(index.max()) + 1
        count = np.bincount(index, minlength=n)
        sums = [np.bincount(index, weights=a.astype(np.float64), minlength=n) for a in (
            self.request_tokens, self.request_dram_hit_tokens, self.request_ssd_hit_tokens)]
        out = []
        for w in range(n):
            tokens, dram, ssd = (float(s[w]) for s in sums)
            scale = 1.0 / tokens if tokens else 0.0
            out.append({"start": float(self.timestamps.min() + w * seconds),
                        "requests": int(count[w]), "tokens": int(tokens),
                        "hit_rate": (dram + ssd) * scale, "dram_hit_rate": dram * scale,
                        "ssd_hit_rate": ssd * scale})
        return out


def replay_tiers(trace, dram_blocks: int, ssd_blocks: int, *, write_through: bool = True,
                 promote: bool = True, warmup: float = 0.0, replay=None,
                 promote_reads: int = 1, ssd_fifo: bool = False) -> TierReplay:
    """Replay ``trace`` (an EventTrace) on DRAM over SSD with capacities in blocks, every
    request (no warm-up cut-off), and return the hits by tier per request.

    With ``promote``, a block is copied into DRAM on its ``promote_reads``-th SSD-served
    hit and on every later one (the store's ``policy.promote_reads``, without its time
    window). ``ssd_fifo`` evicts the SSD oldest write first, whatever hangs below it (the
    store's backends' default ``fifo``), instead of its least recently used leaf.

    ``warmup`` only decides which requests the totals measure. ``replay`` may pass a
    ``Replay`` already built for this trace (with the same warm-up) to skip the trie.
    This is what ``kvstore replay`` predicts a store with those capacities serves."""
    if dram_blocks < 0 or ssd_blocks < 0:
        raise ValueError("capacities must not be negative")
    if promote_reads < 1:
        raise ValueError("promote_reads must be at least 1")
    if replay is None:
        replay = Replay(trace, warmup, next_use=False)
    request_tokens = np.add.reduceat(replay.tokens.astype(np.uint64), replay.offsets[:-1]) \
        if replay.events else np.zeros(replay.requests, dtype=np.uint64)
    if dram_blocks == 0 and ssd_blocks == 0:
        zero = np.zeros(replay.requests, dtype=np.uint64)
        return TierReplay(0, 0, write_through, promote, replay.warmup_requests, False, 0, 0,
                          0, trace.timestamps, request_tokens, zero, zero.copy(),
                          promote_reads, ssd_fifo)
    run = replay.run(PolicySpec("tiered", dram_blocks, ssd_blocks, write_through, promote,
                                full_run=True, promote_reads=promote_reads,
                                ssd_fifo=ssd_fifo), per_request=True)
    ssd = run.request_ssd_hit_tokens
    return TierReplay(dram_blocks, ssd_blocks, write_through, promote,
                      replay.warmup_requests, not run.underfilled, run.promotions,
                      run.ssd_writes, run.evictions, trace.timestamps, request_tokens,
                      run.request_hit_tokens - ssd, ssd, promote_reads, ssd_fifo)
