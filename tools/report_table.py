"""The terminal reports: a simulation's table (``render``) and a DRAM x SSD plan's grid
(``render_plan``), each with a few lines around it."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from kvstored.sdk.units import format_size
from kvstored.tools.planning import marginal_gains, size_label
from kvstored.tools.simulate import point_speedup


def budget_label(point: dict) -> str:
    if point["gib"] is None:
        return f"{point['cacheBlocks']:,} blocks"
    return size_label(point["gib"])


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.2f}%"


def bad_lines_note(trace: dict) -> str | None:
    """One line on what --skip-bad-lines left out, or None."""
    bad = trace.get("badLines")
    if not bad or not bad["skipped"]:
        return None
    return f"Skipped {bad['skipped']:,} bad line(s) (--skip-bad-lines); first: " \
           f"{bad['examples'][0]}"


def gain_column(result: dict) -> list[float | None] | None:
    """The marginal gain of the recommended policy at each point (speedup per extra
    TiB from the previous budget), or None when budgets are in blocks."""
    policy = result["recommended"].get("policy")
    points = result["points"]
    if not policy or not points or any(p["gib"] is None for p in points):
        return None
    return marginal_gains([(p["gib"], point_speedup(result, p, policy)) for p in points])


def render(result: dict, console: Console) -> None:
    trace = result["trace"]
    model = result["model"]
    note = bad_lines_note(trace)
    if note:
        console.print(f"[yellow]{note}[/]", markup=True, highlight=False)
    console.print(f"[bold]Trace[/]: {', '.join(trace['sources'])} ({trace['format']}): "
                  f"{trace['requests']:,} requests, {trace['blockEvents']:,} block events, "
                  f"{trace['uniqueBlocks']:,} unique prefix blocks of {result['blockSize']} "
                  "tokens")
    if model:
        per_block = result["bytesPerBlock"]
        console.print(f"[bold]Model[/]: {model['label']}"
                      + (f" at {model['precision']}" if model.get("precision") else "")
                      + (f" (indexer {model['indexerPrecision']})"
                         if model.get("indexerPrecision") else "")
                      + (" with draft KV" if model.get("includeDraftKv") else "")
                      + (f", sized at {model['estimateTokens']:,} tokens"
                         if model.get("tokenDependent") else "")
                      + f": {result['bytesPerToken']:,.0f} bytes/token, "
                        f"{format_size(per_block)} per block")
    console.print(f"[bold]Measured[/]: requests {result['warmupRequests']:,} onwards "
                  f"(warm-up {result['warmupFraction']:g}); ceiling "
                  f"{_pct(result['reuseCeiling'])} "
                  f"({result['ceiling']['idealSpeedup']:.2f}x ideal prefill speedup)")
    tier = result.get("tiered")
    if tier:
        ssd = size_label(tier["ssdGib"]) if tier["ssdGib"] else \
            f"{tier['ssdBlocks']:,} blocks"
        model_line = tier["ttftModel"]
        console.print(f"[bold]Tiered[/]: DRAM = the budget, SSD {ssd}, {tier['mode']}, "
                      f"promotion {'on' if tier['promotion'] else 'off'}; TTFT model: prefill "
                      f"{model_line['prefillTokensPerSecond']:,.0f} tokens/s, DRAM "
                      f"{model_line['dramGBps']:g} GB/s, SSD {model_line['ssdGBps']:g} GB/s")
    policies = result["policies"]
    rec = result["recommended"]
    gains = gain_column(result)
    table = Table(show_lines=False, header_style="bold")
    table.add_column("Budget", justify="right", no_wrap=True)
    table.add_column("Blocks", justify="right", no_wrap=True)
    for policy in policies:
        table.add_column(f"{policy}\nhit   speedup", justify="right", no_wrap=True)
    if tier:
        for name in ("DRAM share\nof hits", "2-point\nestimate", "TTFT\nspeedup"):
            table.add_column(name, justify="right", no_wrap=True)
    what = "TTFT" if rec.get("metric") == "ttftSpeedup" else "speedup"
    if gains:
        table.add_column(f"{rec['policy']} {what}\ngain/TiB", justify="right", no_wrap=True)
    for k, point in enumerate(result["points"]):
        cells = [budget_label(point), f"{point['cacheBlocks']:,}"]
        ceiling = point["mode"] == "ceiling_no_pressure"
        for policy in policies:
            r = point["results"][policy]
            cells.append(f"{_pct(r['hitRate'])}{'*' if ceiling else ' '} "
                         f"{r['idealSpeedup']:6.2f}x")
        if tier:
            t = point["results"]["tiered"]
            ttft = t.get("ttft") or {}
            cells += [_pct(t.get("dramShareOfHits")), _pct(t.get("twoPointDramShare")),
                      f"{ttft['speedup']:.2f}x" if ttft.get("speedup") else "-"]
        if gains:
            cells.append("-" if gains[k] is None else f"{gains[k]:+.2f}x")
        table.add_row(*cells, style="bold" if point["gib"] == rec.get("gib") else None)
    if result["points"]:
        console.print(table)
    else:
        console.print("No budget below the trace's unique blocks: every budget holds the "
                      "whole trace (the ceiling).")
    if any(p["mode"] == "ceiling_no_pressure" for p in result["points"]):
        console.print("* the cache never filled during the warm-up: the point is the "
                      "ceiling and the curve ends there")
    kind = "modelled TTFT speedup" if what == "TTFT" else "ideal speedup"
    if gains:
        console.print(f"gain/TiB: {rec['policy']}'s {kind} added per extra TiB from the "
                      "budget above; bold: the recommended budget")
    if rec.get("gib") is not None:
        console.print(f"[bold]Recommended[/] ({rec['policy']}, by {kind}): "
                      f"{size_label(rec['gib'])}, {rec['speedup']:.2f}x - {rec['reason']}")


def render_plan(result: dict, console: Console) -> None:
    """The DRAM x SSD plan: a grid of modelled TTFT speedups with each cell's cost, the
    recommended cell in bold, then the recommendation in words."""
    trace, model = result["trace"], result["model"] or {}
    console.print(f"[bold]Trace[/]: {', '.join(trace['sources'])} ({trace['format']}): "
                  f"{trace['requests']:,} requests, {trace['uniqueBlocks']:,} unique prefix "
                  f"blocks of {result['blockSize']} tokens "
                  f"({format_size(trace['uniqueBlocks'] * result['bytesPerBlock'])} for "
                  f"{model.get('label', 'the given bytes per token')})")
    m, costs = result["ttftModel"], result["costs"]
    console.print(f"[bold]Tiers[/]: DRAM over SSD, {result['tierMode']}, promotion "
                  f"{'on' if result['promotion'] else 'off'}; TTFT model: prefill "
                  f"{m['prefillTokensPerSecond']:,.0f} tokens/s, DRAM {m['dramGBps']:g} GB/s,"
                  f" SSD {m['ssdGBps']:g} GB/s; cost ${costs['dramPerGib']:g}/GiB DRAM, "
                  f"${costs['ssdPerGib']:g}/GiB SSD")
    console.print(f"[bold]Ceiling[/]: {_pct(result['reuseCeiling'])} hit rate, "
                  f"{result['ceilingTtft']['speedup']:.2f}x modelled TTFT speedup with an "
                  "infinite DRAM")
    rec = result["recommended"]
    table = Table(header_style="bold", title="modelled TTFT speedup (hit rate, cost)",
                  show_lines=True)
    table.add_column("DRAM \\ SSD", justify="right", no_wrap=True)
    for ssd in result["ssdGib"]:
        table.add_column(size_label(ssd) if ssd else "none", justify="right", no_wrap=True)
    by_cell = {(c["dramGib"], c["ssdGib"]): c for c in result["cells"]}
    for dram in result["dramGib"]:
        row = [size_label(dram)]
        for ssd in result["ssdGib"]:
            c = by_cell[(dram, ssd)]
            text = f"{c['ttftSpeedup']:.2f}x\n{c['hitRate'] * 100:.1f}% ${c['cost']:,.0f}"
            if (dram, ssd) == (rec["dramGib"], rec["ssdGib"]):
                text = f"[bold reverse]{text}[/]"
            row.append(text)
        table.add_row(*row)
    console.print(table)
    console.print(f"[bold]Recommended[/]: {rec['reason']}", highlight=False)
