"""``kvstore replay``: a trace against a live store, measured beside the simulator's
prediction for the same store, or the multi-round experiment on fresh embedded stores
(docs/replay.md).

The work is :mod:`kvstored.replay`; this module reads the options, shows progress on a
terminal (never with ``--json``), prints the tables or the document, writes the plot and
the page, and ends with exit 5 (CORRUPT) when any byte read back was wrong.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from kvstored.cli.connection import client_options, json_option, open_client, reach
from kvstored.cli.errors import QuietError
from kvstored.cli.exitcodes import ExitCode
from kvstored.cli.program import state
from kvstored.config import load_config
from kvstored.progress import progress_bar
from kvstored.sdk.units import parse_size
from kvstored.tools.cli_common import FORMAT_CHOICE
from kvstored.tools.tiered import DEFAULT_PREFILL_TOKENS_PER_S

#: The largest block a replay writes (a KV block of a large model at 512 tokens is a few
#: MiB; the store's default object limit is far above).
MAX_BLOCK_BYTES = 64 << 20


def _size(text: str | None, option: str) -> int | None:
    """A size option in bytes (None when not given); a bad one is bad usage."""
    if text is None:
        return None
    try:
        value = parse_size(text)
    except ValueError as exc:
        raise QuietError(f"{option}: {exc}", ExitCode.USAGE) from None
    if value < 1:
        raise QuietError(f"{option} must be at least 1 byte", ExitCode.USAGE)
    return value


def _check_options(trace: str | None, multiturn: str | None, speed: float | None,
                   as_fast: bool, given: dict[str, Any]) -> None:
    if bool(trace) == bool(multiturn):
        raise QuietError("give a TRACE (a file, - or builtin:NAME) or --multiturn "
                         "CLIENTSxROUNDS, not both or neither", ExitCode.USAGE)
    if speed is not None and as_fast:
        raise QuietError("--speed and --as-fast-as-possible exclude each other",
                         ExitCode.USAGE)
    if speed is not None and not speed > 0:
        raise QuietError(f"--speed must be positive, not {speed:g}", ExitCode.USAGE)
    if trace:
        extra = [name for name in ("--dram", "--ssd", "--context", "--prefill-tps")
                 if given[name] is not None]
        if extra:
            raise QuietError(f"{', '.join(extra)} belong to --multiturn (a TRACE replays "
                             "against the store at --master as it is)", ExitCode.USAGE)
    else:
        extra = [name for name in ("--speed", "--window", "--namespace") if given[name]]
        extra += ["--warmup"] if given["--warmup"] else []
        extra += ["--format"] if given["--format"] != "auto" else []
        if extra:
            raise QuietError(f"{', '.join(extra)} belong to a TRACE replay (--multiturn "
                             "runs its rounds as fast as possible, on its own stores)",
                             ExitCode.USAGE)


def _console():
    from rich.console import Console

    return Console()


def _show(doc: dict[str, Any], kind: str, as_json: bool, plot: Path | None,
          html: Path | None) -> None:
    """Write the plot and the page, then print the document or the tables; ``kind`` is
    "replay" (a trace) or "multiturn"."""
    if plot or html:
        from kvstored.replay import plots
        from kvstored.tools import plots as tool_plots

        figure = plots.replay_figure if kind == "replay" else plots.multiturn_figure
        if plot:
            tool_plots.save(figure(doc), plot)
        if html:
            from kvstored.replay import page

            section = page.replay_section if kind == "replay" else page.multiturn_section
            title = "kvstore replay" + (" --multiturn" if kind == "multiturn" else "")
            page.write(html, title, [section(doc, tool_plots.png_bytes(figure(doc)))],
                       {kind: doc})
    if as_json:
        click.echo(json.dumps(doc, indent=1))
        return
    from kvstored.replay.tables import render_multiturn, render_replay

    console = _console()
    (render_replay if kind == "replay" else render_multiturn)(console, doc)
    for label, path in (("plot", plot), ("page", html)):
        if path:
            console.print(f"wrote the {label}: {path}")


def _finish(wrong: int, examples: list[dict[str, Any]]) -> None:
    if wrong:
        first = examples[0]["key"] if examples else "?"
        raise QuietError(f"{wrong:,} bytes read back differ from what was put (first "
                         f"wrong block: {first}); the store handed out corrupt data",
                         ExitCode.CORRUPT)


@click.command()
@click.argument("trace", required=False)
@client_options
@click.option("--format", "fmt", type=FORMAT_CHOICE, default="auto", show_default=True,
              help="Trace format; auto looks at the first record.")
@click.option("--block-bytes", default="64KiB", show_default=True, metavar="SIZE",
              help="Bytes of every block's value (a KV block of the trace's block size).")
@click.option("--concurrency", type=click.IntRange(1, 256), default=1, show_default=True,
              help="Requests in flight at once (worker threads). With 1 the tier of every "
                   "hit is exact; with more, the split is exact overall.")
@click.option("--speed", type=float, metavar="X",
              help="Send requests at X times the trace's pace (its arrival times).")
@click.option("--as-fast-as-possible", "as_fast", is_flag=True,
              help="Send each request as soon as a worker is free (the default).")
@click.option("--window", type=click.FloatRange(min=0, min_open=True), metavar="SECONDS",
              help="Report per window of this much trace time [default: about a twelfth "
                   "of the trace].")
@click.option("--warmup", type=click.FloatRange(0, 1, max_open=True), default=0.0,
              show_default=True,
              help="Share of the requests that only warm the store (not measured).")
@click.option("--namespace", metavar="NAME",
              help="Key prefix of this replay's blocks [default: replay-<random>].")
@click.option("--multiturn", metavar="CLIENTSxROUNDS",
              help="Run the multi-round experiment instead of a trace, e.g. 20x10.")
@click.option("--context", type=click.IntRange(min=1), metavar="TOKENS",
              help="--multiturn: tokens each round adds to a conversation [default: 4096].")
@click.option("--dram", metavar="SIZE",
              help="--multiturn: DRAM of both stores [default: overflows in round "
                   "0.7 x ROUNDS].")
@click.option("--ssd", metavar="SIZE",
              help="--multiturn: SSD of the second store [default: holds everything].")
@click.option("--prefill-tps", type=click.FloatRange(min=0, min_open=True),
              help="--multiturn: prefill tokens per second of the TTFT estimate "
                   f"[default: {DEFAULT_PREFILL_TOKENS_PER_S:,.0f}].")
@click.option("--seed", type=int, default=0, show_default=True,
              help="--multiturn: seed of the turn lengths.")
@json_option
@click.option("--plot", type=click.Path(path_type=Path, dir_okay=False),
              help="Write a PNG: hit rate over time by tier (a trace), or per round "
                   "(--multiturn).")
@click.option("--html", type=click.Path(path_type=Path, dir_okay=False),
              help="Write a self-contained HTML page of the result.")
def replay(trace, fmt, block_bytes, concurrency, speed, as_fast, window, warmup, namespace,
           multiturn, context, dram, ssd, prefill_tps, seed, as_json, plot, html) -> None:
    """Replay TRACE against the store and compare with the simulator's prediction.

    \b
    Each request does what an engine does: prefix_hits on its prefix-chained block
    keys, a batched get of the hit prefix (every byte checked against the value
    derived from its key), a batched put of the missed blocks. The prediction runs
    the simulator's tiered policy with the store's capacities (docs/replay.md).
    TRACE is a file (Mooncake, sessions, Bailian, binary), - or builtin:NAME.

    \b
    --multiturn CLIENTSxROUNDS runs the multi-round experiment instead: growing
    conversations on two fresh embedded stores, DRAM only then DRAM+SSD.

    Exits 5 if any byte read back was wrong.
    """
    _check_options(trace, multiturn, speed, as_fast, {
        "--dram": dram, "--ssd": ssd, "--context": context, "--prefill-tps": prefill_tps,
        "--speed": speed, "--window": window, "--namespace": namespace, "--warmup": warmup,
        "--format": fmt})
    block = _size(block_bytes, "--block-bytes") or 0
    if block > MAX_BLOCK_BYTES:
        raise QuietError(f"--block-bytes is at most {MAX_BLOCK_BYTES >> 20} MiB",
                         ExitCode.USAGE)
    if multiturn:
        _multiturn(multiturn, block, context, _size(dram, "--dram"), _size(ssd, "--ssd"),
                   prefill_tps, seed, concurrency, as_json, plot, html)
    else:
        _trace(trace, fmt, block, concurrency, speed, window, warmup, namespace, as_json,
               plot, html)


def _trace(trace, fmt, block, concurrency, speed, window, warmup, namespace, as_json, plot,
           html) -> None:
    from kvstored.replay.keys import check_namespace
    from kvstored.replay.predict import StorePolicy
    from kvstored.replay.session import replay_trace
    from kvstored.tools import reader

    if namespace is not None:
        try:
            check_namespace(namespace)
        except ValueError as exc:
            raise QuietError(f"--namespace: {exc}", ExitCode.USAGE) from None
    run = state()
    settings = reach(run)
    with progress_bar(enabled=not as_json) as progress:
        if progress:
            progress(0, 1, f"reading {trace}")
        events = reader.load([trace], fmt, keep_id_names=False, progress=progress)
        if not events.requests:
            raise QuietError(f"{trace} has no request with blocks", ExitCode.USAGE)
        with open_client(settings) as client:
            result = replay_trace(
                client, events, StorePolicy.from_config(load_config(run.config_file)),
                block_bytes=block, concurrency=concurrency, speed=speed,
                namespace=namespace, warmup=warmup, window=window, master=settings.master,
                progress=None if progress is None else
                lambda done, total: progress(done, total, f"replaying {done:,}/{total:,}"))
    doc = result.document
    _show(doc, "replay", as_json, plot, html)
    _finish(doc["wrong_bytes"], doc["wrong_examples"])


def _multiturn(shape, block, context, dram, ssd, prefill_tps, seed, concurrency, as_json,
               plot, html) -> None:
    from kvstored.replay import multiturn

    try:
        spec = multiturn.MultiturnSpec.parse(shape, context_tokens=context or 4096,
                                             seed=seed)
    except ValueError as exc:
        raise QuietError(str(exc), ExitCode.USAGE) from None
    with progress_bar(enabled=not as_json) as progress:
        doc = multiturn.run(
            spec, block_bytes=block, dram=dram, ssd=ssd,
            prefill_tps=prefill_tps or DEFAULT_PREFILL_TOKENS_PER_S, concurrency=concurrency,
            progress=None if progress is None else
            lambda label, done, total: progress(done, total, f"{label}: {done:,}/{total:,}"))
    _show(doc, "multiturn", as_json, plot, html)
    examples = [e for r in doc["runs"].values() for e in r["wrong_examples"]]
    _finish(doc["wrong_bytes"], examples)
