"""``kvstore bench``: side-by-side benchmarks that write their results as JSON.

Each benchmark runs kvstored and its peers (fio, a raw socket, memcpy, Mooncake, the
reference simulator) in one run, so that ratios, not drifting absolute times, are what
docs/benchmarks.md quotes.
"""

from __future__ import annotations

import click

from kvstored.cli.errors import QuietError
from kvstored.cli.exitcodes import ExitCode
from kvstored.cli.lazy import LazyGroup


class BenchError(QuietError):
    """A benchmark that cannot run here, or whose subject failed: one line, an exit code
    (FAILURE unless said otherwise)."""

    def __init__(self, message: str, code: ExitCode = ExitCode.FAILURE) -> None:
        super().__init__(message, code)

# Each benchmark lives in its own module; adding one is a line here.
BENCHMARKS: dict[str, str] = {
    "io": "kvstored.bench.io:io_command",
    "store": "kvstored.bench.store:store_command",
    "backend": "kvstored.bench.backend:backend_command",
    "sim": "kvstored.bench.sim:sim",
    "fuse": "kvstored.bench.fuse:fuse_command",
    "mixed": "kvstored.bench.mixed:mixed_command",
    "scale": "kvstored.bench.scale:scale_command",
}


@click.group(cls=LazyGroup, lazy_commands=BENCHMARKS,
             context_settings={"help_option_names": ["-h", "--help"]})
def bench() -> None:
    """Measure kvstored against its peers, side by side; results go to JSON."""
