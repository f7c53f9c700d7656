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
"""

from __future__ import annotations

from dataclasses import dataclass

from kvstored.tools.planning import ideal_speedup

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

    def describe(self, bytes_per_block: float | None) -> dict:
        return {
            "ssdBlocks": self.ssd_blocks,
            "ssdGib": self.ssd_blocks * bytes_per_block / (1 << 30) if bytes_per_block else None,
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
