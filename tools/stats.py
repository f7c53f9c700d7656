"""``kvstore trace stats``: what a trace holds, how much of it could ever hit, and when
blocks come back.

Reuse gaps: every block event whose prefix block (trie node) an earlier request touched
is one reuse; its gap is the time since the last request that touched it. The standard
bins are 0-10, 10-20, 20-30 and over 30 minutes: the bimodal picture of hot clusters
(minutes) and a cold tail (hours) that decides whether an SSD tier pays.
"""

from __future__ import annotations

import numpy as np
from kvstored.tools.core import Replay, core_available, ffi, lib
from kvstored.tools.errors import UnavailableError
from kvstored.tools.events import EventTrace

MINUTE = 60.0
STANDARD_BINS = [("0-10 min", 0.0, 10 * MINUTE), ("10-20 min", 10 * MINUTE, 20 * MINUTE),
                 ("20-30 min", 20 * MINUTE, 30 * MINUTE), (">30 min", 30 * MINUTE, np.inf)]


def fine_edges() -> np.ndarray:
    """Histogram edges in seconds: 0, then log-spaced from 1 s to 30 days, with the
    standard bin edges included so the fine bins add up to them exactly."""
    edges = np.unique(np.concatenate([[0.0], np.geomspace(1.0, 30 * 86400.0, 121),
                                      [600.0, 1200.0, 1800.0]]))
    return np.append(edges, np.inf)


def reuse_gaps(replay: Replay, trace: EventTrace) -> dict:
    if not core_available():
        raise UnavailableError("reuse gaps need the compiled simulator core; reinstall "
                               "kvstored with a C compiler present")
    edges = fine_edges()
    counts = np.zeros(len(edges) - 1, dtype=np.uint64)
    times = np.ascontiguousarray(trace.timestamps, dtype=np.float64)
    rc = lib.sim_reuse_gaps(ffi.from_buffer("uint32_t[]", replay.node_of_event),
                            ffi.from_buffer("int64_t[]", replay.offsets), replay.requests,
                            ffi.from_buffer("double[]", times), len(replay.parent),
                            ffi.from_buffer("double[]", edges), len(edges),
                            ffi.from_buffer("uint64_t[]", counts))
    if rc < 0:
        raise MemoryError("reuse gaps: out of memory")
    total = int(counts.sum())
    bins = []
    for label, low, high in STANDARD_BINS:
        inside = (edges[:-1] >= low) & (edges[:-1] < high)
        count = int(counts[inside].sum())
        bins.append({"label": label, "fromSeconds": low,
                     "toSeconds": None if np.isinf(high) else high, "reuses": count,
                     "share": count / total if total else 0.0})
    return {"reuses": total, "bins": bins,
            "histogram": {"edgesSeconds": [float(e) if np.isfinite(e) else None for e in edges],
                          "counts": [int(c) for c in counts]}}


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


def figure(stats: dict):
    """Reuse-gap histogram (log time axis) beside the four standard bins."""
    from kvstored.tools.plots import _pyplot

    plt = _pyplot()
    gaps = stats["reuseGaps"]
    edges = np.array([e if e is not None else np.inf for e in gaps["histogram"]["edgesSeconds"]])
    counts = np.array(gaps["histogram"]["counts"], dtype=float)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [2, 1]})
    # Bin 0 is [0, 1 s) and the last is open-ended: draw the log-spaced middle.
    lo, hi = edges[1:-2], edges[2:-1]
    share = counts[1:-1] / max(1.0, counts.sum()) * 100
    left.bar(lo / MINUTE, share, width=(hi - lo) / MINUTE, align="edge", color="#1f77b4")
    for minutes in (10, 20, 30):
        left.axvline(minutes, color="#d62728", lw=1, ls="--")
    left.set_xscale("log")
    drawn = np.flatnonzero(share)
    if len(drawn):  # only the range where reuses happen
        left.set_xlim(lo[drawn[0]] / MINUTE / 1.5, max(hi[drawn[-1]] / MINUTE * 1.5, 45))
    left.set_xlabel("time since the block's previous use (minutes)")
    left.set_ylabel("% of block reuses")
    left.set_title(f"reuse gaps ({gaps['reuses']:,} reuses; "
                   f"{counts[0] / max(1.0, counts.sum()) * 100:.1f}% under 1 s not drawn)",
                   fontsize=9)
    labels = [b["label"] for b in gaps["bins"]]
    right.bar(labels, [b["share"] * 100 for b in gaps["bins"]],
              color=["#2ca02c", "#bcbd22", "#ff7f0e", "#d62728"])
    for x, b in enumerate(gaps["bins"]):
        right.annotate(f"{b['share'] * 100:.1f}%", (x, b["share"] * 100), ha="center",
                       textcoords="offset points", xytext=(0, 3), fontsize=8)
    right.set_ylabel("% of block reuses")
    right.set_title("standard bins", fontsize=9)
    fig.suptitle(", ".join(stats["trace"]["sources"]), fontsize=10)
    fig.tight_layout()
    return fig
