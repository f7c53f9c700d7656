"""The replay's results as rich tables for the terminal, laid out to fit 80 columns
(identifiers are never cut: long ones go on lines of their own)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from kvstored.sdk.units import format_size

#: A difference that the tables point out (the issue's bound for the store).
PARTS_PP = 2.0


def _pct(value: float) -> str:
    return f"{value * 100:.1f}%"


def _pp(value: float) -> str:
    return f"{value:+.1f} pp"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e3:.2f} ms"


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}"


def render_replay(console: Console, doc: dict[str, Any], *, windows: bool = True) -> None:
    m, p, d = doc["measured"], doc["predicted"], doc["difference_pp_by_tier"]
    caps = doc["store"]["capacities"]
    console.print(f"[bold]Replay of {', '.join(doc['trace']['sources'])}[/]")
    console.print(f"{doc['requests']:,} requests in {doc['wall_seconds']:.1f} s; blocks of "
                  f"{doc['trace']['blockSize']} tokens, {format_size(doc['block_bytes'])} "
                  f"each; {doc['concurrency']} at a time, "
                  + ("as fast as possible" if doc["speed"] is None
                     else f"{doc['speed']:g}x the trace's pace"))
    console.print(f"store: DRAM {format_size(caps['dram_bytes'])} = {caps['dram_blocks']:,} "
                  f"blocks, SSD {format_size(caps['ssd_bytes'])} = {caps['ssd_blocks']:,} "
                  "blocks in the model")
    summary = Table(title="token hit rate", title_justify="left")
    for name in ("tier", "measured", "predicted", "difference"):
        summary.add_column(name, justify="left" if name == "tier" else "right")
    summary.add_row("DRAM", _pct(m["dram_hit_rate"]), _pct(p["dram_hit_rate"]), _pp(d["dram"]))
    summary.add_row("SSD", _pct(m["ssd_hit_rate"]), _pct(p["ssd_hit_rate"]), _pp(d["ssd"]))
    summary.add_row("[bold]DRAM + SSD[/]", f"[bold]{_pct(m['hit_rate'])}[/]",
                    f"[bold]{_pct(p['hit_rate'])}[/]", f"[bold]{_pp(doc['difference_pp'])}[/]")
    summary.add_row("miss", _pct(m["miss_rate"]), _pct(p["miss_rate"]), "")
    console.print(summary)
    lat = doc["latency_seconds"]
    timing = Table(title="latency per request", title_justify="left")
    for name in ("operation", "p50", "p99", "requests"):
        timing.add_column(name, justify="left" if name == "operation" else "right")
    for name in ("prefix_hits", "get", "put"):
        timing.add_row(name, _ms(lat[name]["p50"]), _ms(lat[name]["p99"]),
                       f"{lat[name]['count']:,}")
    console.print(timing)
    moved = doc["bytes"]
    console.print(f"moved: {format_size(moved['read'])} read, "
                  f"{format_size(moved['written'])} written")
    if windows and doc["windows"]:
        per = Table(title=f"per {doc['window_seconds']:g} s of trace time "
                          "(measured / predicted)", title_justify="left")
        for name in ("from", "requests", "DRAM", "SSD", "DRAM + SSD", "diff"):
            per.add_column(name, justify="right")
        for w in doc["windows"]:
            wm, wp = w["measured"], w["predicted"]
            per.add_row(_clock(w["start"]), f"{w['requests']:,}",
                        f"{_pct(wm['dram_hit_rate'])} / {_pct(wp['dram_hit_rate'])}",
                        f"{_pct(wm['ssd_hit_rate'])} / {_pct(wp['ssd_hit_rate'])}",
                        f"{_pct(wm['hit_rate'])} / {_pct(wp['hit_rate'])}",
                        _pp(w["difference_pp"]))
        console.print(per)
    for note in caps["notes"] + doc.get("notes", []):
        console.print(f"[dim]note: {note}[/]")
    if max(abs(doc["difference_pp"]), *map(abs, d.values())) > PARTS_PP:
        console.print(f"[yellow]measured and predicted part by more than {PARTS_PP:g} "
                      "points: docs/replay.md (\"Where the store and the model part\") "
                      "says where and why[/]")
    if doc["wrong_bytes"]:
        console.print(f"[red bold]{doc['wrong_bytes']:,} wrong bytes in "
                      f"{doc['wrong_blocks']:,} blocks[/]")
        for example in doc["wrong_examples"]:
            console.print(f"[red]  {example['key']}: {example['wrong_bytes']:,} bytes[/]")
    else:
        console.print("every byte read matched its block's value")


def render_multiturn(console: Console, doc: dict[str, Any]) -> None:
    spec = doc["spec"]
    console.print(f"[bold]Multi-round: {spec['clients']} clients x {spec['rounds']} rounds "
                  f"of about {spec['context_tokens']:,} tokens[/]")
    console.print(f"DRAM {format_size(doc['dram_bytes'])} in both runs, SSD "
                  f"{format_size(doc['ssd_bytes'])} in the second; blocks of "
                  f"{spec['block_tokens']} tokens, {format_size(doc['block_bytes'])}")
    table = Table(title="token hit rate and estimated TTFT per round", title_justify="left")
    for name in ("round", "DRAM only", "TTFT", "DRAM + SSD", "of it SSD", "TTFT"):
        table.add_column(name, justify="right")
    for r in doc["rounds"]:
        mark = " <" if r["round"] == doc.get("overflow_round") else ""
        table.add_row(f"{r['round']}{mark}", _pct(r["dram_only"]["hit_rate"]),
                      f"{r['dram_only']['ttft_s']:.2f} s", _pct(r["dram_ssd"]["hit_rate"]),
                      _pct(r["dram_ssd"]["ssd_hit_rate"]), f"{r['dram_ssd']['ttft_s']:.2f} s")
    console.print(table)
    if doc.get("overflow_round"):
        console.print(f"[dim]< DRAM is sized to overflow in round {doc['overflow_round']}; "
                      f"TTFT: missed tokens at {doc['prefill_tokens_per_s']:,.0f} tokens/s "
                      "plus the measured load of the hit blocks[/]")
    if doc["wrong_bytes"]:
        console.print(f"[red bold]{doc['wrong_bytes']:,} wrong bytes[/]")
