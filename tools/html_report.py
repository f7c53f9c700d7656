"""The self-contained HTML reports of ``kvstore sim`` and ``kvstore sim plan``: inputs,
plots (embedded PNG), results, recommendation.

One file with no external reference, so it can be mailed or attached to a ticket.
"""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path

from kvstored.sdk.units import format_size
from kvstored.tools import plots
from kvstored.tools.planning import size_label
from kvstored.tools.report_table import budget_label, gain_column

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 70em; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 1.6em; }
h3 { font-size: 1.05em; }
table { border-collapse: collapse; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }
th { background: #f3f3f3; } td.l, th.l { text-align: left; }
tr.ceiling td { color: #777; font-style: italic; }
tr.chosen td { background: #eef6ee; font-weight: bold; }
.rec { background: #eef6ee; border-left: 4px solid #2ca02c; padding: 0.6em 1em; }
img { max-width: 100%; } code { background: #f3f3f3; padding: 0 0.2em; }
"""


def _img(fig) -> str:
    data = base64.b64encode(plots.png_bytes(fig)).decode()
    return f'<img alt="plot" src="data:image/png;base64,{data}">'


def _pct(value) -> str:
    return "-" if value is None else f"{value * 100:.2f}%"


def _inputs(result: dict) -> str:
    trace = result["trace"]
    model = result["model"] or {}
    rows = [
        ("Trace", ", ".join(trace["sources"]) + f" ({trace['format']})"),
        ("Requests / block events", f"{trace['requests']:,} / {trace['blockEvents']:,}"),
        ("Unique prefix blocks", f"{trace['uniqueBlocks']:,}"),
        ("Block size", f"{result['blockSize']} tokens"),
        ("Time span", f"{trace['timeSpanSeconds'] / 3600:.2f} h"),
        ("Model", model.get("label", "-") + (f" ({model['precision']})"
                                              if model.get("precision") else "")),
        ("KV bytes per token", f"{result['bytesPerToken']:,.0f}"
         if result["bytesPerToken"] else "-"),
        ("Warm-up", f"first {result['warmupRequests']:,} requests "
                    f"({result['warmupFraction']:g}) are not measured"),
        ("Policies", ", ".join(result["policies"])),
        ("Ceiling (infinite cache)", f"{_pct(result['reuseCeiling'])}, "
                                     f"{result['ceiling']['idealSpeedup']:.2f}x"),
    ]
    if result.get("tiered"):
        t = result["tiered"]
        m = t["ttftModel"]
        ssd = size_label(t["ssdGib"]) if t["ssdGib"] else f"{t['ssdBlocks']} blocks"
        rows.append(("Tiered", f"DRAM = budget over SSD {ssd}, {t['mode']}, promotion "
                               f"{'on' if t['promotion'] else 'off'}"))
        rows.append(("TTFT model", f"prefill {m['prefillTokensPerSecond']:,.0f} tokens/s, "
                                   f"DRAM {m['dramGBps']:g} GB/s, SSD {m['ssdGBps']:g} GB/s"))
    body = "".join(f'<tr><th class="l">{html.escape(k)}</th><td class="l">{html.escape(v)}'
                   "</td></tr>" for k, v in rows)
    return f"<table>{body}</table>"


def _results(result: dict) -> str:
    policies = result["policies"]
    head = ["Budget", "Blocks", *[f"{p} hit" for p in policies],
            *[f"{p} speedup" for p in policies]]
    tier = bool(result.get("tiered"))
    if tier:
        head += ["DRAM share of hits", "two-point estimate", "TTFT speedup"]
    gains = gain_column(result)
    rec = result["recommended"]
    if gains:
        what = "TTFT speedup" if rec.get("metric") == "ttftSpeedup" else "speedup"
        head.append(f"{rec['policy']} {what} gain per extra TiB")
    rows = []
    for k, point in enumerate(result["points"]):
        cells = [budget_label(point), f"{point['cacheBlocks']:,}"]
        cells += [_pct(point["results"][p]["hitRate"]) for p in policies]
        cells += [f"{point['results'][p]['idealSpeedup']:.2f}x" for p in policies]
        if tier:
            t = point["results"]["tiered"]
            speed = (t.get("ttft") or {}).get("speedup")
            cells += [_pct(t.get("dramShareOfHits")), _pct(t.get("twoPointDramShare")),
                      f"{speed:.2f}x" if speed else "-"]
        if gains:
            cells.append("-" if gains[k] is None else f"{gains[k]:+.2f}x")
        css = ' class="ceiling"' if point["mode"] == "ceiling_no_pressure" else ""
        if point["gib"] == rec.get("gib"):
            css = ' class="chosen"'

        rows.append(f"<tr{css}>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells)
                    + "</tr>")
    header = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    return f"<table><tr>{header}</tr>{''.join(rows)}</table>"


def write(result: dict, path: Path) -> None:
    rec = result["recommended"]
    if rec.get("gib") is not None:
        reason = rec["reason"][:1].upper() + rec["reason"][1:]
        kind = "modelled TTFT speedup" if rec.get("metric") == "ttftSpeedup" \
            else "ideal prefill speedup"
        recommendation = (f"<p class=rec><b>Recommended budget ({html.escape(rec['policy'])}): "
                          f"{size_label(rec['gib'])}</b>, {rec['speedup']:.2f}x {kind}. "
                          f"{html.escape(reason)}.</p>")
    else:
        recommendation = f"<p class=rec>{html.escape(rec['reason'])}</p>"
    sections = [
        f"<h1>KV-cache capacity plan: {html.escape(', '.join(result['trace']['sources']))}</h1>",
        recommendation,
        "<h2>Inputs</h2>", _inputs(result),
        "<h2>Hit rate and ideal prefill speedup</h2>", _img(plots.sim_figure(result)),
    ]
    if result.get("tiered") and any(p["mode"] == "fixed_window" for p in result["points"]):
        sections += ["<h2>DRAM + SSD</h2>",
                     "<p>Hits by tier as simulated, next to the two-point estimate (DRAM-only "
                     "LRU hits divided by the hits of one LRU cache of DRAM + SSD size).</p>",
                     _img(plots.tier_figure(result))]
    sections += [
        "<h2>Results</h2>",
        "<p>Hit rate: prefix-hit tokens over all tokens of the measured requests. Ideal "
        "speedup: <code>1 / (1 - hit rate)</code>, capped at 1000x. Rows in grey are budgets "
        "whose cache never filled during the warm-up: the ceiling, where the curve ends.</p>",
        _results(result),
        "<h2>Raw result</h2>",
        f"<details><summary>JSON</summary><pre>{html.escape(json.dumps(result, indent=1))}"
        "</pre></details>",
    ]
    _save(path, "kvstore sim report", sections)


def _save(path: Path, title: str, sections: list[str]) -> None:
    document = (f"<!doctype html><html><head><meta charset=utf-8><title>{html.escape(title)}"
                f"</title><style>{_STYLE}</style></head><body>{''.join(sections)}</body></html>")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(document, encoding="utf-8")


def _plan_inputs(result: dict) -> str:
    trace, model = result["trace"], result["model"] or {}
    m, costs = result["ttftModel"], result["costs"]
    rows = [
        ("Trace", ", ".join(trace["sources"]) + f" ({trace['format']})"),
        ("Requests / unique prefix blocks", f"{trace['requests']:,} / "
                                            f"{trace['uniqueBlocks']:,}"),
        ("Block size", f"{result['blockSize']} tokens"),
        ("Model", model.get("label", "-") + (f" ({model['precision']})"
                                              if model.get("precision") else "")),
        ("KV bytes per token / block", f"{result['bytesPerToken']:,.0f} / "
                                       f"{format_size(result['bytesPerBlock'])}"),
        ("Whole trace", format_size(trace["uniqueBlocks"] * result["bytesPerBlock"])),
        ("Warm-up", f"first {result['warmupRequests']:,} requests "
                    f"({result['warmupFraction']:g}) are not measured"),
        ("Tiers", f"DRAM over SSD, {result['tierMode']}, promotion "
                  f"{'on' if result['promotion'] else 'off'}"),
        ("TTFT model", f"prefill {m['prefillTokensPerSecond']:,.0f} tokens/s, DRAM "
                       f"{m['dramGBps']:g} GB/s, SSD {m['ssdGBps']:g} GB/s"),
        ("Cost", f"${costs['dramPerGib']:g} per GiB of DRAM, ${costs['ssdPerGib']:g} per "
                 "GiB of SSD"),
        ("Ceiling (infinite DRAM)", f"{_pct(result['reuseCeiling'])} hit rate, "
                                    f"{result['ceilingTtft']['speedup']:.2f}x TTFT speedup"),
    ]
    body = "".join(f'<tr><th class="l">{html.escape(k)}</th><td class="l">{html.escape(v)}'
                   "</td></tr>" for k, v in rows)
    return f"<table>{body}</table>"


def _plan_cells(result: dict) -> str:
    rec = result["recommended"]
    head = ["DRAM", "SSD", "hit rate", "from DRAM", "from SSD", "DRAM share of hits",
            "ideal speedup", "TTFT per request", "TTFT speedup", "cost"]
    rows = []
    for c in result["cells"]:
        cells = [size_label(c["dramGib"]), size_label(c["ssdGib"]) if c["ssdGib"] else "none",
                 _pct(c["hitRate"]), _pct(c["dramHitRate"]), _pct(c["ssdHitRate"]),
                 _pct(c["dramShareOfHits"]), f"{c['idealSpeedup']:.2f}x",
                 f"{c['ttftSeconds']:.3f} s", f"{c['ttftSpeedup']:.2f}x", f"${c['cost']:,.0f}"]
        chosen = (c["dramGib"], c["ssdGib"]) == (rec["dramGib"], rec["ssdGib"])
        css = ' class="chosen"' if chosen else ""
        rows.append(f"<tr{css}>" + "".join(f"<td>{html.escape(x)}</td>" for x in cells)
                    + "</tr>")
    header = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    return f"<table><tr>{header}</tr>{''.join(rows)}</table>"


def plan_section(result: dict) -> list[str]:
    """The plan's part of a report: the recommendation, both heatmaps, every cell."""
    rec = result["recommended"]
    return [
        "<h2>DRAM x SSD plan</h2>",
        f"<p class=rec><b>Recommended</b>: {html.escape(rec['reason'])}</p>",
        "<p>Each cell replays the trace on that DRAM tier over that SSD tier (the "
        "<code>tiered</code> policy). TTFT speedup: the modelled prefill time with no cache "
        "over the modelled time with the cache (missed tokens recomputed, hit tokens loaded "
        "from the tier that holds them). The red box is the recommendation.</p>",
        _img(plots.plan_heatmap(result, "speedup")),
        _img(plots.plan_heatmap(result, "ttft")),
        "<h3>Every cell</h3>", _plan_cells(result),
    ]


def write_plan(result: dict, path: Path) -> None:
    sections = [
        f"<h1>DRAM + SSD plan: {html.escape(', '.join(result['trace']['sources']))}</h1>",
        "<h2>Inputs</h2>", _plan_inputs(result), *plan_section(result),
        "<h2>Raw result</h2>",
        f"<details><summary>JSON</summary><pre>{html.escape(json.dumps(result, indent=1))}"
        "</pre></details>",
    ]
    _save(path, "kvstore sim plan report", sections)
