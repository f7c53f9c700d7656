"""``kvstore trace stats``: what a trace holds, how much of it could ever hit, and when
blocks come back.

Reuse gaps, counted two ways (both binned 0-10, 10-20, 20-30 and over 30 minutes, the
bimodal picture of hot clusters and a cold tail that decides whether an SSD tier pays):

- **per reuse** (``perReuse``): every block event whose prefix block (trie node) an
  earlier request touched is one reuse, binned by the time since that block's previous
  use. It answers "how long do the hits a cache could serve wait?".
- **per block, by its longest gap** (``perBlockMaxGap``): every block used more than
  once counts once, binned by the longest gap between two of its uses (the Qwen-Bailian
  trace analysis's "max reuse gap": "69.2% of reused blocks are re-accessed within ten
  minutes"). It answers "how long must a block be kept to serve all of its reuses?".

Each is weighted by count (reuses, or blocks) and by tokens (the event's token weight,
or the block's when first written), and split by request type where the trace has one
(Bailian ``type``, session requests' ``type``): a reuse goes to the type of the request
that reuses the block, a block to the type of the request that first wrote it.
"""

from __future__ import annotations

import numpy as np

from kvstored.errors import UnavailableError
from kvstored.tools.core import Replay, core_available, ffi, lib
from kvstored.tools.events import EventTrace
from kvstored.tools.plots import pyplot

MINUTE = 60.0
STANDARD_BINS = [("0-10 min", 0.0, 10 * MINUTE), ("10-20 min", 10 * MINUTE, 20 * MINUTE),
                 ("20-30 min", 20 * MINUTE, 30 * MINUTE), (">30 min", 30 * MINUTE, np.inf)]
KINDS = {"perReuse": "block reuses", "perBlockMaxGap": "reused blocks"}


def fine_edges() -> np.ndarray:
    """Histogram edges in seconds: 0, then log-spaced from 1 s to 30 days, with the
    standard bin edges included so the fine bins add up to them exactly."""
    edges = np.unique(np.concatenate([[0.0], np.geomspace(1.0, 30 * 86400.0, 121),
                                      [600.0, 1200.0, 1800.0]]))
    return np.append(edges, np.inf)


def _distribution(gaps: np.ndarray, tokens: np.ndarray, unit: str) -> dict:
    """Standard bins and the fine histogram of ``gaps`` (seconds), by count and tokens."""
    edges = fine_edges()
    where = np.clip(np.searchsorted(edges, gaps, side="right") - 1, 0, len(edges) - 2)
    counts = np.bincount(where, minlength=len(edges) - 1)
    weights = np.bincount(where, weights=tokens.astype(np.float64), minlength=len(edges) - 1)
    total, total_tokens = int(counts.sum()), round(weights.sum())
    bins = []
    for label, low, high in STANDARD_BINS:
        inside = (edges[:-1] >= low) & (edges[:-1] < high)
        count, weight = int(counts[inside].sum()), round(weights[inside].sum())
        bins.append({"label": label, "fromSeconds": low,
                     "toSeconds": None if np.isinf(high) else high, "count": count,
                     "share": count / total if total else 0.0, "tokens": weight,
                     "tokenShare": weight / total_tokens if total_tokens else 0.0})
    return {"unit": unit, "count": total, "tokens": total_tokens, "bins": bins,
            "histogram": {"edgesSeconds": [float(e) if np.isfinite(e) else None
                                           for e in edges],
                          "counts": [int(c) for c in counts],
                          "tokens": [round(w) for w in weights]}}


def reuse_gaps(replay: Replay, trace: EventTrace) -> dict:
    """Both reuse-gap distributions, overall and by request type."""
    if not core_available():
        raise UnavailableError("reuse gaps need the compiled simulator core; reinstall "
                               "kvstored with a C compiler present")
    times = np.ascontiguousarray(trace.timestamps, dtype=np.float64)
    event_gap = np.empty(replay.events, dtype=np.float64)
    node_gap = np.empty(len(replay.parent), dtype=np.float64)
    rc = lib.sim_reuse_gaps(ffi.from_buffer("uint32_t[]", replay.node_of_event),
                            ffi.from_buffer("int64_t[]", replay.offsets), replay.requests,
                            ffi.from_buffer("double[]", times), len(replay.parent),
                            ffi.from_buffer("double[]", event_gap),
                            ffi.from_buffer("double[]", node_gap))
    if rc < 0:
        raise MemoryError("reuse gaps: out of memory")
    reuse = event_gap >= 0
    # Nodes are numbered in the order they are first seen, so the first uses (gap -1)
    # are the nodes 1, 2, ... in order: the block's weight and writer come from there.
    first = np.flatnonzero(~reuse)
    block_gap = node_gap[1:]
    reused_block = block_gap >= 0
    tokens = replay.tokens
    out = {"perReuse": _distribution(event_gap[reuse], tokens[reuse], KINDS["perReuse"]),
           "perBlockMaxGap": _distribution(block_gap[reused_block],
                                           tokens[first][reused_block],
                                           KINDS["perBlockMaxGap"]),
           "byRequestType": None}
    if trace.kinds is not None:
        request = np.repeat(np.arange(trace.requests), np.diff(replay.offsets))
        event_kind = trace.kinds[request]
        block_kind = event_kind[first]
        out["byRequestType"] = {
            name: {"perReuse": _distribution(event_gap[reuse & (event_kind == k)],
                                             tokens[reuse & (event_kind == k)],
                                             KINDS["perReuse"]),
                   "perBlockMaxGap": _distribution(
                       block_gap[reused_block & (block_kind == k)],
                       tokens[first][reused_block & (block_kind == k)],
                       KINDS["perBlockMaxGap"])}
            for k, name in enumerate(trace.kind_names)}
    return out


def describe(trace: EventTrace, *, warmup: float = 0.5, engine: str = "auto") -> dict:
    """The statistics document of ``kvstore trace stats``."""
    replay = Replay(trace, warmup, next_use=False, engine=engine)
    ceiling = replay.ceiling()
    everything = Replay(trace, 0.0, next_use=False, engine=engine).ceiling() \
        if warmup else ceiling
    summary = trace.summary()
    requests = max(1, trace.requests)
    return {
        "tool": "kvstore trace stats",
        "trace": summary,
        "requests": trace.requests,
        "blockEvents": trace.events,
        "uniqueBlocks": replay.unique_blocks,
        "blockSize": trace.block_size,
        "inputTokens": summary["inputTokens"],
        "outputTokens": int(trace.output_lengths.sum()),
        "meanInputTokens": summary["inputTokens"] / requests,
        "meanBlocksPerRequest": trace.events / requests,
        "timeSpanSeconds": summary["timeSpanSeconds"],
        "ceiling": {"warmupFraction": warmup, "hitTokens": ceiling.hit_tokens,
                    "totalTokens": ceiling.total_tokens, "hitRate": ceiling.hit_rate},
        "ceilingAllRequests": {"hitTokens": everything.hit_tokens,
                               "totalTokens": everything.total_tokens,
                               "hitRate": everything.hit_rate},
        "reuseGaps": reuse_gaps(replay, trace),
    }


def figure(stats: dict, weight: str = "count"):
    """The per-reuse gap histogram (log time axis), and the standard bins of both
    definitions side by side; ``weight`` is "count" or "tokens"."""
    plt = pyplot()
    gaps = stats["reuseGaps"]
    per_reuse, per_block = gaps["perReuse"], gaps["perBlockMaxGap"]
    key, share_key = ("counts", "share") if weight == "count" else ("tokens", "tokenShare")
    edges = np.array([e if e is not None else np.inf
                      for e in per_reuse["histogram"]["edgesSeconds"]])
    values = np.array(per_reuse["histogram"][key], dtype=float)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2),
                                      gridspec_kw={"width_ratios": [1.6, 1]})
    # Bin 0 is [0, 1 s) and the last is open-ended: draw the log-spaced middle.
    lo, hi = edges[1:-2], edges[2:-1]
    total = max(1.0, values.sum())
    share = values[1:-1] / total * 100
    left.bar(lo / MINUTE, share, width=(hi - lo) / MINUTE, align="edge", color="#1f77b4")
    for minutes in (10, 20, 30):
        left.axvline(minutes, color="#7f7f7f", lw=1, ls="--")
    left.set_xscale("log")
    drawn = np.flatnonzero(share)
    if len(drawn):  # only the range where reuses happen
        left.set_xlim(lo[drawn[0]] / MINUTE / 1.5, max(hi[drawn[-1]] / MINUTE * 1.5, 45))
    unit = "reuses" if weight == "count" else "reused tokens"
    left.set_xlabel("time since the block's previous use (minutes)")
    left.set_ylabel(f"% of {unit}")
    left.set_title(f"per reuse: {per_reuse['count']:,} reuses "
                   f"({values[0] / total * 100:.1f}% under 1 s not drawn)", fontsize=9)
    labels = [b["label"] for b in per_reuse["bins"]]
    x = np.arange(len(labels))
    width = 0.38
    for offset, dist, name, color in (
            (-width / 2, per_reuse, "per reuse (gap since previous use)", "#1f77b4"),
            (width / 2, per_block, "per reused block (its longest gap)", "#ff7f0e")):
        heights = [b[share_key] * 100 for b in dist["bins"]]
        right.bar(x + offset, heights, width, label=name, color=color)
        for xi, h in zip(x + offset, heights, strict=True):
            right.annotate(f"{h:.1f}%", (xi, h), ha="center", textcoords="offset points",
                           xytext=(0, 2), fontsize=7)
    right.set_xticks(x, labels)
    right.set_ylabel(f"% (weighted by {weight})")
    right.set_ylim(0, 115)
    right.legend(fontsize=7, loc="upper right", frameon=False)
    right.set_title("standard bins, both definitions", fontsize=9)
    fig.suptitle(", ".join(stats["trace"]["sources"]), fontsize=10)
    fig.tight_layout()
    return fig
