"""Reader of session traces (Claude Code captures in the kv-cache-tester layout).

A session is ``{"id", "block_size": 64, "hash_id_scope": "local", "requests": [...]}``
and a request ``{"t": seconds from the session start, "in", "out", "hash_ids", ...}``.
A request may hold a nested sub-agent group in its own ``requests`` list, whose ``t`` are
relative to the request's ``t`` - or, where the session (or the request holding the
group) says ``"subagent_time": "absolute"``, counted from the session start like the
session's own. Sessions come as one JSON file each (a directory of them, taken in sorted
name order), or as a JSONL file with one session per line.

Field fallbacks (captures from other tools name them differently): the time is the
first of ``t``, ``time``, ``timestamp``; input tokens ``in``, ``input_tokens``,
``input_length``, ``prompt_tokens``; output tokens ``out``, ``output_tokens``,
``output_length``, ``completion_tokens``; the session's name ``id``, ``session_id``.
A request's ``type`` (e.g. main agent or sub-agent) is kept for the reuse statistics.

Normalisation, exactly as docs/simulator.md states it:

1. flatten every request that has hash ids (a request, then its nested group);
2. stable-sort each session's requests by ``t``;
3. make ids global per session: ``base`` starts at 1, each id becomes ``base + id``,
   then ``base += max(id) + 1`` (sessions with ``hash_id_scope: "global"`` keep their
   ids; a trace may not mix the two scopes);
4. stable-sort all requests by ``(t, ordinal)``, the ordinal being the position in the
   concatenation of the sessions in input order.

All sessions therefore start together at t = 0.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvstored.tools import events
from kvstored.tools.errors import TraceError, TraceNotFoundError, UsageProblem
from kvstored.tools.ids import fast_keys
from kvstored.tools.textio import STRICT, BadLines, json_lines, open_binary

DEFAULT_BLOCK_SIZE = 64
TIME_FIELDS = ("t", "time", "timestamp")
INPUT_FIELDS = ("in", "input_tokens", "input_length", "prompt_tokens")
OUTPUT_FIELDS = ("out", "output_tokens", "output_length", "completion_tokens")
ID_FIELDS = ("id", "session_id")
SUBAGENT_TIME = ("relative", "absolute")


def _first(entry: dict, names: tuple[str, ...], default: object = None) -> object:
    for name in names:
        if name in entry:
            return entry[name]
    return default


@dataclass
class _Request:
    t: float
    input_length: int
    output_length: int
    ids: np.ndarray
    kind: str | None = None


def session_files(path: Path) -> list[Path]:
    """The files of a session directory, in sorted name order."""
    files = sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith("."))
    if not files:
        raise TraceNotFoundError(f"{path}: the directory holds no session file")
    return files


def _sessions_in(path: Path, bad: BadLines = STRICT
                 ) -> tuple[list[tuple[dict, int | None]], bool]:
    """The sessions of one file with their line numbers (None for a whole-file JSON), and
    whether the file says true or false anywhere (then ids are checked one by one, since
    numpy would take a boolean id for 0 or 1)."""
    with open_binary(path) as handle:
        data = handle.read()
    mentions_bool = b"true" in data or b"false" in data
    try:
        whole = json.loads(data)
    except ValueError:
        whole = None
    if isinstance(whole, dict):
        return [(whole, None)], mentions_bool
    if isinstance(whole, list):
        return [(item, None) for item in whole], mentions_bool
    return [(value, number) for number, value, _ in json_lines(path, bad)], mentions_bool


def _number(value: object, what: str, where: str, path: Path, line: int | None) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TraceError(path, f"{where}: {what} must be a number, got {value!r}", line=line)
    return value


def _time_mode(holder: dict, inherited: str, path: Path, line: int | None, where: str) -> str:
    mode = holder.get("subagent_time", inherited)
    if mode not in SUBAGENT_TIME:
        raise TraceError(path, f"{where}: subagent_time must be relative or absolute, got "
                               f"{mode!r}", line=line)
    return mode


def _flatten(entries: object, base_t: float, out: list[_Request], path: Path,
             line: int | None, label: str, check_bools: bool, time_mode: str) -> None:
    """Append the requests of ``entries`` (and of their nested groups) to ``out``;
    ``base_t`` is what their times count from."""
    if not isinstance(entries, list):
        raise TraceError(path, f"{label}: requests is not a list", line=line)
    for index, entry in enumerate(entries):
        where = f"{label}, request {index}"
        if not isinstance(entry, dict):
            raise TraceError(path, f"{where}: is not an object", line=line)
        t = base_t + _number(_first(entry, TIME_FIELDS, 0), "t", where, path, line)
        hash_ids = entry.get("hash_ids")
        if hash_ids:
            if not isinstance(hash_ids, list):
                raise TraceError(path, f"{where}: hash_ids is not a list", line=line)
            length = _first(entry, INPUT_FIELDS)
            if isinstance(length, bool) or not isinstance(length, int) or length <= 0:
                raise TraceError(path, f"{where}: 'in' (input tokens) must be a positive "
                                       f"integer, got {length!r}", line=line)
            ids = fast_keys(hash_ids)
            if ids is None or ids.min() < 0 or (
                    check_bools and any(type(v) is bool for v in hash_ids)):
                raise TraceError(path, f"{where}: hash_ids of a session must be integers "
                                       ">= 0", line=line)
            output = _number(_first(entry, OUTPUT_FIELDS, 0), "out", where, path, line)
            kind = entry.get("type")
            out.append(_Request(t, length, int(output), ids,
                                str(kind) if kind is not None else None))
        if entry.get("requests") is not None:
            mode = _time_mode(entry, time_mode, path, line, where)
            _flatten(entry["requests"], t if mode == "relative" else 0.0, out, path, line,
                     f"{where} (nested group)", check_bools, mode)


def read_sessions(paths: list[Path], block_size: int | None, bad: BadLines = STRICT,
                  progress: Callable[[float, float, str], None] | None = None
                  ) -> events.EventTrace:
    """Read session files or directories into event arrays, normalised. With a skipping
    ``bad``, a session that is not valid is left out and counted. ``progress(done,
    total, label)`` counts the sessions of each file."""
    files: list[Path] = []
    for path in paths:
        if not path.exists():
            raise TraceNotFoundError(f"{path}: no such file or directory")
        files.extend(session_files(path) if path.is_dir() else [path])
    requests: list[_Request] = []
    base = 1
    scopes: set[str] = set()
    trace_block: int | None = None
    skipped = 0
    for index, path in enumerate(files):
        sessions, check_bools = _sessions_in(path, bad)
        of_files = f" (file {index + 1} of {len(files)})" if len(files) > 1 else ""
        for number, (session, line) in enumerate(sessions):
            if progress is not None and number % 64 == 0:
                progress(number, len(sessions), f"reading the trace: {number:,} of "
                                                f"{len(sessions):,} sessions{of_files}")
            try:
                got = _session(path, number, session, line, check_bools, trace_block, scopes)
            except TraceError as exc:
                bad.add(exc)
                continue
            if got is None:
                skipped += 1
                continue
            flat, trace_block, scope = got
            scopes.add(scope)
            if scope == "local":
                top = max(int(r.ids.max()) for r in flat)
                for r in flat:
                    r.ids = r.ids + base
                base += top + 1
            requests.extend(flat)
    if not requests:
        raise TraceError(", ".join(map(str, paths)), "holds no request with hash_ids")
    order = np.argsort(np.array([r.t for r in requests], dtype=np.float64), kind="stable")
    ordered = [requests[i] for i in order]
    counts = np.array([len(r.ids) for r in ordered], dtype=np.int64)
    if int(counts.sum()) > events.MAX_EVENTS:
        raise UsageProblem(f"the trace has {int(counts.sum())} block events; the simulator "
                           f"handles at most {events.MAX_EVENTS}")
    trace = events.build(
        np.concatenate([r.ids for r in ordered]), counts,
        np.array([r.input_length for r in ordered], dtype=np.int64),
        np.array([r.t for r in ordered], dtype=np.float64),
        np.array([r.output_length for r in ordered], dtype=np.int64),
        trace_block or block_size or DEFAULT_BLOCK_SIZE, "sessions",
        sources=[str(p) for p in paths], skipped=skipped,
        kinds=[r.kind for r in ordered])
    if bad.skip:
        trace.bad_lines = bad.to_dict()
    return trace


def _session(path: Path, number: int, session: object, line: int | None, check_bools: bool,
             trace_block: int | None, scopes: set[str]
             ) -> tuple[list[_Request], int | None, str] | None:
    """One session's requests, flattened and sorted, with the trace's block size and the
    session's id scope; None when it has no request with hash ids. Changes nothing."""
    label = f"session {_first(session, ID_FIELDS, number)!r}" \
        if isinstance(session, dict) else f"session {number}"
    if not isinstance(session, dict) or "requests" not in session:
        raise TraceError(path, f"{label}: is not a session object with requests",
                         line=line)
    size = session.get("block_size")
    if size is not None:
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            raise TraceError(path, f"{label}: block_size must be a positive "
                                   f"integer, got {size!r}", line=line)
        if trace_block is not None and size != trace_block:
            raise TraceError(path, f"{label}: block_size {size} differs from "
                                   f"{trace_block}; a trace has one block size",
                             line=line)
        trace_block = size
    scope = session.get("hash_id_scope", "local")
    if scope not in ("local", "global"):
        raise TraceError(path, f"{label}: hash_id_scope must be local or global, "
                               f"got {scope!r}", line=line)
    if scopes and scope not in scopes:
        raise TraceError(path, f"{label}: mixes hash_id_scope local and global in "
                               "one trace", line=line)
    mode = _time_mode(session, "relative", path, line, label)
    flat: list[_Request] = []
    _flatten(session["requests"], 0.0, flat, path, line, label, check_bools, mode)
    if not flat:
        return None
    flat.sort(key=lambda r: r.t)  # list.sort is stable
    return flat, trace_block, scope

