"""``kvstore bench store``: kvstored against Mooncake Store, a raw socket and memcpy, side
by side in one run.

Per object size (64 KiB, 1 MiB and 4 MiB by default), ``--total`` bytes per op (1 GiB),
put and get, one object per call and ``32`` per call (see store_workload):

==================  ==============================================================
runner              what it is
==================  ==============================================================
kvstored-tcp        ``kvstored up`` (a child process), client ``transport="tcp"``
kvstored-shm        the same daemon, client ``transport="shm"`` (mapped DRAM segment)
kvstored-ssd        objects flushed and evicted from DRAM, page cache dropped, gets
raw-socket          a child process answering requests with raw bytes (raw_peers)
memcpy              numpy.copyto between pre-touched buffers (raw_peers)
mooncake-remote     Mooncake pure client over TCP to a ``mooncake_client`` process
mooncake-shm        Mooncake dummy client through shared memory to that process
mooncake-ssd        Mooncake with local-disk offload, objects on disk only, gets
==================  ==============================================================

Runners that cannot run here (Mooncake not installed, say) are listed under
``skipped`` in the JSON with the reason. The goals of issue 5 are computed from this
run's figures; each is reported met, missed (by how much) or not measured.
"""

from __future__ import annotations

import json
import shutil
import signal
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from kvstored.bench import BenchError, RunStart, goal_line, ratio_verdict, run_outputs, say
from kvstored.bench.mooncake_peer import MooncakeCluster, probe
from kvstored.bench.raw_peers import MemcpyTarget, RawSocketServer, RawSocketTarget
from kvstored.bench.store_kvstored import KvstoredRunner
from kvstored.bench.store_workload import (
    BATCH,
    OPS,
    SIZES,
    Buffers,
    drop_page_cache,
    object_count,
    run_ops,
)
from kvstored.errors import StoreError
from kvstored.sdk.units import parse_size

PEERS = ("raw-socket", "memcpy", "mooncake")
#: The runners of kvstored and of Mooncake, which ``--runners`` picks from.
RUNNERS = ("kvstored-tcp", "kvstored-shm", "kvstored-ssd", "mooncake-remote", "mooncake-shm",
           "mooncake-ssd")

#: (goal, size, runner, versus, op, measure, minimum ratio). For latency the ratio is
#: theirs over ours, so that above 1 always means kvstored is better.
GOALS = (
    *((f"TCP batched get {s}: kvstored >= 1.5x Mooncake remote client", s,
       "kvstored-tcp", "mooncake-remote", "get-batch", "bytes_per_s", 1.5)
      for s in ("1MiB", "4MiB")),
    *((f"TCP batched get {s}: kvstored >= 0.7x raw Python socket", s,
       "kvstored-tcp", "raw-socket", "get-batch", "bytes_per_s", 0.7)
      for s in ("1MiB", "4MiB")),
    *((f"shm batched get {s}: kvstored >= 1.0x Mooncake shared memory", s,
       "kvstored-shm", "mooncake-shm", "get-batch", "bytes_per_s", 1.0)
      for s in ("64KiB", "1MiB", "4MiB")),
    *((f"SSD-only batched get {s}: kvstored >= 1.5x Mooncake", s,
       "kvstored-ssd", "mooncake-ssd", "get-batch", "bytes_per_s", 1.5)
      for s in ("64KiB", "1MiB", "4MiB")),
    ("single 64KiB get p50 latency: kvstored (TCP) no worse than Mooncake remote",
     "64KiB", "kvstored-tcp", "mooncake-remote", "get-single", "p50_us", 1.0),
)

#: The tables: (title, runners, ratio columns as (ours, theirs)).
TABLES = (
    ("TCP (loopback)", ("kvstored-tcp", "raw-socket", "mooncake-remote"),
     (("kvstored-tcp", "raw-socket"), ("kvstored-tcp", "mooncake-remote"))),
    ("Same-host shared memory", ("kvstored-shm", "memcpy", "mooncake-shm"),
     (("kvstored-shm", "memcpy"), ("kvstored-shm", "mooncake-shm"))),
    ("SSD-only objects, page cache dropped", ("kvstored-ssd", "mooncake-ssd"),
     (("kvstored-ssd", "mooncake-ssd"),)),
)


def _label(size: int) -> str:
    """64KiB, 1MiB, 4MiB: the names the goals and the docs use."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if size % (1 << shift) == 0:
            return f"{size >> shift}{unit}"
    return f"{size}B"


def _figure(results: dict, size: str, runner: str, op: str, measure: str) -> float | None:
    entry = results.get(size, {}).get(runner, {})
    value = entry.get(op, {}).get(measure) if isinstance(entry, dict) else None
    return value if value else None


def ratio(results: dict, size: str, ours: str, theirs: str, op: str, measure: str
          ) -> float | None:
    """ours/theirs for throughput; theirs/ours for latency (above 1: kvstored better)."""
    a = _figure(results, size, ours, op, measure)
    b = _figure(results, size, theirs, op, measure)
    if a is None or b is None:
        return None
    return b / a if measure.endswith("_us") else a / b


def evaluate_goals(results: dict) -> list[dict[str, Any]]:
    verdicts = []
    for goal, size, ours, theirs, op, measure, minimum in GOALS:
        value = ratio(results, size, ours, theirs, op, measure)
        if value is None:
            missing = [r for r in (ours, theirs) if _figure(results, size, r, op, measure)
                       is None]
            verdicts.append({"goal": goal, "status": "not measured",
                             "missing": missing})
            continue
        verdicts.append(ratio_verdict(goal, value, minimum))
    return verdicts


def _cell(results: dict, size: str, runner: str, op: str) -> str:
    entry = results.get(size, {}).get(runner)
    if entry is None:
        return "-"
    if "error" in entry:
        return "error"
    figures = entry.get(op)
    if figures is None:
        return "-"
    text = f"{figures['bytes_per_s'] / 1e9:.2f} GB/s"
    if op.endswith("-single"):
        text += f" p50 {figures['p50_us']:.0f} µs"
    return text


def _rows(results: dict, runners: tuple[str, ...], ratios: tuple[tuple[str, str], ...]):
    for size in results:
        for op in OPS:
            cells = [_cell(results, size, r, op) for r in runners]
            if all(c == "-" for c in cells):
                continue
            shown = []
            for ours, theirs in ratios:
                value = ratio(results, size, ours, theirs, op, "bytes_per_s")
                text = "-" if value is None else f"{value:.2f}x"
                latency = ratio(results, size, ours, theirs, op, "p50_us")
                if op.endswith("-single") and latency is not None:
                    text += f" (p50 {latency:.2f}x)"
                shown.append(text)
            yield [size, op, *cells, *shown]


def render_tables(results: dict) -> list[Table]:
    tables = []
    for title, runners, ratios in TABLES:
        table = Table(title=title)
        for column in ("size", "op", *runners, *(f"{a.split('-')[0]}/{b}" for a, b in ratios)):
            table.add_column(column, justify="left" if column in ("size", "op") else "right")
        for row in _rows(results, runners, ratios):
            table.add_row(*row)
        tables.append(table)
    return tables


def render_markdown(results: dict) -> str:
    """The same tables as GitHub markdown, for docs/benchmarks.md."""
    parts = []
    for title, runners, ratios in TABLES:
        header = ["size", "op", *runners, *(f"{a.split('-')[0]}/{b}" for a, b in ratios)]
        lines = [f"**{title}**", "", "| " + " | ".join(header) + " |",
                 "|" + "|".join("---" for _ in header) + "|"]
        lines += ["| " + " | ".join(row) + " |" for row in _rows(results, runners, ratios)]
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"


def _measure_peer(name: str, size: int, count: int, say: Callable[[str], None]) -> dict:
    buffers = Buffers(size)
    if name == "memcpy":
        return run_ops(MemcpyTarget(buffers, count), buffers, "memcpy", count)
    server = RawSocketServer(size, count)
    target = RawSocketTarget(server.address, buffers)
    try:
        return run_ops(target, buffers, "raw", count)
    finally:
        target.close()
        server.stop()


def _run_mooncake(binaries: dict, workdir: Path, size: int, count: int, runners: set[str],
                  out: dict, notes: dict, say: Callable[[str], None]) -> None:
    label = _label(size)
    modes = [m for m in ("remote", "shm") if f"mooncake-{m}" in runners]
    if modes:
        # Both modes' objects (single + batch sets, twice) stay below Mooncake's eviction
        # watermark (90%); otherwise the oldest are evicted and later read as missing.
        cluster = MooncakeCluster(binaries, workdir / f"dram-{label}",
                                  segment=5 * count * size + (256 << 20))
        try:
            for mode in modes:
                say(f"{label}: mooncake-{mode} ...")
                document = cluster.measure(mode, size, count)
                out[f"mooncake-{mode}"] = (document.get("results")
                                           or {"error": document["error"]})
        finally:
            cluster.stop()
    if "mooncake-ssd" not in runners:
        return
    # SSD: a small segment, so that the objects are pushed out to disk.
    cluster = MooncakeCluster(binaries, workdir / f"ssd-{label}",
                              segment=max(256 << 20, 2 * BATCH * size),
                              ssd_dir=workdir / f"ssd-{label}" / "disk")
    try:
        say(f"{label}: mooncake-ssd (filling, then reading) ...")
        document = cluster.measure("ssd", size, count)
        out["mooncake-ssd"] = document.get("results") or {"error": document["error"]}
        notes["mooncake-ssd"] = document.get("notes", {})
    finally:
        cluster.stop()
        shutil.rmtree(workdir / f"ssd-{label}" / "disk", ignore_errors=True)


def _guarded(runner: KvstoredRunner, say: Callable[[str], None], measure: Callable,
             *args: Any) -> Any:
    """``measure(*args)``, or ``{"error": ...}``: one failure of a kvstored runner (the
    daemon dying, a wrong answer) is reported in the JSON and the run goes on."""
    try:
        return measure(*args)
    except (BenchError, StoreError) as exc:
        what = f"{type(exc).__name__}: {exc}"
        restarted = runner.ensure_running()
        say(f"FAILED: {what}" + (f"\n{restarted}" if restarted else ""))
        return {"error": what + (f" ({restarted})" if restarted else "")}


def _one_round(runner: KvstoredRunner, binaries: dict | None, sizes: list[int], total: int,
               peers: list[str], runners: set[str], workdir: Path, tag: str,
               say: Callable[[str], None]) -> tuple[dict, dict]:
    results: dict[str, dict] = {}
    notes: dict[str, Any] = {}
    for size in sizes:
        label, count = _label(size), object_count(total, size)
        out = results[label] = {}
        noted = notes[label] = {}
        buffers = Buffers(size)
        prefix = f"{label}-{tag.split('/')[0].replace(' ', '')}"
        for transport in [t for t in ("tcp", "shm") if f"kvstored-{t}" in runners]:
            say(f"{tag}{label}: kvstored-{transport} ({count} objects per op) ...")
            out[f"kvstored-{transport}"] = _guarded(
                runner, say, runner.run_dram, transport, size, count, buffers,
                f"kv-{transport}-{prefix}")
        if "kvstored-ssd" in runners:
            say(f"{tag}{label}: kvstored-ssd (flush, evict, drop caches, read) ...")
            ssd = _guarded(runner, say, runner.run_ssd, size, count, buffers,
                           f"kv-ssd-{prefix}")
            out["kvstored-ssd"], noted["kvstored-ssd"] = (ssd, {}) if "error" in ssd else ssd
        for peer in ("raw-socket", "memcpy"):
            if peer in peers:
                say(f"{tag}{label}: {peer} ...")
                out[peer] = _measure_peer(peer, size, count, say)
        if binaries is not None:
            _run_mooncake(binaries, workdir / tag, size, count, runners, out, noted,
                          lambda message: say(tag + message))
    return results, notes


def median_of_rounds(rounds: list[dict]) -> dict:
    """Per size, runner and op, the median of each figure over the rounds (``rounds_bytes_
    per_s`` keeps every round's throughput). A runner failing in some rounds is summed up
    from the others; failing in all, it keeps the first error."""
    merged: dict[str, dict] = {}
    for size in rounds[0]:
        merged[size] = {}
        for runner in rounds[0][size]:
            entries = [r[size][runner] for r in rounds if runner in r.get(size, {})]
            good = [e for e in entries if "error" not in e]
            if not good:
                merged[size][runner] = entries[0]
                continue
            per_op = {}
            for op in good[0]:
                figures = [e[op] for e in good if op in e]
                summary = {k: (statistics.median(f[k] for f in figures)
                               if isinstance(v, (int, float)) else v)
                           for k, v in figures[0].items()}
                summary["rounds_bytes_per_s"] = [f["bytes_per_s"] for f in figures]
                per_op[op] = summary
            if len(good) < len(entries):
                per_op["failed_rounds"] = [e["error"] for e in entries if "error" in e]
            merged[size][runner] = per_op
    return merged


def _run(sizes: list[int], total: int, peers: list[str], runners: set[str], backend: str,
         workdir: Path, rounds: int, say: Callable[[str], None]) -> tuple[dict, dict, dict]:
    skipped: dict[str, str] = {}
    binaries = None
    if "mooncake" in peers:
        binaries, reason = probe()
        if binaries is None:
            for runner in ("mooncake-remote", "mooncake-shm", "mooncake-ssd"):
                skipped[runner] = reason
            say(f"skipping Mooncake: {reason}")
    per_phase = max(object_count(total, s) * s for s in sizes)
    runner = KvstoredRunner(workdir / "kvstored", per_phase, backend)
    every, notes = [], {}
    try:
        for number in range(1, rounds + 1):
            tag = f"round {number}/{rounds} " if rounds > 1 else ""
            results, notes[f"round {number}"] = _one_round(
                runner, binaries, sizes, total, peers, runners, workdir / f"round-{number}",
                tag, say)
            every.append(results)
    finally:
        runner.close()
    return median_of_rounds(every), skipped, notes


@click.command("store")
@click.option("--total", default="1GiB", show_default=True,
              help="Bytes per op and object size (each put/get phase moves this much).")
@click.option("--sizes", default=",".join(_label(s) for s in SIZES), show_default=True,
              help="Comma-separated object sizes.")
@click.option("--peers", default=",".join(PEERS), show_default=True,
              help="Comma-separated: raw-socket, memcpy, mooncake (kvstored always runs).")
@click.option("--runners", default=",".join(RUNNERS), show_default=True,
              help="Comma-separated: which of kvstored's and Mooncake's runners run.")
@click.option("--rounds", default=1, show_default=True, type=click.IntRange(1),
              help="Repeat everything; each figure is the median over the rounds.")
@click.option("--backend", default="bucket", show_default=True, help="kvstored's SSD backend.")
@run_outputs("store")
def store_command(total: str, sizes: str, peers: str, runners: str, rounds: int, backend: str,
                  workdir: Path | None, json_out: Path, markdown_out: Path | None) -> None:
    """kvstored's data path against Mooncake Store, a raw socket and memcpy.

    Writes every figure, the ratios and the goals they meet or miss (docs/benchmarks.md)
    to --json-out and prints the tables. SSD-only reads drop the page cache first (root
    only; reported otherwise).
    """
    try:
        total_bytes = parse_size(total)
        size_list = [parse_size(s) for s in sizes.split(",") if s.strip()]
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    if not size_list or min(size_list) < 4096:
        raise click.BadParameter("give sizes of at least 4KiB", param_hint="--sizes")
    peer_list = [p.strip() for p in peers.split(",") if p.strip()]
    unknown = sorted(set(peer_list) - set(PEERS))
    if unknown:
        raise click.BadParameter(f"unknown peer {unknown[0]!r}; choose from "
                                 f"{', '.join(PEERS)}", param_hint="--peers")
    runner_set = {r.strip() for r in runners.split(",") if r.strip()}
    unknown = sorted(runner_set - set(RUNNERS))
    if unknown or not runner_set:
        what = f"unknown runner {unknown[0]!r}; " if unknown else "no runner given; "
        raise click.BadParameter(what + f"choose from {', '.join(RUNNERS)}",
                                 param_hint="--runners")

    def terminated(signum, frame) -> None:
        raise SystemExit(128 + signum)  # unwinds, so every child process is stopped

    signal.signal(signal.SIGTERM, terminated)
    cache = drop_page_cache()
    if cache:
        say(f"note: {cache}")
    temporary = workdir is None
    workdir = Path(tempfile.mkdtemp(prefix="kvstored-bench-store-")) if temporary else workdir
    run = RunStart()
    try:
        results, skipped, notes = _run(size_list, total_bytes, peer_list, runner_set,
                                       backend, workdir, rounds, say)
    except BenchError as exc:
        # The daemons' logs stay behind (even in a temporary directory) to explain it.
        raise BenchError(f"{exc} (logs under {workdir})") from None
    if temporary:
        shutil.rmtree(workdir, ignore_errors=True)
    for peer in ("raw-socket", "memcpy"):
        if peer not in peer_list:
            skipped[peer] = "not requested (--peers)"
    if "mooncake" not in peer_list:
        for runner in ("mooncake-remote", "mooncake-shm", "mooncake-ssd"):
            skipped[runner] = "not requested (--peers)"
    for runner in RUNNERS:
        if runner not in runner_set:
            skipped.setdefault(runner, "not requested (--runners)")
    report = {
        **run.header("store", f"kvstore bench store --total {total} --sizes {sizes} "
                              f"--peers {peers} --rounds {rounds}"
                              + (f" --runners {runners}" if runner_set != set(RUNNERS)
                                 else "")
                              + (f" --backend {backend}" if backend != "bucket" else "")),
        "total_per_op": total_bytes, "batch": BATCH, "ops": list(OPS), "rounds": rounds,
        "sizes": [_label(s) for s in size_list],
        "page_cache": {"dropped": cache is None, "reason": cache},
        "skipped": skipped, "results": results, "notes": notes,
        "goals": evaluate_goals(results),
    }
    json_out.parent.mkdir(parents=True, exist_ok=True)
    json_out.write_text(json.dumps(report, indent=2) + "\n")
    if markdown_out is not None:
        markdown_out.parent.mkdir(parents=True, exist_ok=True)
        markdown_out.write_text(render_markdown(results))
    console = Console(width=max(Console().width, 150))  # the tables are wide
    for table in render_tables(results):
        console.print(table)
    for runner, reason in skipped.items():
        console.print(f"skipped {runner}: {reason}", markup=False, highlight=False)
    for goal in report["goals"]:
        console.print(goal_line(goal))
    console.print(f"results: {json_out}")
    errors = [f"{size} {runner}" for size, per in results.items()
              for runner, entry in per.items() if "error" in entry]
    if errors:
        console.print(f"runners that failed (see the JSON): {', '.join(errors)}")
    if any(runner.startswith("kvstored") for error in errors for runner in error.split()[1:]):
        # kvstored's own failure fails the run (after the JSON)
        raise BenchError("a kvstored runner failed; the JSON says how")

