"""PNG plots of a replay (hit rate over time by tier, measured beside predicted) and of
the multi-round experiment (hit rate and estimated TTFT per round, DRAM only beside
DRAM+SSD). matplotlib, headless, through ``kvstored.tools.plots``."""

from __future__ import annotations

from typing import Any

from kvstored.tools import plots

DRAM_COLOUR = "#1f77b4"
SSD_COLOUR = "#ff7f0e"
TOTAL_COLOUR = "#333333"


def _time_axis(doc: dict[str, Any]) -> tuple[list[float], str]:
    """Window starts, and the end of the last window (so its step is drawn too)."""
    starts = [w["start"] for w in doc["windows"]]
    starts.append(starts[-1] + doc["window_seconds"] if starts else 0.0)
    span = starts[-1]
    if span >= 3 * 3600:
        return [s / 3600 for s in starts], "trace time (hours)"
    if span >= 180:
        return [s / 60 for s in starts], "trace time (minutes)"
    return starts, "trace time (seconds)"


def _steps(values: list[float]) -> list[float]:
    return values + values[-1:]


def replay_figure(doc: dict[str, Any]):
    """Token hit rate per window: measured DRAM and SSD stacked, the prediction's total
    and DRAM share as lines over them."""
    plt = plots.pyplot()
    fig, axis = plt.subplots(figsize=(9.0, 4.8))
    windows = doc["windows"]
    xs, label = _time_axis(doc)
    dram = _steps([w["measured"]["dram_hit_rate"] * 100 for w in windows])
    ssd = _steps([w["measured"]["ssd_hit_rate"] * 100 for w in windows])
    axis.stackplot(xs, dram, ssd, labels=["measured: DRAM", "measured: SSD"],
                   colors=[DRAM_COLOUR, SSD_COLOUR], alpha=0.55, step="post")
    axis.step(xs, _steps([w["predicted"]["hit_rate"] * 100 for w in windows]), where="post",
              color=TOTAL_COLOUR, lw=1.8, ls="--", label="predicted: DRAM + SSD")
    axis.step(xs, _steps([w["predicted"]["dram_hit_rate"] * 100 for w in windows]),
              where="post",
              color=DRAM_COLOUR, lw=1.8, ls=":", label="predicted: DRAM")
    axis.set_xlabel(label)
    axis.set_ylabel("token hit rate (%)")
    axis.set_ylim(0, 100)
    axis.grid(alpha=0.3)
    m, p = doc["measured"], doc["predicted"]
    axis.set_title(f"{', '.join(doc['trace']['sources'])}: measured {m['hit_rate']:.1%} "
                   f"(DRAM {m['dram_hit_rate']:.1%}), predicted {p['hit_rate']:.1%} "
                   f"(DRAM {p['dram_hit_rate']:.1%})", fontsize=10)
    axis.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    fig.tight_layout()
    return fig


def multiturn_figure(doc: dict[str, Any]):
    """Hit rate and estimated TTFT per round for both runs."""
    plt = plots.pyplot()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8.0, 6.4), sharex=True)
    rounds = [r["round"] for r in doc["rounds"]]
    styles = {"dram_only": dict(color="#d62728", marker="o", label="DRAM only"),
              "dram_ssd": dict(color="#2ca02c", marker="s", label="DRAM + SSD")}
    for run, style in styles.items():
        top.plot(rounds, [r[run]["hit_rate"] * 100 for r in doc["rounds"]], lw=2, **style)
        top.plot(rounds, [r[run]["predicted_hit_rate"] * 100 for r in doc["rounds"]],
                 lw=1, ls="--", color=style["color"], alpha=0.7)
        bottom.plot(rounds, [r[run]["ttft_s"] for r in doc["rounds"]], lw=2, **style)
    if doc.get("overflow_round"):
        for axis in (top, bottom):
            axis.axvline(doc["overflow_round"], color="#888888", lw=1, ls=":")
        top.annotate("DRAM overflows", (doc["overflow_round"], 3), fontsize=8,
                     color="#555555", xytext=(4, 0), textcoords="offset points")
    spec = doc["spec"]
    top.set_title(f"{spec['clients']} clients x {spec['rounds']} rounds of about "
                  f"{spec['context_tokens']} tokens (dashed: predicted)", fontsize=10)
    top.set_ylabel("token hit rate (%)")
    top.set_ylim(0, 100)
    bottom.set_ylabel("estimated TTFT (s)")
    bottom.set_xlabel("round")
    bottom.set_ylim(bottom=0)
    for axis in (top, bottom):
        axis.grid(alpha=0.3)
        axis.set_xticks(rounds)
    top.legend(loc="lower left", fontsize=8, frameon=False)
    fig.tight_layout()
    return fig

