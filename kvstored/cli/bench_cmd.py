"""``kvstore bench``: the group of benchmarks; each one's command and code live in its
module of :mod:`kvstored.bench`, loaded only when it runs."""

from __future__ import annotations

import click

from kvstored.cli.lazy import LazyGroup

# Adding a benchmark is a line here.
BENCHMARKS: dict[str, str] = {
    "io": "kvstored.bench.io:io_command",
    "store": "kvstored.bench.store:store_command",
    "backend": "kvstored.bench.backend:backend_command",
    "sim": "kvstored.bench.sim:sim",
    "fuse": "kvstored.bench.fuse:fuse_command",
    "mixed": "kvstored.bench.mixed:mixed_command",
    "scale": "kvstored.bench.scale:scale_command",
    "engines": "kvstored.bench.engines:engines_command",
}


@click.group(cls=LazyGroup, lazy_commands=BENCHMARKS,
             context_settings={"help_option_names": ["-h", "--help"]})
def bench() -> None:
    """Measure kvstored against its peers, side by side; results go to JSON."""
