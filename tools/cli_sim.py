"""``kvstore sim``: the hit-rate simulator on the command line (docs/simulator.md).

``kvstore sim TRACE...`` sweeps budgets (the ``run`` subcommand, taken when the first
word is no subcommand); ``kvstore sim plan TRACE...`` sizes DRAM and SSD together.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import click

from kvstored.params import ExistingFile
from kvstored.progress import progress_bar
from kvstored.sdk.units import format_size
from kvstored.tools import builtin, models, tiered
from kvstored.tools.cli_common import (
    FORMAT_CHOICE,
    explains_memory_errors,
    parse_gib,
    parse_gib_list,
    parse_int_list,
    split_list,
    write_file,
)
from kvstored.tools.errors import UsageProblem
from kvstored.tools.simulate import SimOptions, simulate

# Imported where used, so that a --json run does not load rich, matplotlib or the report
# code (its peak memory is measured against the reference's): report_table, rich,
# plots, html_report, reference_schema.


def _list_models(models_file: Path | None, as_json: bool) -> None:
    table = models.load(models_file)
    rows = table.rows()
    if as_json:
        click.echo(json.dumps({"precisions": table.precisions, "models": rows}, indent=1))
        return
    from rich.console import Console
    from rich.table import Table

    out = Table(header_style="bold", title="KV-cache bytes per token")
    out.caption = ("* depends on the sequence length: shown at 4,096 tokens; the simulator "
                   "sizes it at the trace's mean input length")
    for name in ("model", "family", "formula", *table.precisions):
        out.add_column(name, justify="left" if name in ("model", "family", "formula") else
                       "right", no_wrap=name == "model")
    for row in rows:
        mark = "*" if row["tokenDependent"] else ""
        out.add_row(row["id"], row["family"], row["formula"],
                    *[f"{row['bytesPerToken'][p]:,.0f}{mark}" if p in row["bytesPerToken"]
                      else "-" for p in table.precisions])
    console = Console()
    if not console.is_terminal:
        console.width = 160
    console.print(out)


class _DefaultRun(click.Group):
    """A group whose default subcommand is ``run``: ``kvstore sim TRACE`` is
    ``kvstore sim run TRACE`` (a trace file named like a subcommand: write ``./plan``)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if not args or args[0] not in self.commands:
            args = ["run", *args]
        return super().parse_args(ctx, args)


def _list_traces(as_json: bool) -> None:
    rows = builtin.catalogue()
    if as_json:
        click.echo(json.dumps(rows, indent=1))
        return
    from rich.console import Console
    from rich.table import Table

    out = Table(header_style="bold", title="Built-in traces (docs/simulator.md)")
    for name in ("trace", "format", "what", "size"):
        out.add_column(name, no_wrap=name == "trace")
    for row in rows:
        out.add_row(row["name"], row["format"], row["summary"], format_size(row["bytes"]))
    Console().print(out)


@click.group("sim", cls=_DefaultRun, context_settings={"help_option_names": ["-h", "--help"]})
def sim() -> None:
    """Simulate KV-cache hit rates (kvstore sim TRACE..., see kvstore sim run --help) and
    plan DRAM + SSD capacity (kvstore sim plan --help)."""


def trace_options(command):
    """The options that name and read the trace, shared by run and plan."""
    for option in reversed((
        click.argument("traces", nargs=-1, type=click.Path(path_type=Path)),
        click.option("--trace", "trace_opts", multiple=True, metavar="TRACE",
                     help="A trace (repeatable), as the positional TRACE: a file, a session "
                          "directory, - for standard input, or builtin:NAME "
                          "(kvstore sim --list-traces)."),
        click.option("--format", "fmt", type=FORMAT_CHOICE, default="auto",
                     show_default=True, help="Trace format; auto looks at the first record."),
        click.option("--block-size", type=click.IntRange(min=1),
                     help="Tokens per block when the trace does not say (default: 512 "
                          "Mooncake, 16 Bailian, 64 sessions)."),
        click.option("--skip-bad-lines", is_flag=True,
                     help="Leave out (and count) lines that are not valid records instead of "
                          "stopping at the first."),
    )):
        command = option(command)
    return command


def model_options(command):
    """The options that turn budgets into blocks."""
    for option in reversed((
        click.option("--model", help="Model whose KV bytes per token size the blocks "
                                     "(--list-models)."),
        click.option("--bytes-per-token", type=float,
                     help="KV bytes per token, instead of --model."),
        click.option("--precision", "--kv-precision", "precision",
                     help="KV precision of --model: bf16, fp8, fp4 (or the reference's "
                          "bf16_fp16, fp8_int8, fp4_int4); default: the model's own."),
        click.option("--indexer-precision",
                     help="Precision of the sparse-attention indexer keys, for models that "
                          "have them (default: the model's, else the KV precision)."),
        click.option("--include-draft-kv", is_flag=True,
                     help="Add the KV of the model's draft (MTP / next-n) layers."),
        click.option("--estimate-tokens", type=click.IntRange(min=1),
                     help="Sequence length that sizes models with sliding-window or "
                          "compressed layers (default: the trace's mean input length)."),
        click.option("--models-file", type=ExistingFile(path_type=Path),
                     help="A TOML model table adding to or overriding the packaged one."),
    )):
        command = option(command)
    return command


def output_options(command):
    for option in reversed((
        click.option("--json", "as_json", is_flag=True, help="Print the result as JSON."),
        click.option("-o", "--output", type=click.Path(path_type=Path, dir_okay=False),
                     help="Write the table (or JSON) to this file instead of the terminal."),
    )):
        command = option(command)
    return command


def all_traces(traces: tuple, trace_opts: tuple) -> list:
    found = [*trace_opts, *traces]
    if not found:
        raise UsageProblem("give a trace (a file, - for standard input, or builtin:NAME; "
                           "see --list-traces)")
    return found


def write_output(text: str, output: Path | None) -> None:
    """Print, or write ``output`` whole (through a temporary name, so an interrupted run
    never leaves half a file)."""
    if output is None:
        click.echo(text)
        return
    write_file(output, text if text.endswith("\n") else text + "\n")
    click.echo(f"wrote {output}", err=True)


def render_console(render, output: Path | None) -> None:
    """Run ``render(console)`` on the terminal, or into ``output`` as plain text."""
    from rich.console import Console

    if output is None:
        console = Console()
        if not console.is_terminal:  # a file or a pipe: no reason to wrap at 80 columns
            console.width = 160
        render(console)
        return
    buffer = io.StringIO()
    render(Console(file=buffer, width=160, no_color=True, force_terminal=False))
    write_output(buffer.getvalue(), output)


@sim.command("run")
@trace_options
@model_options
@click.option("--budgets", help="Cache budgets, e.g. 1GiB,512GiB,2TiB (a bare number is GiB); "
                                "default 1 GiB to 16 TiB in powers of two.")
@click.option("--blocks", help="Capacities in blocks instead of --budgets, e.g. 100,1000.")
@click.option("--policies", default="fifo,lru,optimal", show_default=True,
              help="Among fifo, lru, optimal, s3fifo, tiered.")
@click.option("--warmup", type=float, default=0.5, show_default=True,
              help="Share of the requests that only warm the cache.")
@click.option("--ssd", help="tiered: the SSD tier's size, e.g. 2TiB (DRAM is each budget).")
@click.option("--ssd-blocks", type=click.IntRange(min=0), help="tiered: SSD size in blocks.")
@click.option("--tier-mode", type=click.Choice(["write-through", "offload"]),
              default="write-through", show_default=True,
              help="tiered: write new blocks to the SSD at once, or when DRAM evicts them.")
@click.option("--promotion/--no-promotion", default=True, show_default=True,
              help="tiered: copy SSD hits back into DRAM.")
@click.option("--prefill-tps", type=float, default=tiered.DEFAULT_PREFILL_TOKENS_PER_S,
              show_default=True, help="TTFT model: prefill throughput, tokens/s.")
@click.option("--dram-gbps", type=float, default=tiered.DEFAULT_DRAM_GBPS, show_default=True,
              help="TTFT model: DRAM-to-GPU load bandwidth, GB/s.")
@click.option("--ssd-gbps", type=float, default=tiered.DEFAULT_SSD_GBPS, show_default=True,
              help="TTFT model: SSD-to-GPU load bandwidth, GB/s.")
@click.option("--margin", type=click.FloatRange(0, 1, max_open=True), default=0.05,
              show_default=True,
              help="Recommended budget: the smallest within this share of the best speedup "
                   "on the curve.")
@click.option("--recommend-policy", help="Policy the recommendation follows (default: "
                                         "tiered, else lru, else the first).")
@click.option("--jobs", type=click.IntRange(min=0), default=1, show_default=True,
              help="Replays run at once on threads (0: one per CPU). Each thread keeps its "
                   "own workspace, about 4 bytes per unique block.")
@output_options
@click.option("--json-schema", "schema", type=click.Choice(["kvstored", "reference"]),
              default="kvstored", show_default=True,
              help="JSON layout: kvstored's, or the reference simulator's "
                   "(kvcache-simulator run --format json), for scripts written for it. "
                   "Implies --json.")
@click.option("--plot", type=click.Path(path_type=Path, dir_okay=False),
              help="Write a PNG of hit rate and speedup against budget (and, with tiered, "
                   "NAME-tiers.png: hits by tier and the TTFT model).")
@click.option("--html", type=click.Path(path_type=Path, dir_okay=False),
              help="Write a self-contained HTML report.")
@click.option("--list-models", is_flag=True, help="Print the model table and exit.")
@click.option("--list-traces", is_flag=True, help="Print the built-in traces and exit.")
@explains_memory_errors
def run(traces, trace_opts, fmt, block_size, skip_bad_lines, model, bytes_per_token,
        precision, indexer_precision, include_draft_kv, estimate_tokens, models_file,
        budgets, blocks, policies, warmup, ssd, ssd_blocks, tier_mode, promotion,
        prefill_tps, dram_gbps, ssd_gbps, margin, recommend_policy, jobs, as_json, output,
        schema, plot, html, list_models, list_traces):
    """Simulate the KV-cache hit rate of TRACE... against cache budgets and policies.

    \b
    TRACE is a Mooncake or Bailian JSONL file (optionally .gz), a session JSON file, a
    directory of session files, a JSONL of sessions, a binary event file from
    `kvstore trace convert`, - for standard input, or builtin:NAME (--list-traces).
    Several traces are replayed one after another.

    \b
    kvstore sim plan TRACE...  sizes DRAM and SSD together (kvstore sim plan --help).
    """
    if list_models:
        _list_models(models_file, as_json)
        return
    if list_traces:
        _list_traces(as_json)
        return
    paths = all_traces(traces, trace_opts)
    options = SimOptions(
        fmt=fmt, block_size=block_size, model=model, bytes_per_token=bytes_per_token,
        precision=precision, indexer_precision=indexer_precision,
        include_draft_kv=include_draft_kv, estimate_tokens=estimate_tokens,
        models_file=models_file, budgets_gib=parse_gib_list(budgets),
        blocks=parse_int_list(blocks, "--blocks"),
        policies=split_list(policies) or [], warmup=warmup,
        ssd_gib=parse_gib(ssd) if ssd else None, ssd_blocks=ssd_blocks,
        write_through=tier_mode == "write-through", promote=promotion,
        prefill_tokens_per_s=prefill_tps, dram_gbps=dram_gbps, ssd_gbps=ssd_gbps,
        margin=margin, recommend_policy=recommend_policy, jobs=jobs,
        skip_bad_lines=skip_bad_lines, count_distinct_ids=schema == "reference")
    # Never beside a JSON document: stdout and stderr are one stream on a terminal.
    with progress_bar(enabled=not as_json and schema != "reference") as progress:
        result = simulate(paths, options, progress=progress)
    tier_plot = None
    if plot:
        from kvstored.tools import plots

        plots.save(plots.sim_figure(result), plot)
        if result["tiered"] and any(p["mode"] == "fixed_window" for p in result["points"]):
            tier_plot = plot.with_name(f"{plot.stem}-tiers{plot.suffix}")
            plots.save(plots.tier_figure(result), tier_plot)
    if html:
        from kvstored.tools import html_report

        html_report.write(result, html)
    if as_json or schema == "reference":
        if schema == "reference":
            from kvstored.tools import reference_schema

            document = reference_schema.convert(result)
        else:
            document = result
        write_output(json.dumps(document, indent=1), output)
        return

    def render(console) -> None:
        from kvstored.tools import report_table

        report_table.render(result, console)
        for label, path in (("plot", plot), ("tier plot", tier_plot), ("report", html)):
            if path:
                console.print(f"[bold]Wrote[/] {label}: {path}")

    render_console(render, output)


# plan's defaults, without importing the plan module for a plain run
_DRAM_COST, _SSD_COST, _MARGIN = 4.0, 0.10, 0.02


@sim.command("plan")
@trace_options
@model_options
@click.option("--dram", help="DRAM sizes: A..B doubles from A to B, or a list "
                             "(default 64GiB..4TiB).")
@click.option("--ssd", help="SSD sizes: A..B (from 0: 0, then B/64 doubling to B) or a "
                            "list (default 0..32TiB).")
@click.option("--dram-cost", type=click.FloatRange(min=0),
              default=_DRAM_COST, show_default=True,
              help="DRAM price, $ per GiB.")
@click.option("--ssd-cost", type=click.FloatRange(min=0),
              default=_SSD_COST, show_default=True,
              help="SSD price, $ per GiB.")
@click.option("--tier-mode", type=click.Choice(["write-through", "offload"]),
              default="write-through", show_default=True,
              help="Write new blocks to the SSD at once, or when DRAM evicts them.")
@click.option("--promotion/--no-promotion", default=True, show_default=True,
              help="Copy SSD hits back into DRAM.")
@click.option("--prefill-rate", "--prefill-tps", "prefill_tps", type=float,
              default=tiered.DEFAULT_PREFILL_TOKENS_PER_S, show_default=True,
              help="TTFT model: prefill throughput, tokens/s.")
@click.option("--dram-gbps", type=float, default=tiered.DEFAULT_DRAM_GBPS, show_default=True,
              help="TTFT model: DRAM-to-GPU load bandwidth, GB/s.")
@click.option("--ssd-gbps", type=float, default=tiered.DEFAULT_SSD_GBPS, show_default=True,
              help="TTFT model: SSD-to-GPU load bandwidth, GB/s.")
@click.option("--target-speedup", type=float,
              help="Recommend the cheapest cell with at least this modelled TTFT speedup.")
@click.option("--budget", type=click.FloatRange(min=0),
              help="Recommend the fastest cell costing at most this many $.")
@click.option("--margin", type=click.FloatRange(0, 1, max_open=True),
              default=_MARGIN, show_default=True,
              help="Without a target or budget: the cheapest cell within this share of the "
                   "best modelled speedup.")
@click.option("--warmup", type=float, default=0.5, show_default=True,
              help="Share of the requests that only warm the cache.")
@click.option("--jobs", type=click.IntRange(min=0), default=1, show_default=True,
              help="Replays run at once on threads (0: one per CPU).")
@output_options
@click.option("--heatmap", type=click.Path(path_type=Path, dir_okay=False),
              help="Write a PNG heatmap of the grid (DRAM by SSD), the recommendation "
                   "marked.")
@click.option("--heatmap-metric", type=click.Choice(["speedup", "ttft"]), default="speedup",
              show_default=True, help="What the heatmap colours: TTFT speedup or seconds.")
@click.option("--html", type=click.Path(path_type=Path, dir_okay=False),
              help="Write a self-contained HTML report of the plan.")
@explains_memory_errors
def plan(traces, trace_opts, fmt, block_size, skip_bad_lines, model, bytes_per_token,
         precision, indexer_precision, include_draft_kv, estimate_tokens, models_file, dram,
         ssd, dram_cost, ssd_cost, tier_mode, promotion, prefill_tps, dram_gbps, ssd_gbps,
         target_speedup, budget, margin, warmup, jobs, as_json, output, heatmap,
         heatmap_metric, html):
    """Size DRAM and SSD together: replay TRACE on a grid of DRAM x SSD sizes with the
    tiered policy and recommend a configuration (docs/simulator.md).

    \b
    Each cell reports the hit rate, the DRAM and SSD shares of the hits, the ideal
    speedup, the modelled TTFT and the cost; the recommendation is the cheapest cell
    within --margin of the best modelled speedup, or the cheapest meeting
    --target-speedup, or the fastest within --budget.
    """
    from kvstored.tools import plan as plan_module

    paths = all_traces(traces, trace_opts)
    sim_options = SimOptions(
        fmt=fmt, block_size=block_size, model=model, bytes_per_token=bytes_per_token,
        precision=precision, indexer_precision=indexer_precision,
        include_draft_kv=include_draft_kv, estimate_tokens=estimate_tokens,
        models_file=models_file, policies=["tiered"], warmup=warmup,
        skip_bad_lines=skip_bad_lines)
    if not 0 <= warmup < 1:
        raise UsageProblem(f"--warmup must be in [0, 1), got {warmup}")
    options = plan_module.PlanOptions(
        dram_gib=plan_module.parse_grid(dram, plan_module.DEFAULT_DRAM_GIB, parse_gib),
        ssd_gib=plan_module.parse_grid(ssd, plan_module.DEFAULT_SSD_GIB, parse_gib),
        dram_cost_per_gib=dram_cost, ssd_cost_per_gib=ssd_cost,
        write_through=tier_mode == "write-through", promote=promotion,
        prefill_tokens_per_s=prefill_tps, dram_gbps=dram_gbps, ssd_gbps=ssd_gbps,
        margin=margin, target_speedup=target_speedup, budget=budget, jobs=jobs)
    with progress_bar(enabled=not as_json) as progress:
        result = plan_module.plan(paths, sim_options, options, progress=progress)
    if heatmap:
        from kvstored.tools import plots

        plots.save(plots.plan_heatmap(result, heatmap_metric), heatmap)
    if html:
        from kvstored.tools import html_report

        html_report.write_plan(result, html)
    if as_json:
        write_output(json.dumps(result, indent=1), output)
        return

    def render(console) -> None:
        from kvstored.tools import report_table

        report_table.render_plan(result, console)
        for label, path in (("heatmap", heatmap), ("report", html)):
            if path:
                console.print(f"[bold]Wrote[/] {label}: {path}")

    render_console(render, output)
