"""PNG plots of a simulation and of trace statistics (matplotlib, headless)."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from kvstored.errors import UnavailableError
from kvstored.tools.planning import size_label


def pyplot():
    try:
        import matplotlib
    except ImportError:
        raise UnavailableError(
            "plots need matplotlib: pip install 'kvstored[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


_COLOURS = {"fifo": "#8c8c8c", "lru": "#1f77b4", "optimal": "#2ca02c", "s3fifo": "#ff7f0e",
            "tiered": "#9467bd"}
# Curves often coincide (LRU and S3-FIFO on recency-driven traces): each policy has its
# own width, dash and marker, drawn widest first, so one never hides another.
_STYLES = {"lru": dict(lw=4.0, ls="-", marker="o", ms=6, alpha=0.55, zorder=2),
           "tiered": dict(lw=3.0, ls="-", marker="D", ms=5, alpha=0.7, zorder=3),
           "fifo": dict(lw=1.6, ls=":", marker="v", ms=5, zorder=4),
           "optimal": dict(lw=1.6, ls="-.", marker="^", ms=5, zorder=4),
           "s3fifo": dict(lw=1.4, ls="--", marker="x", ms=6, zorder=5)}
_DRAW_ORDER = ("lru", "tiered", "fifo", "optimal", "s3fifo")


def _x(point: dict) -> float:
    return point["gib"] if point["gib"] is not None else point["cacheBlocks"]


def _style(policy: str) -> dict:
    return {"color": _COLOURS.get(policy)} | _STYLES.get(policy, dict(lw=1.5, marker="o",
                                                                     ms=4))


def sim_figure(result: dict):
    """Hit rate and ideal speedup against budget, the ceiling dashed, the recommended
    budget marked with its value; legends beside the axes, never over a curve."""
    plt = pyplot()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9.5, 7.5), sharex=True)
    points = result["points"]
    by_gib = bool(points) and points[0]["gib"] is not None
    xs = [_x(p) for p in points]
    policies = sorted(result["policies"], key=lambda p: (_DRAW_ORDER.index(p)
                                                         if p in _DRAW_ORDER else 9))
    for policy in policies:
        label = f"tiered (DRAM {_ssd_label(result)})" if policy == "tiered" else policy
        top.plot(xs, [p["results"][policy]["hitRate"] * 100 for p in points], label=label,
                 **_style(policy))
        bottom.plot(xs, [p["results"][policy]["idealSpeedup"] for p in points],
                    label=label, **_style(policy))
    ceiling = result["ceiling"]
    top.axhline(ceiling["hitRate"] * 100, ls="--", color="black", lw=1,
                label=f"ceiling {ceiling['hitRate'] * 100:.1f}%")
    bottom.axhline(ceiling["idealSpeedup"], ls="--", color="black", lw=1,
                   label=f"ceiling {ceiling['idealSpeedup']:.2f}x")
    rec = result.get("recommended") or {}
    if rec.get("gib") is not None and by_gib:
        kind = " modelled TTFT speedup" if rec.get("metric") == "ttftSpeedup" else ""
        label = f"recommended ({rec['policy']}): {size_label(rec['gib'])}\n" \
                f"{rec['speedup']:.2f}x{kind}"
        for axis in (top, bottom):
            axis.axvline(rec["gib"], color="#d62728", lw=1.2, ls=":", zorder=1)
        bottom.plot([rec["gib"]], [rec["idealSpeedup"]], marker="*", ms=14,
                    color="#d62728", zorder=6, ls="none", label=label)
    top.set_ylabel("hit rate (% of measured tokens)")
    top.set_ylim(bottom=0)
    bottom.set_ylabel("ideal prefill speedup (x; 1x = no cache)")
    bottom.set_ylim(bottom=1)
    bottom.set_xlabel("cache budget" if by_gib else "cache capacity (blocks)")
    for axis in (top, bottom):
        _budget_axis(axis, by_gib, xs, rec.get("gib") if by_gib else None)
        axis.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0),
                    borderaxespad=0)
    model = result.get("model") or {}
    title = ", ".join(result["trace"]["sources"])
    fig.suptitle(f"{title}\n{model.get('label', '')} - block {result['blockSize']} tokens",
                 fontsize=10)
    fig.tight_layout()
    return fig


def _ssd_label(result: dict) -> str:
    tier = result["tiered"]
    size = size_label(tier["ssdGib"]) if tier.get("ssdGib") else f"{tier['ssdBlocks']:,}-block"
    return (f"over a {size} SSD,\n{tier['mode']}, promotion "
            f"{'on' if tier['promotion'] else 'off'}")


def tier_figure(result: dict):
    """For tiered runs: hits by tier against the DRAM budget over the stated SSD, and the
    modelled TTFT (axis from 0)."""
    plt = pyplot()
    points = [p for p in result["points"] if p["mode"] == "fixed_window"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.6))
    xs = [_x(p) for p in points]
    by_gib = bool(points) and points[0]["gib"] is not None
    tiers = [p["results"]["tiered"] for p in points]
    total = [t["totalTokens"] or 1 for t in tiers]
    dram = [t["dramHitTokens"] / n * 100 for t, n in zip(tiers, total, strict=True)]
    ssd = [t["ssdHitTokens"] / n * 100 for t, n in zip(tiers, total, strict=True)]
    left.stackplot(xs, dram, ssd, labels=["hits from DRAM", "hits from the SSD"],
                   colors=["#1f77b4", "#ff7f0e"], alpha=0.8)
    if "lru" in result["policies"]:
        left.plot(xs, [p["results"]["lru"]["hitRate"] * 100 for p in points], color="black",
                  lw=1.2, ls="--", marker="o", ms=3, label="DRAM-only LRU (no SSD)")
    left.set_ylabel("% of measured tokens")
    left.set_ylim(0, 100)
    left.set_xlabel("DRAM budget")
    left.set_title("hits by tier", fontsize=9)
    left.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=3,
                frameon=False)
    if tiers and "ttft" in tiers[0]:
        right.plot(xs, [t["ttft"]["meanSeconds"] for t in tiers], marker="o", ms=4,
                   color=_COLOURS["tiered"], label="DRAM + SSD (modelled)")
        right.axhline(tiers[0]["ttft"]["noCacheSeconds"], ls="--", color="black", lw=1,
                      label="no cache")
        right.set_ylim(bottom=0)
        right.set_ylabel("modelled prefill time per request (s)")
        m = result["tiered"]["ttftModel"]
        right.set_title(f"TTFT model: prefill {m['prefillTokensPerSecond']:,.0f} tokens/s, "
                        f"DRAM {m['dramGBps']:g} GB/s, SSD {m['ssdGBps']:g} GB/s", fontsize=9)
        right.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2,
                     frameon=False)
    right.set_xlabel("DRAM budget")
    for axis in (left, right):
        _budget_axis(axis, by_gib, xs)
    fig.suptitle(f"{', '.join(result['trace']['sources'])}: DRAM "
                 f"{_ssd_label(result).replace(chr(10), ' ')}", fontsize=10)
    fig.tight_layout()
    return fig


def plan_heatmap(result: dict, metric: str = "speedup"):
    """The DRAM x SSD plan as a heatmap of the modelled TTFT speedup (``metric``
    "speedup") or the modelled TTFT in seconds ("ttft"), every cell annotated, the
    recommended one outlined with its value and cost."""
    plt = pyplot()
    drams, ssds = result["dramGib"], result["ssdGib"]
    by_cell = {(c["dramGib"], c["ssdGib"]): c for c in result["cells"]}
    key = "ttftSpeedup" if metric == "speedup" else "ttftSeconds"
    grid = np.array([[by_cell[(d, s)][key] for s in ssds] for d in drams])
    fig, axis = plt.subplots(figsize=(1.15 * len(ssds) + 3.2, 0.62 * len(drams) + 2.4))
    cmap = "viridis" if metric == "speedup" else "viridis_r"
    image = axis.imshow(grid, cmap=cmap, aspect="auto", origin="lower")
    bar = fig.colorbar(image, ax=axis, pad=0.02)
    bar.set_label("modelled TTFT speedup (x)" if metric == "speedup"
                  else "modelled prefill time per request (s)")
    low, high = float(grid.min()), float(grid.max())
    for i in range(len(drams)):
        for j in range(len(ssds)):
            value = grid[i, j]
            light = (value - low) / (high - low or 1) < 0.6
            if metric != "speedup":
                light = not light
            axis.text(j, i, f"{value:.2f}{'x' if metric == 'speedup' else ' s'}",
                      ha="center", va="center", fontsize=8,
                      color="white" if light else "black")
    rec = result["recommended"]
    i, j = drams.index(rec["dramGib"]), ssds.index(rec["ssdGib"])
    axis.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, ec="#d62728", lw=2.5))
    chosen = by_cell[(rec["dramGib"], rec["ssdGib"])]
    value = (f"{chosen['ttftSpeedup']:.2f}x" if metric == "speedup"
             else f"{chosen['ttftSeconds']:.2f} s")
    axis.set_xticks(range(len(ssds)), [size_label(s) if s else "none" for s in ssds],
                    rotation=30, ha="right")
    axis.set_yticks(range(len(drams)), [size_label(d) for d in drams])
    axis.set_xlabel("SSD tier")
    axis.set_ylabel("DRAM tier")
    model = (result.get("model") or {}).get("label", "")
    axis.set_title(f"{', '.join(result['trace']['sources'])} - {model}\n"
                   f"recommended (red box): {size_label(rec['dramGib'])} DRAM + "
                   f"{size_label(rec['ssdGib']) if rec['ssdGib'] else 'no'} SSD, {value}, "
                   f"${rec['cost']:,.0f}", fontsize=9)
    fig.tight_layout()
    return fig


def _budget_axis(axis, by_gib: bool, xs: list[float] | None = None,
                 marked: float | None = None) -> None:
    """A log2 budget axis labelled as people write sizes (512 GiB, 2 TiB), with a tick at
    every simulated budget (thinned to at most ~8 labels) and always one at ``marked``."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    positive = sorted({x for x in (xs or []) if x > 0})
    if positive:
        axis.set_xscale("log", base=2)
    axis.grid(True, which="major", alpha=0.3)
    if not positive:
        return
    step = max(1, -(-len(positive) // 8))
    ticks = positive[::step]
    if marked is not None and marked > 0 and marked not in ticks:
        ticks = sorted({*ticks, marked})
    axis.xaxis.set_major_locator(FixedLocator(ticks))
    axis.xaxis.set_minor_locator(NullLocator())
    if by_gib:
        axis.xaxis.set_major_formatter(FuncFormatter(lambda x, _: size_label(x)))
    else:
        axis.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:,.0f}"))
    for label in axis.get_xticklabels():
        label.set_fontsize(8)


def save(fig, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    pyplot().close(fig)


def png_bytes(fig) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    pyplot().close(fig)
    return buffer.getvalue()
