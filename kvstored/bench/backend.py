"""``kvstore bench backend``: the storage backends against fio, on the same file system.

For each backend, in one run and side by side with fio on a file in the same directory:

- **flush**: ``batch_write`` of 1 MiB and of 128 KiB objects, in batches as the backend's
  ``write_batch_hint()`` asks (the node's offload path), against fio sequential writes of
  the same block size and volume into a new file (``end_fsync=1``): new objects go to new
  space, and the file system's block allocation is part of the cost. fio overwriting an
  already written file (``fio-overwrite``), which skips that, is reported beside it. The
  backend's figure includes its own fsyncs.
- **read**: random stored objects of 4 KiB, 128 KiB and 1 MiB read into page-aligned
  buffers two ways: ``batch_read`` of ``--read-batch`` keys a call (runner ``backend``),
  and ``read_stream`` of ``--stream-keys`` keys a call (runner ``backend-stream``: the
  backend keeps reads in flight across its groups, so the queue does not drain at every
  ``--read-batch``), against fio random reads of the same block size over as many bytes,
  at the io engine's queue depth (32) for all. For 4 KiB objects fio also reads 8 KiB
  blocks (``fio-8k``): each 4 KiB object is an 8 KiB read (its header block and its
  value), so that is the disk's bound for a backend at that size.
- **reopen**: ``close`` then ``open_backend`` on 100k objects of 4 KiB (warm cache: the
  page cache is left alone on a shared machine).

Only the SDK is used (``open_backend``, ``write_batch_hint``, ``batch_write``,
``batch_read``, ``read_stream``, ``batch_contains``, ``close``), so any backend registered when the
benchmark runs takes part. Every backend gets O_DIRECT (``direct=True``) when it accepts
the option, as fio does; ``offset`` and ``nvmeof`` preallocate their volume, so they get
a ``capacity`` large enough for the data, and ``nvmeof`` runs on a regular file.
"""

from __future__ import annotations

import json
import mmap
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import click
import numpy as np

from kvstored.bench import BenchError, RunStart, goal_line, no_space, say
from kvstored.bench.io import QUEUE_DEPTH, Measurement, Pattern, prepare_file, run_fio
from kvstored.errors import CorruptDataError
from kvstored.sdk.errors import CapacityError
from kvstored.sdk.registry import (
    BUILTIN,
    backend_class,
    backend_options,
    known_backends,
    open_backend,
)
from kvstored.sdk.units import format_size, parse_size

KiB, MiB = 1 << 10, 1 << 20
#: The default backends, in this order, those of them that are registered.
PREFERRED = ("bucket", "offset", "file-per-key", "3fs", "nvmeof")
#: Backends that preallocate a volume of ``capacity`` bytes.
PREALLOCATED = ("offset", "nvmeof")


@dataclass(frozen=True)
class Workload:
    name: str
    kind: str  # "flush" or "read"
    object_size: int
    fio: Pattern


FLUSHES = (
    Workload("flush-1m", "flush", MiB, Pattern("seq-write-1m", True, False, MiB)),
    Workload("flush-128k", "flush", 128 * KiB, Pattern("seq-write-128k", True, False, 128 * KiB)),
)
READS = (
    Workload("read-4k", "read", 4 * KiB, Pattern("rand-read-4k", False, True, 4 * KiB)),
    Workload("read-128k", "read", 128 * KiB, Pattern("rand-read-128k", False, True, 128 * KiB)),
    Workload("read-1m", "read", MiB, Pattern("rand-read-1m", False, True, MiB)),
)
#: fio at 8 KiB beside the 4 KiB reads: what a 4 KiB object's record (header block and
#: value) costs the disk.
FIO_RECORD_4K = Pattern("rand-read-8k", False, True, 8 * KiB)
#: The read runners: ``batch_read`` calls, and ``read_stream`` calls.
BATCH, STREAM = "backend", "backend-stream"
#: (ratio label, minimum ratio to fio): the goals of issue 4, and issue 16's 4 KiB
#: streamed reads.
GOALS = (("flush-1m", 0.8), ("flush-128k", 0.8), ("read-128k", 0.8), ("read-1m", 0.8),
         ("read-4k stream", 0.7))
REOPEN_GOAL = ("bucket", 2.0)


def _footprint(objects: int, size: int) -> int:
    """Disk bytes ``objects`` records of ``size`` take at most: a 4 KiB header block and
    the value padded to 4 KiB."""
    return objects * (4 * KiB + -(-size // (4 * KiB)) * 4 * KiB)


class Subject:
    """One backend under test, opened with the options it accepts."""

    def __init__(self, name: str, root: Path, engine: str, direct: bool) -> None:
        self.name = name
        self.accepted = set(backend_options(backend_class(name)))
        self.root = root
        self.engine = engine
        self.direct = direct and "direct" in self.accepted

    def options(self, volume_bytes: int) -> dict[str, Any]:
        options: dict[str, Any] = {}
        if "engine" in self.accepted:
            options["engine"] = self.engine
        if "direct" in self.accepted:
            options["direct"] = self.direct
        if self.name in PREALLOCATED:
            options["capacity"] = int(volume_bytes * 1.25) + 256 * MiB
        if "max_value_size" in self.accepted:
            options["max_value_size"] = 16 * MiB
        return options

    def path(self, label: str) -> Path:
        base = self.root / f"{self.name}-{label}"
        return base / "volume" if self.name == "nvmeof" else base

    def open(self, label: str, volume_bytes: int):
        path = self.path(label)
        path.parent.mkdir(parents=True, exist_ok=True)
        return open_backend(self.name, path, **self.options(volume_bytes))

    def remove(self, label: str) -> None:
        shutil.rmtree(self.root / f"{self.name}-{label}", ignore_errors=True)


class Staging:
    """Page-aligned, pre-faulted memory of random bytes that values come from and
    reads land in (as the node's DRAM segment would be)."""

    def __init__(self, size: int, seed: int = 0) -> None:
        self.memory = mmap.mmap(-1, size)
        memoryview(self.memory)[:] = np.random.default_rng(seed).bytes(size)
        self.view = memoryview(self.memory)

    def slices(self, size: int, count: int) -> list[memoryview]:
        per = len(self.view) // size
        return [self.view[(i % per) * size:(i % per + 1) * size] for i in range(count)]


def _batches(backend, size: int) -> int:
    hint = backend.write_batch_hint()
    return max(1, min(hint.max_keys, hint.max_bytes // size))


def _cpu() -> float:
    times = os.times()
    return times.user + times.system


def write_objects(backend, prefix: str, count: int, size: int, staging: Staging) -> Measurement:
    """Write ``count`` objects of ``size`` in hint-sized batches; time the writes."""
    per_batch = _batches(backend, size)
    values = staging.slices(size, per_batch)
    started, cpu = time.perf_counter(), _cpu()
    for first in range(0, count, per_batch):
        n = min(per_batch, count - first)
        items = [(f"{prefix}/{first + i}", values[i]) for i in range(n)]
        for result in backend.batch_write(items):
            if not result.ok:
                message = f"{backend.name}: writing {result.key} failed: {result.error}"
                if isinstance(result.error, CapacityError):
                    raise no_space(message)
                raise BenchError(message)
    seconds = time.perf_counter() - started
    return Measurement(bytes=count * size, ops=count, seconds=seconds,
                       cpu_seconds=_cpu() - cpu)


def read_objects(backend, prefix: str, count: int, size: int, runtime: float, batch: int,
                 staging: Staging, seed: int) -> Measurement:
    """Batch-read random objects among ``prefix/0..count-1`` for ``runtime`` seconds."""
    buffers = staging.slices(size, batch)
    return _timed_reads(backend, prefix, count, size, runtime, batch, seed,
                        lambda keys: zip(keys, backend.batch_read(keys, buffers)))


def stream_objects(backend, prefix: str, count: int, size: int, runtime: float, keys: int,
                   staging: Staging, seed: int) -> Measurement:
    """``read_stream`` random objects among ``prefix/0..count-1``, ``keys`` a call (as
    many as the staging memory holds), for ``runtime`` seconds."""
    keys = max(1, min(keys, len(staging.view) // size))
    buffers = staging.slices(size, keys)
    return _timed_reads(backend, prefix, count, size, runtime, keys, seed,
                        lambda names: ((names[index], got) for index, got
                                       in backend.read_stream(names, buffers)))


def _timed_reads(backend, prefix: str, count: int, size: int, runtime: float, per_call: int,
                 seed: int, call) -> Measurement:
    """Read ``per_call`` random objects among ``prefix/0..count-1`` a ``call`` (which
    yields ``(key, result)`` for each) for ``runtime`` seconds; any result but the
    object's size fails the run."""
    rng = np.random.default_rng(seed)
    moved = ops = 0
    started, cpu = time.perf_counter(), _cpu()
    deadline = started + runtime
    while time.perf_counter() < deadline:
        keys = [f"{prefix}/{n}" for n in rng.integers(0, count, per_call).tolist()]
        for key, got in call(keys):
            if got != size:
                message = f"{backend.name}: reading {key} gave {got}, not {size} bytes"
                raise CorruptDataError(message) if got == -2 else BenchError(message)
        moved += size * per_call
        ops += per_call
    return Measurement(bytes=moved, ops=ops, seconds=time.perf_counter() - started,
                       cpu_seconds=_cpu() - cpu)


def _record(store: dict, workload: str, runner: str, m: Measurement) -> dict:
    figures = {**asdict(m), **m.figures}
    store.setdefault(workload, {}).setdefault(runner, {"rounds": []})["rounds"].append(figures)
    return figures


class Run:
    """One invocation: the directory, fio file, staging memory and settings shared by all
    backends."""

    def __init__(self, root: Path, fio: str | None, data: int, small_data: int,
                 runtime: float, rounds: int, read_batch: int, recovery_objects: int,
                 engine: str, direct: bool, say, stream_keys: int = 4096) -> None:
        self.root, self.fio, self.say = root, fio, say
        self.data, self.small_data = data, small_data
        self.runtime, self.rounds, self.read_batch = runtime, rounds, read_batch
        self.stream_keys = stream_keys
        self.recovery_objects, self.engine, self.direct = recovery_objects, engine, direct
        self.fio_file = root / "fio.dat"
        self.staging = Staging(max(64 * MiB, read_batch * MiB))

    def objects(self, workload: Workload) -> int:
        volume = self.small_data if workload.object_size < 128 * KiB else self.data
        return max(1, volume // workload.object_size)

    def fio_measure(self, workload: Workload, runner: str = "fio") -> Measurement:
        """fio on the same file system. For a flush, ``fio`` writes a new file once, as
        a backend writes new objects into new space; ``fio-overwrite`` rewrites the
        laid-out read file, which spares the file system its block allocation."""
        if self.fio is None:
            raise BenchError("fio_measure needs fio, and none was found")
        fio = self.fio
        size = self.objects(workload) * workload.object_size
        if runner == "fio-8k":
            return run_fio(fio, FIO_RECORD_4K, self.fio_file, size, self.runtime)
        if workload.kind == "flush" and runner == "fio":
            target = self.root / "fio-new.dat"
            target.unlink(missing_ok=True)
            try:
                return run_fio(fio, workload.fio, target, size, self.runtime,
                               time_based=False)
            finally:
                target.unlink(missing_ok=True)
        return run_fio(fio, workload.fio, self.fio_file, size, self.runtime)

    def runners(self, workload: Workload, round_number: int) -> list[str]:
        """This round's runners, in an order that rotates so drift favours none."""
        names = [BATCH] if workload.kind == "flush" else [BATCH, STREAM]
        if self.fio is not None:
            names += ["fio", "fio-overwrite"] if workload.kind == "flush" else ["fio"]
            if workload.name == "read-4k":
                names.append("fio-8k")
        shift = round_number % len(names)
        return names[shift:] + names[:shift]

    def bench(self, name: str) -> dict:
        subject = Subject(name, self.root, self.engine, self.direct)
        results: dict = {}
        self.say(f"== {name} ({'O_DIRECT' if subject.direct else 'buffered'}) ==")
        try:
            self._flushes(subject, results)
            self._reads(subject, results)
            reopen = self._reopen(subject) if self.recovery_objects else None
        finally:
            for label in ("flush-1m", "flush-128k", "read-4k", "reopen"):
                subject.remove(label)
        return {"direct": subject.direct, "options": _jsonable(subject.options(0)),
                "workloads": results, "reopen": reopen}

    def _flushes(self, subject: Subject, results: dict) -> None:
        for round_number in range(self.rounds):
            for workload in FLUSHES:
                count = self.objects(workload)
                for runner in self.runners(workload, round_number):
                    if runner != "backend":
                        m = self.fio_measure(workload, runner)
                    else:
                        subject.remove(workload.name)
                        backend = subject.open(workload.name,
                                               _footprint(count, workload.object_size))
                        try:
                            m = write_objects(backend, workload.name, count,
                                              workload.object_size, self.staging)
                        finally:
                            backend.close()
                    self._say(round_number, workload, runner, _record(results, workload.name,
                                                                      runner, m))

    def _reads(self, subject: Subject, results: dict) -> None:
        stores = {"read-4k": "read-4k", "read-128k": "flush-128k", "read-1m": "flush-1m"}
        small = READS[0]
        subject.remove(small.name)
        count = self.objects(small)
        backend = subject.open(small.name, _footprint(count, small.object_size))
        try:
            self.say(f"{subject.name}: storing {count} objects of 4 KiB to read back ...")
            write_objects(backend, small.name, count, small.object_size, self.staging)
        finally:
            backend.close()
        opened = {}
        try:
            for workload in READS:
                label = stores[workload.name]
                count = self.objects(workload)
                backend = opened[label] = subject.open(label, _footprint(count,
                                                                         workload.object_size))
                sample = [f"{label}/{n}" for n in range(0, count, max(1, count // 64))]
                if not all(backend.batch_contains(sample)):
                    raise BenchError(f"{subject.name}: objects written for {workload.name} "
                                     "are missing (evicted?); give the benchmark more room")
            for round_number in range(self.rounds):
                for workload in READS:
                    label = stores[workload.name]
                    for runner in self.runners(workload, round_number):
                        if runner == BATCH:
                            m = read_objects(opened[label], label, self.objects(workload),
                                             workload.object_size, self.runtime,
                                             self.read_batch, self.staging, round_number)
                        elif runner == STREAM:
                            m = stream_objects(opened[label], label, self.objects(workload),
                                               workload.object_size, self.runtime,
                                               self.stream_keys, self.staging, round_number)
                        else:
                            m = self.fio_measure(workload, runner)
                        self._say(round_number, workload, runner,
                                  _record(results, workload.name, runner, m))
        finally:
            for backend in opened.values():
                backend.close()

    def _reopen(self, subject: Subject) -> dict:
        count = self.recovery_objects
        subject.remove("reopen")
        volume = _footprint(count, 4 * KiB)
        backend = subject.open("reopen", volume)
        try:
            self.say(f"{subject.name}: storing {count} objects for the reopen test ...")
            write_objects(backend, "reopen", count, 4 * KiB, self.staging)
        finally:
            backend.close()
        seconds = []
        for _ in range(3):
            started = time.perf_counter()
            backend = subject.open("reopen", volume)
            seconds.append(time.perf_counter() - started)
            objects = backend.usage().objects
            backend.close()
            if objects != count:
                raise BenchError(f"{subject.name}: {objects} of {count} objects after reopen")
        self.say(f"{subject.name}: reopening {count} objects took "
                 + ", ".join(f"{s:.3f}" for s in seconds) + " s")
        return {"objects": count, "seconds": seconds, "median_s": statistics.median(seconds)}

    def _say(self, round_number: int, workload: Workload, runner: str, figures: dict) -> None:
        self.say(f"round {round_number + 1}/{self.rounds} {workload.name:<11} {runner:<13} "
                 f"{figures['bytes_per_s'] / 1e6:8.0f} MB/s {figures['iops']:9.0f} obj/s "
                 f"CPU {figures['cpu_pct']:4.0f}%")


def _jsonable(options: dict) -> dict:
    return {k: v for k, v in options.items() if isinstance(v, str | int | float | bool)}


def summarise(per_backend: dict) -> tuple[dict, list[dict]]:
    """Medians, ratios to fio, and the goals' verdicts."""
    ratios: dict = {}
    for name, report in per_backend.items():
        ratios[name] = {}
        for workload, runners in report["workloads"].items():
            for figures in runners.values():
                figures["median"] = {key: statistics.median(r[key] for r in figures["rounds"])
                                     for key in ("bytes_per_s", "iops", "cpu_pct")}
            for runner, suffix in ((BATCH, ""), (STREAM, " stream")):
                mine = runners.get(runner, {}).get("median")
                for peer in ("fio", "fio-overwrite", "fio-8k"):
                    if mine is None or peer not in runners:
                        continue
                    label = workload + suffix + ("" if peer == "fio" else f" vs {peer}")
                    # Objects a second against fio's blocks a second: at 8 KiB a block
                    # is one 4 KiB object's record, so bytes would halve fio's figure.
                    unit = "iops" if peer == "fio-8k" else "bytes_per_s"
                    ratios[name][label] = mine[unit] / runners[peer]["median"][unit]
    goals = []
    for name in per_backend:
        for workload, minimum in GOALS:
            ratio = ratios[name].get(workload)
            goal = f"{name} {workload} >= {minimum}x fio"
            if ratio is None:
                goals.append({"goal": goal, "status": "not measured"})
            else:
                goals.append({"goal": goal, "ratio": round(ratio, 3), "met": ratio >= minimum})
    target, limit = REOPEN_GOAL
    reopen = per_backend.get(target, {}).get("reopen")
    goal = f"{target} reopens 100k objects in < {limit} s"
    if reopen is None or reopen["objects"] < 100_000:
        goals.append({"goal": goal, "status": "not measured"})
    else:
        goals.append({"goal": goal, "seconds": round(reopen["median_s"], 3),
                      "met": reopen["median_s"] < limit})
    return ratios, goals


def table(per_backend: dict, ratios: dict) -> str:
    head = (f"{'backend':<13}{'workload':<12}{'call':<13}{'MB/s':>9}{'obj/s':>10}{'CPU%':>6}"
            f"{'fio MB/s':>10}{'vs fio':>8}{'fio-ow MB/s':>13}{'vs fio-ow':>10}"
            f"{'fio-8k IOPS':>13}{'vs fio-8k':>10}")
    lines = [head]
    for name, report in per_backend.items():
        for workload, runners in report["workloads"].items():
            first = "batch_write" if workload.startswith("flush") else "batch_read"
            for runner, call, suffix in ((BATCH, first, ""), (STREAM, "read_stream", " stream")):
                mine = runners.get(runner, {}).get("median")
                if mine is None:
                    continue
                cells = []
                for peer, unit in (("fio", "bytes_per_s"), ("fio-overwrite", "bytes_per_s"),
                                   ("fio-8k", "iops")):
                    fio = runners.get(peer, {}).get("median")
                    label = workload + suffix + ("" if peer == "fio" else f" vs {peer}")
                    ratio = ratios[name].get(label)
                    scale = 1e6 if unit == "bytes_per_s" else 1
                    cells.append("" if fio is None else f"{fio[unit] / scale:.0f}")
                    cells.append("" if ratio is None else f"{ratio:.2f}x")
                lines.append(f"{name:<13}{workload:<12}{call:<13}"
                             f"{mine['bytes_per_s'] / 1e6:>9.0f}"
                             f"{mine['iops']:>10.0f}{mine['cpu_pct']:>6.0f}"
                             f"{cells[0]:>10}{cells[1]:>8}{cells[2]:>13}{cells[3]:>10}"
                             f"{cells[4]:>13}{cells[5]:>10}")
        if report.get("reopen"):
            r = report["reopen"]
            lines.append(f"{name:<13}{'reopen':<12}{r['median_s']:>8.3f}s"
                         f"{'(' + format(r['objects'], ',') + ' objects)':>24}")
    return "\n".join(lines)


@click.command("backend")
@click.option("--dir", "directory", type=click.Path(file_okay=False, path_type=Path),
              help="Where the stores and fio's file go (the file system under test) "
                   "[default: a temporary directory, removed afterwards].")
@click.option("--backends", default=None,
              help=f"Comma-separated [default: those of {', '.join(PREFERRED)} that are "
                   "registered].")
@click.option("--data", default="2GiB", show_default=True,
              help="Bytes written per flush run, and read back at 128 KiB and 1 MiB.")
@click.option("--small-data", default=None,
              help="Bytes of 4 KiB objects to read back [default: --data / 8].")
@click.option("--runtime", default=4.0, show_default=True,
              help="Seconds per read run and per fio run.")
@click.option("--rounds", default=3, show_default=True, type=click.IntRange(1),
              help="Rounds; each figure is the median over them.")
@click.option("--read-batch", default=128, show_default=True, type=click.IntRange(1),
              help="Objects per batch_read call.")
@click.option("--stream-keys", default=4096, show_default=True, type=click.IntRange(1),
              help="Objects per read_stream call (fewer where the staging memory, 64 MiB "
                   "or 1 MiB per --read-batch, holds fewer).")
@click.option("--recovery-objects", default=100_000, show_default=True,
              type=click.IntRange(0), help="Objects for the reopen test (0 skips it).")
@click.option("--engine", default="auto", show_default=True,
              type=click.Choice(["auto", "uring", "posix"]), help="The io engine option.")
@click.option("--direct/--buffered", default=True, show_default=True,
              help="O_DIRECT for backends that accept it (fio always uses O_DIRECT).")
@click.option("--fio", "fio_path", default="fio", show_default=True, help="The fio binary.")
@click.option("--json-out", type=click.Path(dir_okay=False, path_type=Path),
              default=Path("bench-results/backend.json"), show_default=True)
def backend_command(directory: Path | None, backends: str | None, data: str,
                    small_data: str | None, runtime: float, rounds: int, read_batch: int,
                    stream_keys: int, recovery_objects: int, engine: str, direct: bool,
                    fio_path: str, json_out: Path) -> None:
    """The storage backends' flush, reads (batch_read and read_stream) and reopen, against
    fio, side by side.

    Writes every round's figures, the medians, the ratios to fio and the goals they
    meet or miss (docs/benchmarks.md) to --json-out, and prints a table. Exit codes:
    6 when the disk lacks room, 5 when a read returns corrupt data, 1 on other failures.
    """
    start = RunStart()
    try:
        data_bytes = parse_size(data)
        small_bytes = parse_size(small_data) if small_data else data_bytes // 8
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--data/--small-data") from None
    if data_bytes < 16 * MiB or small_bytes < 4 * MiB:
        raise click.BadParameter("use at least 16MiB of --data and 4MiB of --small-data")
    if backends is None:
        names = [n for n in PREFERRED if n in BUILTIN] + sorted(set(BUILTIN) - set(PREFERRED))
    else:
        names = [n.strip() for n in backends.split(",") if n.strip()]
        unknown = sorted(set(names) - set(known_backends()))
        if unknown:
            raise click.BadParameter(f"unknown backend(s) {', '.join(unknown)}; known: "
                                     f"{', '.join(known_backends())}", param_hint="--backends")
    fio = shutil.which(fio_path)
    if fio is None:
        say(f"fio ({fio_path}) is not installed (Debian: apt install fio): no ratios")
    temporary = directory is None
    root = Path(tempfile.mkdtemp(prefix="kvstored-bench-backend-")) if temporary else directory
    root.mkdir(parents=True, exist_ok=True)
    need = 3 * _footprint(data_bytes // (128 * KiB), 128 * KiB) + 2 * small_bytes + 2 * data_bytes
    free = shutil.disk_usage(root).free
    if free < need:
        raise no_space(f"{root} has {format_size(free)} free; this run needs about "
                       f"{format_size(need)}. Pass --dir elsewhere or a smaller --data.")
    run = Run(root, fio, data_bytes, small_bytes, runtime, rounds, read_batch,
              recovery_objects, engine, direct, say, stream_keys)
    per_backend = {}
    try:
        if fio is not None:
            prepare_file(run.fio_file, data_bytes, say)
        for name in names:
            per_backend[name] = run.bench(name)
    finally:
        if temporary:
            shutil.rmtree(root, ignore_errors=True)
        else:
            run.fio_file.unlink(missing_ok=True)
    ratios, goals = summarise(per_backend)
    command = (f"kvstore bench backend --backends {','.join(names)} --data {data} "
               f"--small-data {small_data or format_size(small_bytes).replace(' ', '')} "
               f"--runtime {runtime:g} --rounds {rounds} --read-batch {read_batch} "
               f"--stream-keys {stream_keys} "
               f"--recovery-objects {recovery_objects} --engine {engine} "
               f"{'--direct' if direct else '--buffered'}"
               + ("" if temporary else f" --dir {directory}"))
    report = {
        **start.header("backend", command),
        "directory": str(root), "data": data_bytes, "small_data": small_bytes,
        "runtime_s": runtime, "rounds": rounds, "read_batch": read_batch,
        "stream_keys": stream_keys,
        "queue_depth": QUEUE_DEPTH, "engine": engine, "direct": direct,
        "backends": per_backend, "ratios": ratios, "goals": goals,
    }
    if fio is not None:
        version = subprocess.run([fio, "--version"], capture_output=True, text=True)
        report["fio_version"] = version.stdout.strip()
    json_out.parent.mkdir(parents=True, exist_ok=True)
    json_out.write_text(json.dumps(report, indent=2) + "\n")
    click.echo(table(per_backend, ratios))
    for goal in goals:
        click.echo(goal_line(goal))
    click.echo(f"results: {json_out}")
