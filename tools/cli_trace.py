"""``kvstore trace stats|convert``: describe a trace, or convert it to another format."""

from __future__ import annotations

import json
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from kvstored.progress import progress_bar
from kvstored.sdk.units import format_size
from kvstored.tools import reader, report_table, stats, workloads, writers
from kvstored.tools.cli_common import FORMAT_CHOICE, explains_memory_errors, write_file
from kvstored.tools.errors import UsageProblem


@click.group("trace", context_settings={"help_option_names": ["-h", "--help"]})
def trace() -> None:
    """Describe traces and convert them between formats."""


def _load(traces, fmt, block_size, skip_bad_lines=False, as_json=False):
    if not traces:
        raise UsageProblem("give a trace")
    with progress_bar(enabled=not as_json) as progress:
        if progress:
            progress(0, 1, "reading the trace")
        loaded = reader.load(list(traces), fmt, block_size, skip_bad_lines=skip_bad_lines,
                             progress=progress)
    note = report_table.bad_lines_note(loaded.summary())
    if note:
        click.echo(note, err=True)
    return loaded


def _duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.2f} h"
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.1f} s"


def _gap_rows(prefix: str, gaps: dict) -> list[tuple[str, str]]:
    """Table rows of both reuse-gap distributions: share by count and by tokens."""
    rows = []
    for key, head, each in (("perReuse", "block reuses (gap since previous use)", "reused"),
                            ("perBlockMaxGap", "reused blocks (by longest gap)",
                             "longest gap")):
        dist = gaps[key]
        rows.append((f"{prefix}{head}", f"{dist['count']:,}  (by count / by tokens)"))
        rows += [(f"  {each} {b['label']}",
                  f"{b['share'] * 100:5.1f}% / {b['tokenShare'] * 100:5.1f}%  "
                  f"({b['count']:,})") for b in dist["bins"]]
    return rows


@trace.command("stats")
@click.argument("traces", nargs=-1, type=click.Path(path_type=Path))
@click.option("--format", "fmt", type=FORMAT_CHOICE, default="auto", show_default=True)
@click.option("--block-size", type=click.IntRange(min=1),
              help="Tokens per block when the trace does not say.")
@click.option("--warmup", type=float, default=0.5, show_default=True,
              help="Warm-up share for the ceiling (as in kvstore sim).")
@click.option("--skip-bad-lines", is_flag=True,
              help="Leave out (and count) lines that are not valid records.")
@click.option("--json", "as_json", is_flag=True, help="Print the statistics as JSON.")
@click.option("--plot", type=click.Path(path_type=Path, dir_okay=False),
              help="Write a PNG of the reuse-gap distributions.")
@click.option("--plot-weight", type=click.Choice(["count", "tokens"]), default="count",
              show_default=True, help="What the plot's shares count: reuses and blocks, "
                                      "or their tokens.")
@explains_memory_errors
def stats_command(traces, fmt, block_size, warmup, skip_bad_lines, as_json, plot,
                  plot_weight):
    """Requests, blocks, tokens, time span, the ceiling and the reuse-gap distribution."""
    if not 0 <= warmup < 1:
        raise UsageProblem(f"--warmup must be in [0, 1), got {warmup}")
    loaded = _load(traces, fmt, block_size, skip_bad_lines, as_json)
    result = stats.describe(loaded, warmup=warmup)
    if plot:
        from kvstored.tools import plots

        plots.save(stats.figure(result, plot_weight), plot)
    if as_json:
        click.echo(json.dumps(result, indent=1))
        return
    console = Console()
    table = Table(show_header=False, title=", ".join(loaded.sources))
    table.add_column(justify="left")
    table.add_column(justify="right")
    rows = [
        ("format", loaded.format),
        ("requests", f"{result['requests']:,}"),
        ("block events", f"{result['blockEvents']:,}"),
        ("unique prefix blocks", f"{result['uniqueBlocks']:,}"),
        ("block size", f"{result['blockSize']} tokens"),
        ("input tokens", f"{result['inputTokens']:,} (mean {result['meanInputTokens']:,.0f})"),
        ("output tokens", f"{result['outputTokens']:,}"),
        ("time span", _duration(result["timeSpanSeconds"])),
        ("ceiling", f"{result['ceiling']['hitRate'] * 100:.2f}% of measured tokens "
                    f"(warm-up {warmup:g}); {result['ceilingAllRequests']['hitRate'] * 100:.2f}%"
                    " over all requests"),
    ]
    gaps = result["reuseGaps"]
    rows += _gap_rows("", gaps)
    for kind, by_kind in (gaps["byRequestType"] or {}).items():
        rows += _gap_rows(f"[{kind}] ", by_kind)
    if loaded.skipped:
        rows.append(("records without blocks (skipped)", f"{loaded.skipped:,}"))
    for name, value in rows:
        table.add_row(name, value)
    console.print(table)
    if plot:
        console.print(f"[bold]Wrote[/] plot: {plot}")


@trace.command("convert")
@click.argument("traces", nargs=-1, type=click.Path(path_type=Path))
@click.option("--to", "target", type=click.Choice(list(writers.TARGETS)), required=True,
              help="Output format; binary is the compact event file kvstore sim reads fastest.")
@click.option("-o", "--output", type=click.Path(path_type=Path, dir_okay=False), required=True,
              help="Output file (.gz compresses the JSON formats).")
@click.option("--format", "fmt", type=FORMAT_CHOICE, default="auto", show_default=True)
@click.option("--block-size", type=click.IntRange(min=1),
              help="Tokens per block when the trace does not say.")
@click.option("--skip-bad-lines", is_flag=True,
              help="Leave out (and count) lines that are not valid records.")
@explains_memory_errors
def convert_command(traces, target, output, fmt, block_size, skip_bad_lines):
    """Convert TRACE... to another format; the replay stays exactly the same."""
    loaded = _load(traces, fmt, block_size, skip_bad_lines)
    if output.resolve() in {Path(t).resolve() for t in traces}:
        raise UsageProblem(f"{output} is also an input; write elsewhere")
    writers.write(loaded, target, output)
    click.echo(f"wrote {output} ({target}): {loaded.requests:,} requests, "
               f"{loaded.events:,} block events, {format_size(output.stat().st_size)}")


@trace.command("generate")
@click.argument("workload", type=click.Choice(list(workloads.WORKLOADS)))
@click.option("-o", "--output", type=click.Path(path_type=Path, dir_okay=False), required=True,
              help="Output file (gzip-compressed JSONL; name it .jsonl.gz).")
@click.option("--seed", type=int, default=workloads.DEFAULT_SEED, show_default=True,
              help="Random seed; the same seed gives the same bytes.")
@click.option("--scale", type=click.FloatRange(min=0, min_open=True), default=1.0,
              show_default=True, help="Multiply the load: sessions for coding-agent, the "
                                      "arrival rate for the others.")
@explains_memory_errors
def generate_command(workload, output, seed, scale):
    """Write a trace from one of the workload models (the built-in traces are these at
    the default seed and scale; docs/simulator.md describes each model)."""
    data = workloads.generate(workload, seed, scale)
    write_file(output, data)
    click.echo(f"wrote {output} ({workloads.WORKLOADS[workload].format}, seed {seed}, "
               f"scale {scale:g}): {format_size(len(data))}")
