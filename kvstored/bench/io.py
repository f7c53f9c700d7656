"""``kvstore bench io``: the io engines against fio, pattern by pattern, in one run.

Four patterns on one file of at least 4 GiB, every read with O_DIRECT so that the page
cache cannot stand in for the disk:

- seq-read-1m:     sequential reads, 1 MiB blocks, queue depth 32;
- rand-read-256k:  random reads, 256 KiB blocks, QD 32;
- rand-read-4k:    random reads, 4 KiB blocks, QD 32 (IOPS);
- seq-write-1m:    sequential writes, 1 MiB blocks, QD 32, O_DIRECT, then fdatasync.

Runners: fio (``ioengine=io_uring``, its defaults otherwise), the uring engine (with its
staging buffer registered as a fixed buffer, as the node does, reading through
``read_stream`` so that the next batch is in flight while one is checked), ``uring-sync``
(the same engine waiting for each batch before it starts the next, as ``read`` does; not
run by default), the posix engine as shipped
(a pool of 4 threads) and the posix engine on one thread (queue depth 1). Every pattern runs
each runner back to back, in an order that rotates by round; each figure is the median of
its rounds. Ratios to fio come from the same run. CPU is the process's user+system time
over wall time (100% = one vCPU), for fio as it reports it.
"""

from __future__ import annotations

import errno
import json
import mmap
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from itertools import repeat
from pathlib import Path

import click
import numpy as np

from kvstored.bench import BenchError, RunStart, goal_line, no_space, ratio_verdict, say
from kvstored.native import IoEngine, IoError, probe_uring
from kvstored.native.posix import PosixEngine
from kvstored.native.uring import UringEngine
from kvstored.sdk.units import format_size, parse_size

QUEUE_DEPTH = 32
MIN_SIZE = 4 << 30
STAGING_BYTES = 128 << 20  # per batch: deep enough that the queue rarely drains


@dataclass(frozen=True)
class Pattern:
    name: str
    write: bool
    random: bool
    block: int

    @property
    def fio_rw(self) -> str:
        return ("rand" if self.random else "") + ("write" if self.write else "read")


PATTERNS = (
    Pattern("seq-read-1m", write=False, random=False, block=1 << 20),
    Pattern("rand-read-256k", write=False, random=True, block=256 << 10),
    Pattern("rand-read-4k", write=False, random=True, block=4 << 10),
    Pattern("seq-write-1m", write=True, random=False, block=1 << 20),
)

#: Goals of issues 3 and 16: (pattern, runner, versus, minimum ratio, measure).
GOALS = (
    ("seq-read-1m", "uring", "fio", 0.9, "bytes_per_s"),
    ("rand-read-256k", "uring", "fio", 0.9, "bytes_per_s"),
    ("rand-read-4k", "uring", "fio", 0.9, "iops"),  # issue 16 (0.7 in issue 3)
    ("rand-read-4k", "uring", "posix", 2.0, "iops"),
)


@dataclass
class Measurement:
    bytes: int
    ops: int
    seconds: float
    cpu_seconds: float

    @property
    def figures(self) -> dict[str, float]:
        return {"bytes_per_s": self.bytes / self.seconds, "iops": self.ops / self.seconds,
                "cpu_pct": 100 * self.cpu_seconds / self.seconds}


# -- runners -----------------------------------------------------------------------------


def run_fio(fio: str, pattern: Pattern, path: Path, size: int, runtime: float, *,
            time_based: bool = True) -> Measurement:
    """One fio job; ``time_based=False`` moves ``size`` bytes once instead of looping for
    ``runtime`` seconds (to write a new file exactly once, say)."""
    timing = ["--time_based", f"--runtime={max(1, round(runtime))}"] if time_based else []
    command = [fio, "--name=kvstored-bench-io", f"--filename={path}", f"--size={size}",
               f"--rw={pattern.fio_rw}", f"--bs={pattern.block}", "--direct=1",
               "--ioengine=io_uring", f"--iodepth={QUEUE_DEPTH}", "--norandommap",
               "--randrepeat=0", *timing, "--output-format=json"]
    if pattern.write:
        command.append("--end_fsync=1")
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise BenchError(f"fio failed on {pattern.name}: {done.stderr.strip()}")
    report = json.loads(done.stdout[done.stdout.index("{"):])
    job = report["jobs"][0]
    side = job["write" if pattern.write else "read"]
    seconds = side["runtime"] / 1000
    return Measurement(bytes=side["io_bytes"], ops=side["total_ios"], seconds=seconds,
                       cpu_seconds=(job["usr_cpu"] + job["sys_cpu"]) / 100 * seconds)


def make_staging(size: int) -> mmap.mmap:
    """The buffer every engine run reads into and writes from: allocated and touched once
    (fresh pages are slow here), filled with incompressible bytes."""
    staging = mmap.mmap(-1, min(STAGING_BYTES, size))
    tile = np.random.default_rng(0).bytes(1 << 20)
    for start in range(0, len(staging), len(tile)):
        staging[start:start + len(tile)] = tile[:len(staging) - start]
    return staging


def run_engine(engine: IoEngine, pattern: Pattern, path: Path, size: int,
               runtime: float, staging: mmap.mmap, seed: int, *, ahead: int = 1) -> Measurement:
    """The pattern through ``engine``'s streams (``read_stream``/``write_stream``): batches
    of up to 1024 blocks, the next one in flight while this one's results are checked, as
    fio keeps its queue full (the posix engine runs each batch to the end instead).
    ``ahead=0`` waits for each batch before it starts the next, as ``read`` does."""
    batch = max(QUEUE_DEPTH, min(1024, len(staging) // pattern.block // 2))
    engine.register_buffer(staging)  # False on posix, or when RLIMIT_MEMLOCK is too low
    # Two sets of buffers: one batch's reads land in one while the next fills the other.
    halves = [[memoryview(staging)[(half * batch + i) * pattern.block:
                                   (half * batch + i + 1) * pattern.block]
               for i in range(batch)] for half in (0, 1)]
    blocks = size // pattern.block
    rng = np.random.default_rng(seed)
    stream = engine.write_stream if pattern.write else engine.read_stream
    moved = ops = 0
    flags = os.O_RDWR if pattern.write else os.O_RDONLY
    with engine.open(path, flags, direct=True) as f:
        if not f.direct:
            raise BenchError(f"{path} refuses O_DIRECT; put --file on a real disk")
        started, cpu_started = time.perf_counter(), _cpu_seconds()
        deadline = started + runtime

        def batches() -> Iterator[list]:
            position = 0
            number = 0
            while time.perf_counter() < deadline:
                if pattern.random:
                    offsets = (rng.integers(0, blocks, batch) * pattern.block).tolist()
                else:
                    offsets = [((position + i) % blocks) * pattern.block for i in range(batch)]
                    position = (position + batch) % blocks
                yield list(zip(repeat(f), offsets, halves[number % 2]))
                number += 1

        for results in stream(batches(), ahead=ahead):
            for result in results:
                if isinstance(result, IoError):
                    raise BenchError(f"{engine.name} failed on {pattern.name}: {result}")
                moved += result
            ops += len(results)
        if pattern.write:
            (synced,) = engine.fsync([f])
            if isinstance(synced, IoError):
                raise BenchError(str(synced))
        seconds = time.perf_counter() - started
        cpu = _cpu_seconds() - cpu_started
    return Measurement(bytes=moved, ops=ops, seconds=seconds, cpu_seconds=cpu)


def _cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


# -- the run -----------------------------------------------------------------------------


def prepare_file(path: Path, size: int, say: Callable[[str], None]) -> None:
    """Makes ``path`` at least ``size`` bytes of incompressible data (kept between runs)."""
    if path.exists() and path.stat().st_size >= size:
        return
    free = shutil.disk_usage(path.parent).free + (path.stat().st_size if path.exists() else 0)
    if free < size:
        raise no_space(f"{path.parent} has {format_size(free)} free; the benchmark file "
                       f"needs {format_size(size)}. Pass --file elsewhere or a smaller --size.")
    say(f"writing the {format_size(size)} benchmark file {path} ...")
    engine = PosixEngine(queue_depth=QUEUE_DEPTH)
    staging = make_staging(64 << 20)
    with engine.open(path, os.O_RDWR | os.O_CREAT, direct=True) as f:
        step = 1 << 20
        for start in range(0, size, len(staging)):
            items = [(f, at, memoryview(staging)[at - start:at - start + step])
                     for at in range(start, min(size, start + len(staging)), step)]
            for result in engine.write(items):
                if isinstance(result, IoError):
                    message = f"could not write the benchmark file: {result}"
                    raise no_space(message) if result.errno == errno.ENOSPC else \
                        BenchError(message)
        engine.fsync([f])


def _runners(fio: str, names: list[str]) -> tuple[dict, dict[str, str]]:
    runners, skipped = {}, {}
    for name in names:
        if name == "fio":
            found = shutil.which(fio)
            if found:
                runners[name] = found
            else:
                skipped[name] = f"{fio} is not installed (Debian: apt install fio)"
        elif name in ("uring", "uring-sync"):
            available, reason = probe_uring()
            if available:
                runners[name] = UringEngine(queue_depth=QUEUE_DEPTH)
            else:
                skipped[name] = reason
        elif name == "posix":
            runners[name] = PosixEngine(queue_depth=QUEUE_DEPTH)
        elif name == "posix-qd1":
            runners[name] = PosixEngine(queue_depth=QUEUE_DEPTH, threads=1)
        else:
            raise click.BadParameter(f"unknown runner {name!r}; choose from "
                                     f"fio, uring, uring-sync, posix, posix-qd1",
                                     param_hint="--runners")
    return runners, skipped


def _patterns(names: str) -> tuple[Pattern, ...]:
    by_name = {p.name: p for p in PATTERNS}
    chosen = []
    for name in (n.strip() for n in names.split(",")):
        if name and name not in by_name:
            raise click.BadParameter(f"unknown pattern {name!r}; choose from "
                                     f"{', '.join(by_name)}", param_hint="--patterns")
        if name and by_name[name] not in chosen:
            chosen.append(by_name[name])
    if not chosen:
        raise click.BadParameter("name at least one pattern", param_hint="--patterns")
    return tuple(chosen)


def _ratios(results: dict, patterns: tuple[Pattern, ...]) -> dict:
    ratios = {}
    for pattern in patterns:
        medians = {name: r["median"] for name, r in results[pattern.name].items()}
        measure = "iops" if pattern.block < (64 << 10) else "bytes_per_s"
        ratios[pattern.name] = {"measure": measure}
        for name, figures in medians.items():
            if "fio" in medians and name != "fio":
                ratios[pattern.name][f"{name}/fio"] = figures[measure] / medians["fio"][measure]
        if "uring" in medians and "posix" in medians:
            ratios[pattern.name]["uring/posix"] = (medians["uring"][measure]
                                                   / medians["posix"][measure])
    return ratios


def _goals(results: dict) -> list[dict]:
    verdicts = []
    for pattern, runner, versus, minimum, measure in GOALS:
        medians = results.get(pattern, {})
        if runner not in medians or versus not in medians:
            verdicts.append({"goal": f"{pattern}: {runner} >= {minimum}x {versus}",
                             "status": "not measured"})
            continue
        ratio = medians[runner]["median"][measure] / medians[versus]["median"][measure]
        verdicts.append(ratio_verdict(f"{pattern}: {runner} >= {minimum}x {versus} ({measure})",
                                      ratio, minimum))
    return verdicts


def _table(results: dict, ratios: dict, patterns: tuple[Pattern, ...]) -> str:
    lines = [f"{'pattern':<16}{'runner':<11}{'MB/s':>9}{'IOPS':>10}{'CPU%':>7}{'vs fio':>8}"]
    for pattern in patterns:
        for name, r in results[pattern.name].items():
            m = r["median"]
            ratio = ratios[pattern.name].get(f"{name}/fio")
            lines.append(f"{pattern.name:<16}{name:<11}{m['bytes_per_s'] / 1e6:>9.0f}"
                         f"{m['iops']:>10.0f}{m['cpu_pct']:>7.0f}"
                         f"{'' if ratio is None else f'{ratio:.2f}x':>8}")
    return "\n".join(lines)


@click.command("io")
@click.option("--file", "file_path", type=click.Path(dir_okay=False, path_type=Path),
              help="The benchmark file, kept for the next run [default: a temporary file, "
                   "removed afterwards].")
@click.option("--size", default="4GiB", show_default=True,
              help="File size; at least 4 GiB keeps the device cache honest.")
@click.option("--runtime", default=5.0, show_default=True,
              help="Seconds per runner, pattern and round.")
@click.option("--rounds", default=3, show_default=True, type=click.IntRange(1),
              help="Rounds; each figure is the median over them.")
@click.option("--runners", default="fio,uring,posix,posix-qd1", show_default=True,
              help="Comma-separated: fio, uring, uring-sync (the uring engine waiting for "
                   "each batch before the next, as read() does), posix, posix-qd1.")
@click.option("--patterns", "pattern_names", default=",".join(p.name for p in PATTERNS),
              show_default=True, help="Comma-separated patterns to run.")
@click.option("--fio", "fio_path", default="fio", show_default=True, help="The fio binary.")
@click.option("--json-out", type=click.Path(dir_okay=False, path_type=Path),
              default=Path("bench-results/io.json"), show_default=True)
def io_command(file_path: Path | None, size: str, runtime: float, rounds: int, runners: str,
               pattern_names: str, fio_path: str, json_out: Path) -> None:
    """The io engines (uring, posix) against fio on the same file and patterns.

    Writes every round's figures, the medians, the ratios to fio and the goals they meet
    or miss (docs/benchmarks.md) to --json-out. Exit codes: 6 when the disk lacks room
    for the file, 1 on an I/O error.
    """
    run = RunStart()
    try:
        size_bytes = parse_size(size)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--size") from None
    if size_bytes < 64 << 20:
        raise click.BadParameter("use at least 64MiB", param_hint="--size")
    if size_bytes < MIN_SIZE:
        say(f"note: {format_size(size_bytes)} is below the 4 GiB the figures in "
            f"docs/benchmarks.md use; the device cache may flatter small files")
    patterns = _patterns(pattern_names)
    active, skipped = _runners(fio_path, [n.strip() for n in runners.split(",") if n.strip()])
    for name, reason in skipped.items():
        say(f"skipping {name}: {reason}")
    temporary = None
    if file_path is None:
        temporary = Path(tempfile.mkdtemp(prefix="kvstored-bench-io-"))
        file_path = temporary / "data"
    try:
        prepare_file(file_path, size_bytes, say)
        staging = make_staging(size_bytes)
        results: dict = {p.name: {name: {"rounds": []} for name in active} for p in patterns}
        for round_number in range(rounds):
            order = list(active)
            order = order[round_number % len(order):] + order[:round_number % len(order)]
            for pattern in patterns:
                for name in order:
                    if name == "fio":
                        m = run_fio(active[name], pattern, file_path, size_bytes, runtime)
                    else:
                        m = run_engine(active[name], pattern, file_path, size_bytes, runtime,
                                       staging, seed=round_number,
                                       ahead=0 if name == "uring-sync" else 1)
                    figures = m.figures
                    results[pattern.name][name]["rounds"].append({**asdict(m), **figures})
                    say(f"round {round_number + 1}/{rounds} {pattern.name:<15} {name:<10} "
                        f"{figures['bytes_per_s'] / 1e6:8.0f} MB/s {figures['iops']:9.0f} IOPS "
                        f"CPU {figures['cpu_pct']:4.0f}%")
    finally:
        if temporary is not None:
            shutil.rmtree(temporary, ignore_errors=True)
    for per_runner in results.values():
        for r in per_runner.values():
            r["median"] = {key: statistics.median(x[key] for x in r["rounds"])
                           for key in ("bytes_per_s", "iops", "cpu_pct")}
    ratios = _ratios(results, patterns)
    report = {
        **run.header("io", f"kvstore bench io --size {size} --runtime {runtime:g} --rounds "
                           f"{rounds} --runners {runners} --patterns "
                           f"{','.join(p.name for p in patterns)}"
                           + (f" --file {file_path}" if temporary is None else "")),
        "file": str(file_path), "size": size_bytes, "runtime_s": runtime, "rounds": rounds,
        "queue_depth": QUEUE_DEPTH, "patterns": [asdict(p) for p in patterns],
        "skipped": skipped, "results": results, "ratios": ratios, "goals": _goals(results),
    }
    if "fio" in active:
        version = subprocess.run([active["fio"], "--version"], capture_output=True, text=True)
        report["fio_version"] = version.stdout.strip()
    json_out.parent.mkdir(parents=True, exist_ok=True)
    json_out.write_text(json.dumps(report, indent=2) + "\n")
    click.echo(_table(results, ratios, patterns))
    for goal in report["goals"]:
        click.echo(goal_line(goal))
    click.echo(f"results: {json_out}")
