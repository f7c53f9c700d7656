"""``kvstore bench sim``: ``kvstore sim`` against the reference simulator's C++ backend.

Whole process to whole process, on the same trace, side by side in one run: the
reference (``python -m kvcache_sim run --backend cpp``, PyPI kvcache-simulator) and
``kvstore sim`` each replay every default budget x fifo, lru and optimal and print JSON.
Rounds alternate the two tools; each figure is the median of its rounds, and the ratio is
taken between the medians. Before timing, each tool runs once untimed (the reference
compiles its C++ core on first use; both get the trace into the page cache).

Traces: the given trace, and the same trace replicated N times with the block ids (and
timestamps) offset per copy, so every copy is new to the cache. ``kvstore sim`` also runs
on the replicated trace converted to the binary event file. Both tools' hit tokens are
compared point by point: the ratio means nothing if the answers differ.

``--string-ids`` gives both traces string block ids (16 hex digits, one distinct text
per integer id, so the replay is unchanged): both tools then intern every id, the case
of traces whose ids are hash strings.

``--large-events N`` adds a run of ``kvstore sim`` alone on a synthetic session-style
trace of N block events (long, growing agent contexts), written straight to a binary
event file: the reference cannot read it, this shows speed and memory at that scale.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import click
import numpy as np
from rich.console import Console
from rich.table import Table

from kvstored.bench import BenchError
from kvstored.errors import UnavailableError
from kvstored.params import ExistingFile
from kvstored.sdk.units import format_size
from kvstored.tools import binfile, events
from kvstored.tools.errors import TraceNotFoundError

DEFAULT_TRACE = "mooncake_conversation.jsonl"


def _default_trace() -> Path | None:
    """The shared Mooncake conversation trace, when the working directory or this checkout
    sits beside ../shared."""
    here = Path(__file__).resolve()
    for base in (Path.cwd(), *Path.cwd().parents, *here.parents):
        candidate = base / "shared" / "traces" / DEFAULT_TRACE
        if candidate.exists():
            return candidate
    return None


def replicate_jsonl(source: Path, copies: int, target: Path) -> int:
    """Write ``copies`` copies of a Mooncake JSONL trace, ids and timestamps offset per
    copy; returns the block events written."""
    records = [json.loads(line) for line in source.read_text().splitlines() if line.strip()]
    id_span = 1 + max(max(r["hash_ids"]) for r in records if r.get("hash_ids"))
    time_span = 1 + max(r.get("timestamp", 0) for r in records)
    written = 0
    with target.open("w") as out:
        for copy in range(copies):
            for record in records:
                shifted = dict(record)
                shifted["timestamp"] = record.get("timestamp", 0) + copy * time_span
                shifted["hash_ids"] = [h + copy * id_span for h in record["hash_ids"]]
                written += len(shifted["hash_ids"])
                out.write(json.dumps(shifted) + "\n")
    return written


def stringify_jsonl(source: Path, target: Path) -> None:
    """The same Mooncake JSONL with every integer block id written as a 16-hex-digit
    string (an odd multiplier mod 2**64: distinct ids stay distinct)."""
    with source.open() as lines, target.open("w") as out:
        for line in lines:
            if not line.strip():
                continue
            record = json.loads(line)
            record["hash_ids"] = [format((h * 0x9E3779B97F4A7C15 + 1) % (1 << 64), "016x")
                                  for h in record.get("hash_ids") or []]
            out.write(json.dumps(record) + "\n")


def synthetic_sessions(target_events: int, seed: int = 7) -> events.EventTrace:
    """Agent-style sessions: each request resends the session's whole context plus a few
    new blocks, sessions start together and interleave in time, as session traces are
    replayed. Ids are offset per session (hash_id_scope local)."""
    rng = np.random.default_rng(seed)
    block = 64
    sizes, starts, times, lengths = [], [], [], []
    base, total, session = 1, 0, 0
    while total < target_events:
        first = int(rng.integers(100, 400))          # system prompt + tools
        turns = int(rng.integers(20, 120))
        growth = rng.integers(2, 40, size=turns)     # new blocks per turn
        context = first + np.cumsum(growth)
        clock = np.cumsum(rng.exponential(30.0, size=turns))
        for k in range(turns):
            sizes.append(int(context[k]))
            starts.append(base)
            times.append(float(clock[k]))
            lengths.append(int(context[k]) * block - int(rng.integers(0, block)))
        base += int(context[-1]) + 1
        total += int(context.sum())
        session += 1
    order = np.argsort(np.array(times), kind="stable")
    counts = np.array(sizes, dtype=np.int64)[order]
    first_id = np.array(starts, dtype=np.int64)[order]
    offsets = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    position = np.arange(offsets[-1], dtype=np.int64) - np.repeat(offsets[:-1], counts)
    ids = np.repeat(first_id, counts) + position
    return events.build(ids, counts, np.array(lengths, dtype=np.int64)[order],
                        np.array(times)[order], np.zeros(len(counts), dtype=np.int64), block,
                        "sessions", sources=[f"synthetic sessions ({session} sessions)"])


def _peak_rss(pid: int) -> int | None:
    """The process's resident-set high-water mark (VmHWM), in bytes. Read from /proc while
    it runs: the rusage of wait4 would also count the parent's memory, since Linux keeps
    the high-water mark across the fork and exec that start a child."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _timed(argv: list[str], stdout_path: Path) -> dict:
    """Run a process to completion: wall seconds, peak RSS, exit status."""
    started = time.perf_counter()
    peak = 0
    with stdout_path.open("wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.PIPE)
        while process.poll() is None:
            peak = max(peak, _peak_rss(process.pid) or 0)
            time.sleep(0.02)
    elapsed = time.perf_counter() - started
    stderr = process.stderr.read().decode(errors="replace") if process.stderr else ""
    if process.returncode != 0:
        raise click.ClickException(f"{argv[0]} failed ({process.returncode}): {stderr[-2000:]}")
    return {"seconds": elapsed, "peakRssBytes": peak}


def _kvstore() -> list[str]:
    script = Path(sys.executable).with_name("kvstore")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "from kvstored.cli.tool import main; main()"]


def _commands(trace: Path, model: str, block_size: int, out_dir: Path) -> dict[str, list[str]]:
    return {
        "reference": [sys.executable, "-m", "kvcache_sim", "run", "--trace", str(trace),
                      "--model", model, "--block-size", str(block_size), "--format", "json",
                      "--no-progress", "--backend", "cpp"],
        "kvstore": [*_kvstore(), "sim", str(trace), "--model", model, "--block-size",
                    str(block_size), "--json"],
    }


def _hits(document: dict, reference: bool) -> dict[tuple[int, str], tuple[int, int]]:
    out = {}
    for point in document["points"]:
        for policy, result in point["results"].items():
            if reference or result["mode"] == "fixed_window":
                out[(point["cacheBlocks"], policy)] = (result["hitTokens"],
                                                       result["totalTokens"])
    return out


def _compare(ours: Path, theirs: Path) -> dict:
    mine = _hits(json.loads(ours.read_text()), reference=False)
    ref = _hits(json.loads(theirs.read_text()), reference=True)
    common = sorted(set(mine) & set(ref))
    differing = [k for k in common if mine[k] != ref[k]]
    return {"pointsCompared": len(common), "identical": not differing and bool(common),
            "differing": [list(k) for k in differing[:10]]}


def _bench_trace(label: str, trace: Path, model: str, block_size: int, rounds: int,
                 work: Path, extra: dict[str, list[str]] | None = None) -> dict:
    commands = _commands(trace, model, block_size, work)
    commands.update(extra or {})
    outputs = {name: work / f"{label}-{name}.json" for name in commands}
    for name, argv in commands.items():  # untimed warm-up
        _timed(argv, outputs[name])
    runs: dict[str, list[dict]] = {name: [] for name in commands}
    names = list(commands)
    for round_ in range(rounds):
        for name in names[round_ % len(names):] + names[:round_ % len(names)]:
            runs[name].append(_timed(commands[name], outputs[name]))
    summary = {}
    for name, measured in runs.items():
        summary[name] = {"medianSeconds": statistics.median(r["seconds"] for r in measured),
                         "minSeconds": min(r["seconds"] for r in measured),
                         "peakRssBytes": max(r["peakRssBytes"] for r in measured),
                         "rounds": [r["seconds"] for r in measured]}
    ours = json.loads(outputs["kvstore"].read_text())
    result = {
        "trace": label, "path": str(trace), "blockEvents": ours["trace"]["blockEvents"],
        "requests": ours["trace"]["requests"], "uniqueBlocks": ours["trace"]["uniqueBlocks"],
        "tools": summary,
        "speedup": summary["reference"]["medianSeconds"] / summary["kvstore"]["medianSeconds"],
        "check": _compare(outputs["kvstore"], outputs["reference"]),
        "kvstoreMemory": ours["memory"],
    }
    for name in commands:
        if name not in ("reference", "kvstore"):
            result[f"speedup_{name}"] = (summary["reference"]["medianSeconds"]
                                         / summary[name]["medianSeconds"])
    return result


def _large(events_wanted: int, work: Path, policies: str) -> dict:
    trace = synthetic_sessions(events_wanted)
    path = work / "large.kvtrace"
    binfile.write(trace, path)
    argv = [*_kvstore(), "sim", str(path), "--model", "glm-5.1", "--policies", policies,
            "--json"]
    timing = _timed(argv, work / "large.json")
    ours = json.loads((work / "large.json").read_text())
    input_bytes = trace.ids.nbytes + trace.tokens.nbytes + trace.offsets.nbytes
    return {"trace": "synthetic sessions", "blockEvents": trace.events,
            "requests": trace.requests, "uniqueBlocks": ours["trace"]["uniqueBlocks"],
            "policies": policies, "seconds": timing["seconds"],
            "peakRssBytes": timing["peakRssBytes"], "inputArrayBytes": input_bytes,
            "kvstoreMemory": ours["memory"], "points": len(ours["points"]),
            "timing": ours["timing"]}


@click.command("sim")
@click.option("--trace", type=ExistingFile(path_type=Path),
              help=f"A Mooncake JSONL trace (default: ../shared/traces/{DEFAULT_TRACE}).")
@click.option("--model", default="glm-5.1", show_default=True)
@click.option("--block-size", type=int, default=512, show_default=True)
@click.option("--replicate", type=click.IntRange(min=2), default=20, show_default=True,
              help="Copies in the replicated trace (20 x the conversation trace = 5.8M "
                   "block events).")
@click.option("--rounds", type=click.IntRange(min=1), default=3, show_default=True)
@click.option("--large-events", type=click.IntRange(min=0), default=0, show_default=True,
              help="Also run kvstore sim alone on a synthetic session trace of this many "
                   "block events (e.g. 100000000; 0: no such run).")
@click.option("--large-policies", default="fifo,lru,optimal", show_default=True)
@click.option("--string-ids", is_flag=True,
              help="Give both traces string block ids (hex texts): both tools intern them.")
@click.option("--json-out", type=click.Path(path_type=Path, dir_okay=False),
              default=Path("bench-results/sim.json"), show_default=True)
def sim(trace, model, block_size, replicate, rounds, large_events, large_policies, string_ids,
        json_out):
    """kvstore sim against the reference simulator (C++ backend), whole process to whole
    process; results go to JSON."""
    trace = trace or _default_trace()
    if trace is None:
        raise TraceNotFoundError(f"no trace given and ../shared/traces/{DEFAULT_TRACE} not "
                                 "found; pass --trace")
    try:
        import kvcache_sim  # noqa: F401
    except ImportError:
        raise UnavailableError("the reference simulator is not installed: pip install "
                               "kvcache-simulator==0.1.3") from None
    if shutil.which("c++") is None:
        raise UnavailableError("the reference's C++ backend needs a C++ compiler (c++)")
    console = Console(stderr=True)
    results = []
    with tempfile.TemporaryDirectory(prefix="kvstore-bench-sim-") as tmp:
        work = Path(tmp)
        console.print(f"trace {trace}: {rounds} rounds")
        label, source = "original", trace
        if string_ids:
            source = work / "original-string-ids.jsonl"
            stringify_jsonl(trace, source)
            label = "original, string ids"
        results.append(_bench_trace(label, source, model, block_size, rounds, work))
        replicated = work / f"replicated-{replicate}x.jsonl"
        events_written = replicate_jsonl(trace, replicate, replicated)
        if string_ids:
            stringify_jsonl(replicated, work / "replicated-strings.jsonl")
            replicated = work / "replicated-strings.jsonl"
        console.print(f"replicated x{replicate}: {events_written:,} block events")
        binary = work / "replicated.kvtrace"
        _timed([*_kvstore(), "trace", "convert", str(replicated), "--block-size",
                str(block_size), "--to", "binary", "-o", str(binary)], work / "convert.txt")
        extra = {"kvstore-binary": [*_kvstore(), "sim", str(binary), "--model", model,
                                    "--json"]}
        results.append(_bench_trace(f"replicated-{replicate}x" + (", string ids"
                                                                  if string_ids else ""),
                                    replicated, model, block_size, rounds, work, extra))
        large = None
        if large_events:
            console.print(f"synthetic sessions: {large_events:,} block events")
            large = _large(large_events, work, large_policies)
    report = {"benchmark": "sim", "machine": {"cpus": os.cpu_count(),
                                              "platform": platform.platform()},
              "model": model, "blockSize": block_size, "rounds": rounds,
              "stringIds": string_ids,
              "traces": results, "large": large}
    json_out.parent.mkdir(parents=True, exist_ok=True)
    json_out.write_text(json.dumps(report, indent=2) + "\n")
    table = Table(title="kvstore sim vs reference (C++ backend), whole process")
    for column in ("trace", "block events", "reference", "kvstore", "ratio", "kvstore binary",
                   "ratio", "same hits", "reference peak RSS", "kvstore peak RSS"):
        table.add_column(column, justify="right")
    for r in results:
        t = r["tools"]
        binary_cells = (f"{t['kvstore-binary']['medianSeconds']:.2f} s",
                        f"{r['speedup_kvstore-binary']:.2f}x") if "kvstore-binary" in t \
            else ("-", "-")
        same = "yes" if r["check"]["identical"] else "NO"
        table.add_row(r["trace"], f"{r['blockEvents']:,}",
                      f"{t['reference']['medianSeconds']:.2f} s",
                      f"{t['kvstore']['medianSeconds']:.2f} s", f"{r['speedup']:.2f}x",
                      *binary_cells, f"{r['check']['pointsCompared']} pts {same}",
                      format_size(t["reference"]["peakRssBytes"]),
                      format_size(t["kvstore"]["peakRssBytes"]))
    out = Console()
    if not out.is_terminal:  # a log file: one row per line, not wrapped at 80 columns
        out.width = 200
    out.print(table)
    if large:
        Console().print(f"synthetic sessions, {large['blockEvents']:,} events "
                        f"({large['uniqueBlocks']:,} unique), {large['policies']}: "
                        f"{large['seconds']:.1f} s, peak RSS "
                        f"{format_size(large['peakRssBytes'])}, replay memory "
                        f"{large['kvstoreMemory']['bytesPerEvent']:.1f} bytes/event")
    Console().print(f"wrote {json_out}")
    if not all(r["check"]["identical"] for r in results):
        raise BenchError(f"kvstore sim and the reference disagree on a trace; see {json_out}")
