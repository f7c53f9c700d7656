"""``kvstore bench``: side-by-side benchmarks that write their results as JSON.

Each benchmark runs kvstored and its peers (fio, a raw socket, memcpy, Mooncake, the
reference simulator) in one run, so that ratios, not drifting absolute times, are what
docs/benchmarks.md quotes. Each lives in its own module with its click command; the
``kvstore bench`` group that lists them is the CLI's (:mod:`kvstored.cli.bench_cmd`).

A benchmark fails with :class:`BenchError` when its subject misbehaves, and with the
error of what is missing otherwise (:class:`~kvstored.errors.UnavailableError`, an
``OSError`` with ``ENOSPC`` for a disk too small, a
:class:`~kvstored.errors.CorruptDataError` for bytes that read back wrong); the CLI's
table gives each its exit code.
"""

import errno
import os
import platform
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import click


class BenchError(Exception):
    """A benchmark whose subject failed or gave results it must not (a write refused, an
    object missing after a reopen, two tools that disagree): the message says which."""


def no_space(message: str) -> OSError:
    """The error for a disk or backend too small for a run: ``ENOSPC``, which the CLI
    ends with NO_SPACE like any full disk."""
    return OSError(errno.ENOSPC, message)


class RunStart:
    """When a run began and how busy the machine was then; :meth:`header` opens the
    run's JSON record with what every benchmark reports."""

    def __init__(self) -> None:
        self.started = time.time()
        self.load_before = os.getloadavg()[0]

    def header(self, benchmark: str, command: str) -> dict[str, Any]:
        return {
            "benchmark": benchmark, "command": command,
            "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "seconds": round(time.time() - self.started, 1),
            "machine": {"cpus": os.cpu_count(), "kernel": platform.release(),
                        "python": platform.python_version(),
                        # Other work on a shared machine moves every figure; this says
                        # how much there was (1-minute load average, before and after).
                        "load_average": [round(self.load_before, 2),
                                         round(os.getloadavg()[0], 2)]}}


def run_outputs(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The options where a benchmark keeps its stores and writes its results:
    ``--workdir``, ``--json-out`` (bench-results/NAME.json) and ``--markdown-out``."""
    options = (
        click.option("--workdir", type=click.Path(file_okay=False, path_type=Path),
                     help="Where the daemons keep their data and logs [default: a temporary "
                          "directory, removed afterwards]."),
        click.option("--json-out", type=click.Path(dir_okay=False, path_type=Path),
                     default=Path(f"bench-results/{name}.json"), show_default=True),
        click.option("--markdown-out", type=click.Path(dir_okay=False, path_type=Path),
                     help="Also write the tables as markdown (for docs/benchmarks.md)."))

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        for option in reversed(options):
            command = option(command)
        return command
    return decorate


def say(message: str) -> None:
    """Progress for whoever watches a run: on stderr, so stdout keeps only the results."""
    click.echo(message, err=True)


def ratio_verdict(goal: str, ratio: float, minimum: float) -> dict[str, Any]:
    """The JSON record of a goal that a ratio must reach: met, or short by how much."""
    return {"goal": goal, "ratio": round(ratio, 3), "minimum": minimum,
            "met": ratio >= minimum,
            "short_by_pct": round(max(0.0, (minimum - ratio) / minimum * 100), 1)}


def goal_line(goal: Mapping[str, Any]) -> str:
    """How a run prints one goal's record: its figure (a ratio, or seconds) and whether
    it is met; a goal not measured prints its status."""
    if "met" not in goal:
        return f"goal {goal['goal']}: {goal['status']}"
    figure = f"{goal['ratio']:.2f}x" if "ratio" in goal else f"{goal['seconds']:.3f} s"
    verdict = ("met" if goal["met"] else f"MISSED by {goal['short_by_pct']}%"
               if "short_by_pct" in goal else "MISSED")
    return f"goal {goal['goal']}: {figure} {verdict}"
