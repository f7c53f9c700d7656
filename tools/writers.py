"""Writing event arrays back out as Mooncake JSONL, Bailian JSONL or a session file.

Every writer keeps the replay exactly: simulating the written file gives the numbers of
the original (same requests in the same order, same ids, same token weights). So:

- Mooncake and Bailian lines carry ``block_size``, and ``block_tokens`` where a request's
  weights are not the ones its input length implies;
- ids interned from strings are written back as their strings;
- a session file holds one session with ``hash_id_scope: "global"`` (ids kept as they
  are); it can only represent a trace whose timestamps never go backwards (sessions are
  replayed sorted by time) and whose ids are integers >= 0.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from kvstored.tools import binfile
from kvstored.tools.errors import UsageProblem
from kvstored.tools.events import EventTrace, block_weights
from kvstored.tools.ids import INT_KEY_LIMIT

TARGETS = ("mooncake", "bailian", "sessions", "binary")


def _open(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.name.removesuffix(".partial").endswith(".gz"):
        return gzip.open(path, "wt", encoding="utf-8")
    return path.open("w", encoding="utf-8")


def _requests(trace: EventTrace, *, names: bool) -> Iterator[tuple[int, list, list | None]]:
    """(request index, ids, explicit weights or None) in order."""
    implied = block_weights(trace.offsets, trace.input_lengths, trace.block_size)
    differs = np.flatnonzero(implied != trace.tokens)
    explicit = set(np.unique(np.searchsorted(trace.offsets, differs, side="right") - 1).tolist())
    lookup = trace.id_names
    for r in range(trace.requests):
        lo, hi = int(trace.offsets[r]), int(trace.offsets[r + 1])
        ids = trace.ids[lo:hi].tolist()
        if names and lookup:
            ids = [lookup[i - INT_KEY_LIMIT] if i >= INT_KEY_LIMIT else i for i in ids]
        weights = trace.tokens[lo:hi].tolist() if r in explicit else None
        yield r, ids, weights


def _stamp(seconds: float, scale: float) -> int | float:
    value = round(seconds * scale, 6)
    return int(value) if value == int(value) else value


def write_mooncake(trace: EventTrace, path: Path) -> None:
    with _open(path) as out:
        for r, ids, weights in _requests(trace, names=True):
            record = {"timestamp": _stamp(trace.timestamps[r], 1000.0),
                      "input_length": int(trace.input_lengths[r]),
                      "output_length": int(trace.output_lengths[r]), "hash_ids": ids,
                      "block_size": trace.block_size}
            if weights is not None:
                record["block_tokens"] = weights
            out.write(json.dumps(record) + "\n")


def write_bailian(trace: EventTrace, path: Path) -> None:
    with _open(path) as out:
        for r, ids, weights in _requests(trace, names=True):
            record = {"chat_id": r, "parent_chat_id": -1,
                      "timestamp": _stamp(trace.timestamps[r], 1.0),
                      "input_length": int(trace.input_lengths[r]),
                      "output_length": int(trace.output_lengths[r]), "type": "text",
                      "turn": 1, "hash_ids": ids, "block_size": trace.block_size}
            if weights is not None:
                record["block_tokens"] = weights
            out.write(json.dumps(record) + "\n")


def write_sessions(trace: EventTrace, path: Path) -> None:
    if trace.requests and np.any(np.diff(trace.timestamps) < 0):
        raise UsageProblem("the trace's timestamps go backwards, and sessions are replayed "
                           "sorted by time: it cannot be written as sessions without "
                           "changing the replay; keep it as mooncake or binary")
    if trace.events and (int(trace.ids.min()) < 0 or trace.id_names):
        raise UsageProblem("the trace has negative or string block ids, which session files "
                           "cannot hold; keep it as mooncake or binary")
    start = float(trace.timestamps[0]) if trace.requests else 0.0
    with _open(path) as out:
        out.write(f'{{"id": "converted", "block_size": {trace.block_size}, '
                  '"hash_id_scope": "global", "requests": [')
        for r, ids, weights in _requests(trace, names=False):
            if weights is not None:
                raise UsageProblem(f"request {r} has explicit block weights, which session "
                                   "files cannot hold; keep it as mooncake or binary")
            request = {"t": round(float(trace.timestamps[r]) - start, 9), "type": "n",
                       "in": int(trace.input_lengths[r]),
                       "out": int(trace.output_lengths[r]), "hash_ids": ids}
            out.write(("," if r else "") + json.dumps(request))
        out.write("]}\n")


def write(trace: EventTrace, target: str, path: Path) -> None:
    writers = {"mooncake": write_mooncake, "bailian": write_bailian,
               "sessions": write_sessions, "binary": binfile.write}
    if target not in writers:
        raise UsageProblem(f"unknown target format {target!r}; use one of {', '.join(TARGETS)}")
    partial = path.with_name(path.name + ".partial")
    if target == "binary":
        binfile.write(trace, path)
        return
    try:
        writers[target](trace, partial)
        partial.replace(path)
    finally:
        partial.unlink(missing_ok=True)
