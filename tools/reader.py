"""Loading any trace: pick the format (or detect it), read, return event arrays.

A trace is a path, ``-`` (standard input, spooled to a temporary file first), or
``builtin:NAME`` (one of the small traces shipped in the package, see ``builtin``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

from kvstored.tools import binfile, builtin, events
from kvstored.tools.errors import TraceError, TraceNotFoundError, UsageProblem, shown
from kvstored.tools.requests_jsonl import read_requests
from kvstored.tools.sessions import read_sessions, session_files
from kvstored.tools.textio import STDIN, BadLines, first_value, spooled_stdin

FORMATS = ("mooncake", "sessions", "bailian", "binary")


def detect_format(path: Path) -> str:
    """The format of one trace path, from its first record."""
    if not path.exists():
        raise TraceNotFoundError(f"{shown(path)}: no such file or directory")
    if path.is_dir():
        path = session_files(path)[0]
        value = first_value(path)
        if isinstance(value, dict) and "requests" in value:
            return "sessions"
        raise TraceError(path, "a trace directory must hold session files (objects with "
                               "requests)")
    if binfile.is_binary(path):
        return "binary"
    value = first_value(path)
    if isinstance(value, list) and value and isinstance(value[0], dict):
        value = value[0]
    if isinstance(value, dict):
        if "requests" in value:
            return "sessions"
        if "chat_id" in value:
            return "bailian"
        if "hash_ids" in value:
            return "mooncake"
    raise TraceError(path, "is not a trace this tool knows: expected Mooncake or Bailian "
                           "JSONL, session JSON, or a binary event file; give --format")


def load(paths: list[str | Path], fmt: str = "auto", block_size: int | None = None, *,
         skip_bad_lines: bool = False, keep_id_names: bool = True,
         progress: Callable[[float, float, str], None] | None = None) -> events.EventTrace:
    """Read the traces at ``paths`` (replayed one after another) into event arrays.
    ``skip_bad_lines`` leaves out (and counts) lines that are not valid records instead
    of stopping at the first; without ``keep_id_names`` the texts of string ids are not
    kept (a replay needs their keys only; converting back to JSON needs the texts).
    ``progress(done, total, label)`` hears how many bytes of a JSONL trace are read."""
    if not paths:
        raise UsageProblem("give at least one trace")
    if sum(str(p) == STDIN for p in paths) > 1:
        raise UsageProblem("standard input (-) can be read only once")
    with contextlib.ExitStack() as stack:
        resolved = [stack.enter_context(spooled_stdin()) if str(p) == STDIN
                    else builtin.resolve(p) if builtin.is_builtin(p) else Path(p)
                    for p in paths]
        trace = _load(resolved, fmt, block_size, BadLines(skip=skip_bad_lines),
                      keep_id_names, progress)
        trace.sources = [shown(p) for p in resolved]
    return trace


def _load(paths: list[Path], fmt: str, block_size: int | None, bad: BadLines,
          keep_id_names: bool = True,
          progress: Callable[[float, float, str], None] | None = None) -> events.EventTrace:
    if fmt not in (*FORMATS, "auto"):
        raise UsageProblem(f"unknown format {fmt!r}; use one of {', '.join(FORMATS)} or auto")
    if fmt == "auto":
        found = {detect_format(p) for p in paths}
        if len(found) > 1:
            raise UsageProblem(f"the traces are of different formats ({', '.join(sorted(found))}); "
                               "convert them to one first")
        fmt = found.pop()
    if fmt == "sessions":
        return read_sessions(paths, block_size, bad, progress)
    if fmt == "binary":
        traces = [binfile.read(p) for p in paths]
        try:
            return events.concatenate(traces)
        except ValueError as exc:
            raise UsageProblem(str(exc)) from None
    for p in paths:
        if not p.exists():
            raise TraceNotFoundError(f"{shown(p)}: no such file")
    return read_requests(paths, fmt, block_size, bad, keep_id_names=keep_id_names,
                         progress=progress)
