"""The HTML page of a replay and of the multi-round experiment: the tables and the plots
(embedded, so the file stands alone), and the raw JSON. ``make demo`` writes it beside
the PNGs; ``kvstore replay --html`` writes one for a run."""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path
from typing import Any

from kvstored.sdk.units import format_size

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 64em; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 1.6em; }
table { border-collapse: collapse; font-size: 0.9em; margin: 0.6em 0; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }
th { background: #f3f3f3; } td.l, th.l { text-align: left; }
img { max-width: 100%; } code { background: #f3f3f3; padding: 0 0.2em; }
.bad { color: #b00; font-weight: bold; }
"""


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f}%"


def _pp(value: float) -> str:
    return f"{value:+.1f} pp"


def _table(head: list[str], rows: list[list[str]]) -> str:
    top = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(
        f"<td{' class=l' if i == 0 else ''}>{html.escape(c)}</td>" for i, c in enumerate(row))
        + "</tr>" for row in rows)
    return f"<table><tr>{top}</tr>{body}</table>"


def _img(png: bytes, alt: str) -> str:
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,' \
           f'{base64.b64encode(png).decode()}">'


def replay_section(doc: dict[str, Any], png: bytes | None) -> str:
    m, p, d = doc["measured"], doc["predicted"], doc["difference_pp_by_tier"]
    caps = doc["store"]["capacities"]
    rows = [["DRAM", _pct(m["dram_hit_rate"]), _pct(p["dram_hit_rate"]), _pp(d["dram"])],
            ["SSD", _pct(m["ssd_hit_rate"]), _pct(p["ssd_hit_rate"]), _pp(d["ssd"])],
            ["DRAM + SSD", _pct(m["hit_rate"]), _pct(p["hit_rate"]),
             _pp(doc["difference_pp"])]]
    wrong = doc["wrong_bytes"]
    parts = [
        f"<h2>Replay of {html.escape(', '.join(doc['trace']['sources']))}</h2>",
        f"<p>{doc['requests']:,} requests, blocks of {doc['trace']['blockSize']} tokens and "
        f"{format_size(doc['block_bytes'])}, against a store of "
        f"{format_size(caps['dram_bytes'])} DRAM ({caps['dram_blocks']:,} blocks in the "
        f"model) and {format_size(caps['ssd_bytes'])} SSD ({caps['ssd_blocks']:,} blocks). "
        "Every block read was checked byte for byte: "
        + (f"<span class=bad>{wrong:,} wrong bytes</span>" if wrong else "no wrong byte")
        + ".</p>",
        _table(["token hit rate", "measured", "predicted", "difference"], rows),
    ]
    if png:
        parts.append(_img(png, "hit rate over time by tier"))
    lat = doc["latency_seconds"]
    parts.append(_table(["operation", "p50", "p99", "requests"], [
        [name, "-" if v["p50"] is None else f"{v['p50'] * 1e3:.2f} ms",
         "-" if v["p99"] is None else f"{v['p99'] * 1e3:.2f} ms", f"{v['count']:,}"]
        for name, v in (("prefix_hits", lat["prefix_hits"]), ("get", lat["get"]),
                        ("put", lat["put"]))]))
    return "".join(parts)


def multiturn_section(doc: dict[str, Any], png: bytes | None) -> str:
    spec = doc["spec"]
    rows = [[str(r["round"]), _pct(r["dram_only"]["hit_rate"]),
             f"{r['dram_only']['ttft_s']:.2f}", _pct(r["dram_ssd"]["hit_rate"]),
             _pct(r["dram_ssd"]["ssd_hit_rate"]), f"{r['dram_ssd']['ttft_s']:.2f}"]
            for r in doc["rounds"]]
    parts = [
        f"<h2>Multi-round: {spec['clients']} clients x {spec['rounds']} rounds</h2>",
        f"<p>Each round adds about {spec['context_tokens']:,} tokens to every conversation "
        f"(blocks of {spec['block_tokens']} tokens, {format_size(doc['block_bytes'])}). "
        f"Both stores have {format_size(doc['dram_bytes'])} of DRAM; the second also "
        f"{format_size(doc['ssd_bytes'])} of SSD. TTFT is estimated: missed tokens at "
        f"{doc['prefill_tokens_per_s']:,.0f} tokens/s plus the measured load of the hit "
        "blocks.</p>",
        _table(["round", "DRAM only: hit", "TTFT (s)", "DRAM+SSD: hit", "of it SSD",
                "TTFT (s)"], rows),
    ]
    if png:
        parts.append(_img(png, "multi-round hit rate and TTFT"))
    return "".join(parts)


def write(path: Path, title: str, sections: list[str], documents: dict[str, Any]) -> None:
    """One self-contained page: ``sections`` then each document's JSON, folded."""
    raw = "".join(f"<details><summary>{html.escape(name)} (JSON)</summary><pre>"
                  f"{html.escape(json.dumps(doc, indent=1))}</pre></details>"
                  for name, doc in documents.items())
    page = (f"<!doctype html><html><head><meta charset=utf-8><title>{html.escape(title)}"
            f"</title><style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>"
            f"{''.join(sections)}<h2>Raw results</h2>{raw}</body></html>")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page, encoding="utf-8")
