"""The built-in traces: small traces shipped in the package (``data/traces/``), named by
workload, so that ``kvstore sim builtin:coding-agent`` works on a fresh checkout.

Each is the output of a workload model of ``workloads`` at its default seed; nothing here
is a sample of someone's data. ``kvstore trace generate`` makes larger or other-seeded
ones.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from kvstored.tools import workloads
from kvstored.tools.errors import SHOWN_AS, UsageProblem

PREFIX = "builtin:"


def is_builtin(text: str | Path) -> bool:
    return str(text).startswith(PREFIX)


def path_of(name: str) -> Path:
    """The packaged file of built-in trace ``name``."""
    if name not in workloads.WORKLOADS:
        raise UsageProblem(f"no built-in trace {name!r}; there are "
                           f"{', '.join(PREFIX + n for n in workloads.WORKLOADS)}")
    path = Path(str(resources.files("kvstored.tools").joinpath(
        f"data/traces/{name}.jsonl.gz")))
    if not path.is_file():
        raise UsageProblem(f"the built-in trace {name} is missing from this installation "
                           f"({path}); reinstall kvstored, or make it with kvstore trace "
                           f"generate {name} -o {name}.jsonl.gz")
    return path


def resolve(text: str | Path) -> Path:
    """``builtin:NAME`` -> its file, named ``builtin:NAME`` in messages."""
    path = path_of(str(text)[len(PREFIX):])
    SHOWN_AS[str(path)] = str(text)
    return path


def catalogue() -> list[dict]:
    return [{"name": PREFIX + w.name, "format": w.format, "summary": w.summary,
             "bytes": path_of(w.name).stat().st_size} for w in workloads.WORKLOADS.values()]
