"""``make demo``: the product's story in two minutes, on fresh embedded stores.

1. Start ``kvstored up`` on a temporary data directory (default settings, default
   security: the daemon creates the client token and the client finds it).
2. Replay a small trace that ships in the package (``builtin:multi-turn-chat``) against
   it as an engine would, every byte read checked, and print the measured hit rates by
   tier beside the simulator's prediction for the same store; stop the store.
3. Run the multi-round experiment at a small scale: growing conversations on a DRAM-only
   store, then on DRAM+SSD; print the per-round table.
4. Write the PNGs and an HTML page beside them into ``demo-output/`` (or ``--out``), which
   it keeps, and print where they are.

It needs nothing outside the repository (no ``../shared``). docs/replay.md explains
every figure; ``kvstore replay --help`` runs the same steps on other traces and stores.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

from rich.console import Console

import kvstored
from kvstored.progress import ProgressFn, progress_bar
from kvstored.replay import multiturn, page, plots
from kvstored.replay.embedded import EmbeddedStore
from kvstored.replay.predict import StorePolicy
from kvstored.replay.session import replay_trace
from kvstored.replay.tables import render_multiturn, render_replay
from kvstored.sdk.units import format_size
from kvstored.tools import plots as tool_plots
from kvstored.tools import reader

TRACE = "builtin:multi-turn-chat"
BLOCK_BYTES = 64 << 10
DRAM = 64 << 20
SSD = 1 << 30
MULTITURN = multiturn.MultiturnSpec(clients=20, rounds=10, context_tokens=4096)


def _shown(path: Path) -> str:
    """``path`` relative to the working directory when it is below it."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _requests(bar: ProgressFn | None) -> Callable[[str, int, int], None] | None:
    """The replays' ``progress(label, done, total)`` drawn on ``bar`` (None: no bar)."""
    if bar is None:
        return None
    return lambda label, done, total: bar(done, total, f"{label}: {done:,}/{total:,} requests")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvstored.demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("demo-output"),
                        help="where the plots and the page go (kept) [demo-output]")
    args = parser.parse_args(argv)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    console = Console()
    started = time.monotonic()
    console.rule("[bold]1. an embedded store")
    trace = reader.load([TRACE], keep_id_names=False)
    with EmbeddedStore(dram=DRAM, ssd=SSD, label="demo") as store:
        console.print(f"kvstored up on {store.address}: {format_size(DRAM)} DRAM, "
                      f"{format_size(SSD)} SSD (bucket backend), a temporary data "
                      "directory; the client found the token the daemon created")
        console.rule(f"[bold]2. replay {TRACE}")
        console.print(f"{trace.requests:,} requests of a multi-turn chat service, blocks "
                      f"of {trace.block_size} tokens and {format_size(BLOCK_BYTES)}: "
                      "prefix_hits, get of the hit prefix (checked byte for byte), put "
                      "of the rest")
        with kvstored.connect(store.address) as client, progress_bar(True) as bar:
            counted = _requests(bar)
            replayed = replay_trace(client, trace, StorePolicy.from_config(store.config()),
                                    block_bytes=BLOCK_BYTES, master=store.address,
                                    progress=None if counted is None else
                                    lambda done, total: counted("replaying", done, total))
    replay_doc = replayed.document
    render_replay(console, replay_doc, windows=False)
    console.print("the store was stopped cleanly (SIGTERM, exit 0)")

    console.rule("[bold]3. the multi-round experiment")
    console.print(f"{MULTITURN.clients} conversations growing by about "
                  f"{MULTITURN.context_tokens:,} tokens a round, on a DRAM-only store and "
                  "then on DRAM+SSD, each fresh, with the same DRAM")
    with progress_bar(True) as bar:
        rounds_doc = multiturn.run(MULTITURN, block_bytes=BLOCK_BYTES, progress=_requests(bar))
    render_multiturn(console, rounds_doc)

    console.rule("[bold]4. plots and page")
    replay_png, rounds_png, index = out / "replay.png", out / "multiturn.png", out / "index.html"
    tool_plots.save(plots.replay_figure(replay_doc), replay_png)
    tool_plots.save(plots.multiturn_figure(rounds_doc), rounds_png)
    page.write(index, "kvstored demo: trace replay and multi-round",
               [page.replay_section(replay_doc, replay_png.read_bytes()),
                page.multiturn_section(rounds_doc, rounds_png.read_bytes())],
               {"replay": replay_doc, "multiturn": rounds_doc})
    console.print("wrote:")
    for path in (replay_png, rounds_png, index):
        # a path on a line of its own, never broken (copy it whole)
        console.print(f"  {_shown(path)}", soft_wrap=True, highlight=False)
    wrong = replay_doc["wrong_bytes"] + rounds_doc["wrong_bytes"]
    elapsed = time.monotonic() - started
    if wrong:
        console.print(f"[red bold]demo failed: {wrong:,} bytes read back were wrong[/] "
                      f"({elapsed:.0f} s)")
        return 1
    console.print(f"[green bold]demo ok[/] in {elapsed:.0f} s; open the page:")
    console.print(f"  {_shown(index)}", soft_wrap=True, highlight=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
