"""``kvstore bench engines``: kvstored as SGLang's HiCache L3 storage, against SGLang's
built-in file backend and against Mooncake Store, through SGLang's own storage path, side
by side in one run.

Pages of a realistic model (by default 64 tokens, 32 layers, 8 KV heads of 128 dims,
bf16: 8 MiB a page) in SGLang's own MHA host pool, backed up (put) and prefetched (get)
by the cache controller's own page functions (:mod:`kvstored.bench.engines_peer`, one
process per runner):

===================  ===================================================================
runner               what SGLang is given
===================  ===================================================================
kvstored-shm         ``--hicache-storage-backend dynamic`` loading
                     ``kvstored.integrations.sglang`` with ``interface_v1``, a
                     ``kvstored up`` on the same host, ``transport: shm``
kvstored-tcp         the same, ``transport: tcp``
sglang-file          ``--hicache-storage-backend file`` (``HiCacheFile``), page cache
                     warm (pages read back soon after they were written)
sglang-file-cold     the same, page cache dropped before each prefetch (root only)
mooncake-embedded    ``--hicache-storage-backend mooncake`` as SGLang's docs set it up:
                     ``mooncake_master``, the engine's own segment (TCP protocol)
mooncake-remote      the same with no segment in the engine: the data lives in a
                     ``mooncake_client`` process, as kvstored's lives in its daemon
===================  ===================================================================

Each figure is the median over ``--rounds``; every page is compared with what was backed
up, in every round. Runners that cannot run here are listed under ``skipped`` with the
reason. The goals of issue 12 (prefetch at least 1.5x Mooncake's, zero copies in the
client on the same host) are computed from this run's figures.
"""

from __future__ import annotations

import json
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from kvstored.bench import BenchError, RunStart, goal_line, ratio_verdict, run_outputs, say
from kvstored.bench.mooncake_peer import MooncakeCluster, probe
from kvstored.bench.store_kvstored import KvstoredDaemon
from kvstored.capabilities import probe_engine

RUNNERS = ("kvstored-shm", "kvstored-tcp", "sglang-file", "sglang-file-cold",
           "mooncake-embedded", "mooncake-remote")
#: (goal, ours, theirs, figure, minimum ratio)
GOALS = (("prefetch >= 1.5x Mooncake (engine's own segment)", "kvstored-shm",
          "mooncake-embedded", "prefetch_gbps", 1.5),
         ("prefetch >= 1.5x Mooncake (segment in its own process)", "kvstored-shm",
          "mooncake-remote", "prefetch_gbps", 1.5))
FIGURES = ("backup_gbps", "prefetch_gbps", "exists_ms")


def _median_rounds(document: dict[str, Any]) -> dict[str, Any]:
    rounds = document.get("rounds") or []
    # Unrounded: tiny pages on a loaded machine move well under 0.0001 GB/s, and a
    # rounded zero would read as "nothing moved" (the tables round when they print).
    summary = {name: statistics.median(r[name] for r in rounds) for name in FIGURES if rounds}
    return {**document, "median": summary}


def _measure(runner: str, workdir: Path, geometry: dict[str, int], extra: list[str],
             timeout: float) -> dict[str, Any]:
    log = workdir / f"peer-{runner}.log"
    argv = [sys.executable, "-m", "kvstored.bench.engines_peer", "--runner", runner,
            *(f"--{name.replace('_', '-')}={value}" for name, value in geometry.items()),
            *extra]
    with open(log, "wb") as err:
        try:
            done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=err, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {timeout:.0f}s; see {log}"}
    lines = done.stdout.decode(errors="replace").strip().splitlines()
    if done.returncode != 0 or not lines:
        return {"error": f"exited with {done.returncode}; see {log}"}
    document = json.loads(lines[-1])
    if "error" in document:
        document["error"] += f" (see {log})"
        return document
    return _median_rounds(document)


def evaluate_goals(results: dict[str, Any]) -> list[dict[str, Any]]:
    verdicts: list[dict[str, Any]] = []
    for goal, ours, theirs, figure, minimum in GOALS:
        a = results.get(ours, {}).get("median", {}).get(figure)
        b = results.get(theirs, {}).get("median", {}).get(figure)
        if not a or not b:
            verdicts.append({"goal": goal, "status": "not measured"})
            continue
        verdicts.append(ratio_verdict(goal, a / b, minimum))
    for runner in ("kvstored-shm", "kvstored-tcp"):
        copies = results.get(runner, {}).get("adapter_copies")
        if copies is not None:
            copied = copies["gathered_bytes"] + copies["scattered_bytes"]
            verdicts.append({"goal": f"zero copies in the adapter ({runner})",
                             "copied_bytes": copied, "met": copied == 0})
    return verdicts


def _rows(results: dict[str, Any]) -> list[list[str]]:
    reference = results.get("mooncake-embedded", {}).get("median", {})
    rows = []
    for runner in RUNNERS:
        entry = results.get(runner)
        if entry is None:
            continue
        if "error" in entry:
            rows.append([runner, "error", "", "", "", ""])
            continue
        median = entry["median"]
        versus = [f"{median[f] / reference[f]:.2f}x" if reference.get(f) else "-"
                  for f in ("backup_gbps", "prefetch_gbps")]
        copies = entry.get("adapter_copies")
        copied = ("-" if copies is None else
                  f"{(copies['gathered_bytes'] + copies['scattered_bytes']) / 2**20:.0f} MiB")
        rows.append([runner, f"{median['backup_gbps']:.2f} GB/s",
                     f"{median['prefetch_gbps']:.2f} GB/s", f"{median['exists_ms']:.2f} ms",
                     " / ".join(versus), copied])
    return rows


HEADER = ("runner", "backup", "prefetch", "batch_exists", "vs mooncake-embedded "
          "(backup / prefetch)", "adapter copies")


def render_markdown(results: dict[str, Any]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "|".join("---" for _ in HEADER) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in _rows(results)]
    return "\n".join(lines) + "\n"


def _run(runners: list[str], geometry: dict[str, int], workdir: Path, backend: str
         ) -> tuple[dict[str, Any], dict[str, str]]:
    skipped: dict[str, str] = {}
    available, reason = probe_engine("sglang")
    if not available:
        return {}, {r: f"SGLang: {reason}" for r in runners}
    data = geometry["pages"] * geometry["rounds"] * _page_bytes(geometry)
    results: dict[str, Any] = {}
    daemon = cluster = None
    timeout = 600 + 5 * data / 2**20  # a generous bound for a slow, shared machine
    try:
        if any(r.startswith("kvstored") for r in runners):
            daemon = KvstoredDaemon(workdir / "kvstored" / "data", dram=3 * data + (256 << 20),
                                    ssd=4 * data + (1 << 30), backend=backend)
        wanted_mooncake = [r for r in runners if r.startswith("mooncake")]
        if wanted_mooncake:
            binaries, why = probe()
            if binaries is None:
                skipped.update({r: why or "Mooncake is not available" for r in wanted_mooncake})
            else:
                # Mooncake places a put in any mounted segment, so the embedded runner's
                # pages may land in the standalone client's too: room for every runner's.
                cluster = MooncakeCluster(binaries, workdir / "mooncake",
                                          len(wanted_mooncake) * data + (256 << 20))
        for runner in runners:
            if runner in skipped:
                continue
            extra: list[str] = []
            if runner.startswith("kvstored"):
                assert daemon is not None
                extra = [f"--master={daemon.address}"]
            elif runner.startswith("sglang-file"):
                extra = [f"--file-dir={workdir / runner}"]
            elif cluster is not None:
                extra = [f"--mooncake-master={cluster.master}",
                         f"--mooncake-metadata={cluster.metadata}",
                         f"--segment={data + (256 << 20)}"]
            say(f"measuring {runner}")
            results[runner] = _measure(runner, workdir, geometry, extra, timeout)
            if "error" in results[runner]:
                say(f"{runner} failed: {results[runner]['error']}")
    finally:
        if cluster is not None:
            cluster.stop()
        if daemon is not None:
            daemon.stop()
    return results, skipped


def _page_bytes(geometry: dict[str, int]) -> int:
    # K and V, per token per layer: heads x head_dim bf16 values (2 bytes) each.
    return (2 * geometry["heads"] * geometry["head_dim"] * 2 * geometry["layers"]
            * geometry["page_tokens"])


@click.command("engines")
@click.option("--pages", default=64, show_default=True, type=click.IntRange(1),
              help="Pages per round (each backed up, then prefetched).")
@click.option("--page-tokens", default=64, show_default=True, type=click.IntRange(1))
@click.option("--layers", default=32, show_default=True, type=click.IntRange(1))
@click.option("--heads", default=8, show_default=True, type=click.IntRange(1),
              help="KV heads (of one tensor-parallel rank).")
@click.option("--head-dim", default=128, show_default=True, type=click.IntRange(1))
@click.option("--batch", default=128, show_default=True, type=click.IntRange(1),
              help="Pages per storage call (SGLang's STORAGE_BATCH_SIZE is 128).")
@click.option("--rounds", default=3, show_default=True, type=click.IntRange(1),
              help="Rounds per runner; each figure is their median.")
@click.option("--runners", default=",".join(RUNNERS), show_default=True,
              help="Comma-separated runners to measure.")
@click.option("--backend", default="bucket", show_default=True, help="kvstored's SSD backend.")
@run_outputs("engines")
def engines_command(pages: int, page_tokens: int, layers: int, heads: int, head_dim: int,
                    batch: int, rounds: int, runners: str, backend: str,
                    workdir: Path | None, json_out: Path, markdown_out: Path | None) -> None:
    """kvstored as SGLang's HiCache storage against SGLang's file backend and Mooncake.

    Needs the engines (make engines). Writes every round's figures, the medians and the
    goals to --json-out and prints the table.
    """
    chosen = [r.strip() for r in runners.split(",") if r.strip()]
    unknown = sorted(set(chosen) - set(RUNNERS))
    if unknown or not chosen:
        raise click.BadParameter(f"unknown runner {unknown[0] if unknown else '(none)'!r}; "
                                 f"choose from {', '.join(RUNNERS)}", param_hint="--runners")
    geometry = {"pages": pages, "page_tokens": page_tokens, "layers": layers, "heads": heads,
                "head_dim": head_dim, "batch": batch, "rounds": rounds}

    def terminated(signum, frame) -> None:
        raise SystemExit(128 + signum)  # unwinds, so every child process is stopped

    signal.signal(signal.SIGTERM, terminated)
    temporary = workdir is None
    workdir = Path(tempfile.mkdtemp(prefix="kvstored-bench-engines-")) if temporary else workdir
    workdir.mkdir(parents=True, exist_ok=True)
    run = RunStart()
    results, skipped = _run(chosen, geometry, workdir, backend)
    failed = sorted(r for r, entry in results.items() if "error" in entry)
    if temporary and not failed:
        shutil.rmtree(workdir, ignore_errors=True)
    report = {
        **run.header("engines", (
            f"kvstore bench engines --pages {pages} --page-tokens {page_tokens} --layers "
            f"{layers} --heads {heads} --head-dim {head_dim} --batch {batch} --rounds "
            f"{rounds} --runners {','.join(chosen)}")),
        "page_bytes": _page_bytes(geometry), "geometry": geometry,
        "skipped": skipped, "results": results, "goals": evaluate_goals(results),
    }
    json_out.parent.mkdir(parents=True, exist_ok=True)
    json_out.write_text(json.dumps(report, indent=2) + "\n")
    if markdown_out is not None:
        markdown_out.parent.mkdir(parents=True, exist_ok=True)
        markdown_out.write_text(render_markdown(results))
    table = Table(title=f"SGLang HiCache storage, {_page_bytes(geometry) / 2**20:.0f} MiB "
                        f"pages, {pages} per round, median of {rounds}")
    for column in HEADER:
        table.add_column(column, justify="left" if column == "runner" else "right")
    for row in _rows(results):
        table.add_row(*row)
    console = Console(width=max(Console().width, 130))
    console.print(table)
    for runner, reason in skipped.items():
        console.print(f"skipped {runner}: {reason}", markup=False, highlight=False)
    for goal in report["goals"]:
        if "copied_bytes" in goal:
            console.print(f"goal {goal['goal']}: {goal['copied_bytes']} B "
                          f"{'met' if goal['met'] else 'MISSED'}")
        else:
            console.print(goal_line(goal))
    console.print(f"results: {json_out}")
    if any(r.startswith("kvstored") for r in failed):
        raise BenchError(f"{', '.join(failed)} failed; the JSON says how (logs under "
                         f"{workdir})")
