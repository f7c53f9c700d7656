"""The replay's result: measured beside predicted, overall and per time window, as one
JSON document (``--json``, docs/replay.md gives its fields) and as tables that fit 80
columns.

Rates are fractions of the prompt tokens of the measured requests (those after the
warm-up). A request's hit tokens are those of its intact prefix; which tier served them
comes from the get's answer (``runner``): per window, the hit tokens are split between
DRAM and SSD in the ratio of the blocks each tier served in that window's gets (exact
when every block weighs the same; the partial last block of a request differs by a few
tokens).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from kvstored.replay.runner import ReplayRun, RequestOutcome
from kvstored.tools.tiered import TierReplay

SCHEMA = "kvstored.replay/1"


def nice_window(span: float, windows: int = 12) -> float:
    """A round window length (1, 2 or 5 times a power of ten seconds) giving about
    ``windows`` windows over ``span`` seconds."""
    if span <= 0:
        return 1.0
    raw = span / windows
    power = 10 ** math.floor(math.log10(raw))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= raw)


def latency(values: Sequence[float]) -> dict[str, Any]:
    """Median, 99th percentile and count of some seconds (None when there are none)."""
    if not values:
        return {"count": 0, "p50": None, "p99": None}
    array = np.asarray(values, dtype=np.float64)
    return {"count": len(values), "p50": float(np.percentile(array, 50)),
            "p99": float(np.percentile(array, 99))}


def tier_rates(outcomes: Sequence[RequestOutcome]) -> dict[str, Any]:
    """Hit rates by tier over ``outcomes`` (see the module docstring for the split)."""
    tokens = sum(o.tokens for o in outcomes)
    hits = sum(o.hit_tokens for o in outcomes)
    dram = sum(o.dram_lookups for o in outcomes)
    ssd = sum(o.ssd_lookups for o in outcomes)
    dram_tokens = hits * dram / (dram + ssd) if dram + ssd else 0.0
    scale = 1.0 / tokens if tokens else 0.0
    return {"tokens": tokens, "hit_tokens": hits,
            "hit_rate": hits * scale, "dram_hit_rate": dram_tokens * scale,
            "ssd_hit_rate": (hits - dram_tokens) * scale,
            "miss_rate": (tokens - hits) * scale if tokens else 0.0}


def predicted_rates(model: TierReplay, requests: slice | np.ndarray) -> dict[str, Any]:
    """The model's hit rates over some requests (a slice or an array of indices)."""
    tokens = int(model.request_tokens[requests].sum())
    dram = int(model.request_dram_hit_tokens[requests].sum())
    ssd = int(model.request_ssd_hit_tokens[requests].sum())
    scale = 1.0 / tokens if tokens else 0.0
    return {"tokens": tokens, "hit_tokens": dram + ssd, "hit_rate": (dram + ssd) * scale,
            "dram_hit_rate": dram * scale, "ssd_hit_rate": ssd * scale,
            "miss_rate": (tokens - dram - ssd) * scale if tokens else 0.0}


def difference(measured: dict, predicted: dict) -> dict[str, float]:
    """Measured minus predicted, in percentage points, per rate."""
    return {name: (measured[f"{name}_rate"] - predicted[f"{name}_rate"]) * 100
            for name in ("hit", "dram_hit", "ssd_hit")}


def windows(run: ReplayRun, model: TierReplay, seconds: float,
            warmup_requests: int) -> list[dict[str, Any]]:
    """Measured and predicted rates per window of ``seconds`` of trace time."""
    measured = [o for o in run.outcomes if o.index >= warmup_requests]
    if not measured:
        return []
    out = []
    edges = np.floor(np.array([o.arrival for o in measured]) / seconds).astype(np.int64)
    for w in np.unique(edges):
        members = [o for o, e in zip(measured, edges) if e == w]
        m = tier_rates(members)
        p = predicted_rates(model, np.array([o.index for o in members]))
        out.append({"start": float(w * seconds), "requests": len(members),
                    "measured": m, "predicted": p,
                    "difference_pp": difference(m, p)["hit"]})
    return out


def document(run: ReplayRun, model: TierReplay, *, trace: dict[str, Any],
             store: dict[str, Any], window_seconds: float) -> dict[str, Any]:
    """The ``--json`` document of one replay."""
    warmup = model.warmup_requests
    measured_outcomes = [o for o in run.outcomes if o.index >= warmup]
    measured = tier_rates(measured_outcomes)
    predicted = predicted_rates(model, slice(warmup, None))
    diff = difference(measured, predicted)
    announced = sum(o.announced for o in run.outcomes)
    counted = sum(run.lookups_after.values()) - sum(run.lookups_before.values())
    ok = run.outcomes
    return {
        "schema": SCHEMA,
        "requests": len(measured_outcomes),
        "warmup_requests": warmup,
        "trace": trace,
        "block_bytes": run.options.block_bytes,
        "namespace": run.options.namespace,
        "concurrency": run.options.concurrency,
        "speed": run.options.speed,
        "wall_seconds": run.wall_seconds,
        "measured": measured,
        "predicted": predicted,
        "difference_pp": diff["hit"],
        "difference_pp_by_tier": {"dram": diff["dram_hit"], "ssd": diff["ssd_hit"]},
        "wrong_bytes": run.wrong_bytes,
        "wrong_blocks": sum(o.wrong_blocks for o in run.outcomes),
        "wrong_examples": [{"key": k, "wrong_bytes": n} for k, n in run.wrong_examples],
        "vanished_blocks": sum(o.vanished for o in run.outcomes),
        "put_refused_blocks": sum(o.put_refused for o in run.outcomes),
        "lookups": {"dram": sum(o.dram_lookups for o in ok),
                    "ssd": sum(o.ssd_lookups for o in ok),
                    "by_others": max(0, counted - announced)},
        "latency_seconds": {
            "prefix_hits": latency([o.lookup_seconds for o in ok]),
            "get": latency([o.get_seconds for o in ok if o.get_seconds is not None]),
            "put": latency([o.put_seconds for o in ok if o.put_seconds is not None])},
        "bytes": {"read": sum(o.bytes_read for o in ok),
                  "written": sum(o.bytes_written for o in ok)},
        "model": {"dram_blocks": model.dram_blocks, "ssd_blocks": model.ssd_blocks,
                  "write_through": model.write_through, "promote_reads": model.promote_reads,
                  "ssd_fifo": model.ssd_fifo,
                  "promotions": model.promotions, "dram_evictions": model.dram_evictions},
        "store": store,
        "window_seconds": window_seconds,
        "windows": windows(run, model, window_seconds, warmup),
    }

