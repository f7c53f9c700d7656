"""PNG plots of a simulation and of trace statistics (matplotlib, headless)."""

from __future__ import annotations

import io
from pathlib import Path

from kvstored.tools.errors import UnavailableError


def _pyplot():
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


def _x(point: dict) -> float:
    return point["gib"] if point["gib"] is not None else point["cacheBlocks"]


def sim_figure(result: dict):
    """Hit rate and ideal speedup against budget, with the ceiling as a dashed line."""
    plt = _pyplot()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 7.5), sharex=True)
    points = result["points"]
    by_gib = bool(points) and points[0]["gib"] is not None
    for policy in result["policies"]:
        xs = [_x(p) for p in points]
        top.plot(xs, [p["results"][policy]["hitRate"] * 100 for p in points], marker="o",
                 ms=3, label=policy, color=_COLOURS.get(policy))
        bottom.plot(xs, [p["results"][policy]["idealSpeedup"] for p in points], marker="o",
                    ms=3, label=policy, color=_COLOURS.get(policy))
    ceiling = result["ceiling"]
    top.axhline(ceiling["hitRate"] * 100, ls="--", color="black", lw=1,
                label=f"ceiling {ceiling['hitRate'] * 100:.1f}%")
    bottom.axhline(ceiling["idealSpeedup"], ls="--", color="black", lw=1,
                   label=f"ceiling {ceiling['idealSpeedup']:.2f}x")
    rec = result.get("recommended") or {}
    if rec.get("gib") is not None and by_gib:
        for axis in (top, bottom):
            axis.axvline(rec["gib"], color="#d62728", lw=1, ls=":")
        bottom.annotate(f"recommended ({rec['policy']})", (rec["gib"], rec["idealSpeedup"]),
                        textcoords="offset points", xytext=(6, -14), color="#d62728",
                        fontsize=8)
    top.set_ylabel("hit rate (% of measured tokens)")
    bottom.set_ylabel("ideal prefill speedup (x)")
    bottom.set_xlabel("cache budget" if by_gib else "cache capacity (blocks)")
    for axis in (top, bottom):
        _budget_axis(axis, by_gib)
        axis.legend(fontsize=8, loc="upper left")
    model = result.get("model") or {}
    title = ", ".join(result["trace"]["sources"])
    fig.suptitle(f"{title}\n{model.get('label', '')} - block {result['blockSize']} tokens",
                 fontsize=10)
    fig.tight_layout()
    return fig


def tier_figure(result: dict):
    """For tiered runs: hits by tier against the DRAM budget, and the modelled TTFT."""
    plt = _pyplot()
    points = [p for p in result["points"] if p["mode"] == "fixed_window"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    xs = [_x(p) for p in points]
    tiers = [p["results"]["tiered"] for p in points]
    total = [t["totalTokens"] or 1 for t in tiers]
    dram = [t["dramHitTokens"] / n * 100 for t, n in zip(tiers, total)]
    ssd = [t["ssdHitTokens"] / n * 100 for t, n in zip(tiers, total)]
    left.stackplot(xs, dram, ssd, labels=["DRAM hits", "SSD hits"],
                   colors=["#1f77b4", "#ff7f0e"], alpha=0.8)
    if "lru" in result["policies"]:
        left.plot(xs, [p["results"]["lru"]["hitRate"] * 100 for p in points], color="black",
                  lw=1, ls="--", label="DRAM-only LRU")
    left.set_ylabel("% of measured tokens")
    left.set_xlabel("DRAM budget")
    left.legend(fontsize=8, loc="upper left")
    if tiers and "ttft" in tiers[0]:
        right.plot(xs, [t["ttft"]["meanSeconds"] for t in tiers], marker="o", ms=3,
                   label="tiered")
        right.axhline(tiers[0]["ttft"]["noCacheSeconds"], ls="--", color="black", lw=1,
                      label="no cache")
        right.set_ylabel("modelled prefill time per request (s)")
        right.legend(fontsize=8)
    right.set_xlabel("DRAM budget")
    for axis in (left, right):
        _budget_axis(axis, True)
    fig.tight_layout()
    return fig


def plan_heatmap(result: dict, metric: str = "speedup"):
    """The DRAM x SSD plan as a heatmap of the modelled TTFT speedup (``metric``
    "speedup") or the modelled TTFT in seconds ("ttft"), every cell annotated, the
    recommended one outlined with its value and cost."""
    import numpy as np
    from kvstored.tools.planning import size_label

    plt = _pyplot()
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


def _budget_axis(axis, by_gib: bool) -> None:
    """A log2 budget axis labelled as people write sizes (512 GiB, 2 TiB)."""
    from kvstored.tools.planning import size_label
    from matplotlib.ticker import FuncFormatter

    axis.set_xscale("log", base=2)
    axis.grid(True, which="both", alpha=0.3)
    if by_gib:
        axis.xaxis.set_major_formatter(FuncFormatter(lambda x, _: size_label(x)))


def save(fig, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    _pyplot().close(fig)


def png_bytes(fig) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    _pyplot().close(fig)
    return buffer.getvalue()
