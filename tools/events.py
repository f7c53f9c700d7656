"""The event arrays: a trace as numpy arrays, whatever its file format.

Requests are replayed in array order. Request ``r`` owns the block events
``offsets[r]:offsets[r + 1]``; each event has a 64-bit block key (see ``ids``) and a token
weight. Per request there is a timestamp (seconds), the input and output lengths.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

#: The replay core counts nodes and clock ticks in 32 bits.
MAX_EVENTS = (1 << 31) - 2


@dataclass
class EventTrace:
    ids: np.ndarray            # int64 [events]: block keys
    tokens: np.ndarray         # uint32 [events]: token weight of each block
    offsets: np.ndarray        # int64 [requests + 1]
    timestamps: np.ndarray     # float64 [requests]: seconds
    input_lengths: np.ndarray  # int64 [requests]
    output_lengths: np.ndarray # int64 [requests]
    block_size: int
    format: str                # "mooncake" | "bailian" | "sessions" | "binary"
    sources: list[str] = field(default_factory=list)
    skipped: int = 0           # records without blocks, left out as the reference does
    id_names: Sequence[str] = field(default_factory=list)  # texts of interned ids
    bad_lines: dict | None = None  # with --skip-bad-lines: {"skipped": n, "examples": [...]}
    kinds: np.ndarray | None = None  # int16 [requests]: index into kind_names, -1 none
    kind_names: list[str] = field(default_factory=list)  # request types (Bailian, sessions)

    @property
    def requests(self) -> int:
        return len(self.offsets) - 1

    @property
    def events(self) -> int:
        return int(self.offsets[-1])

    def request_of_event(self) -> np.ndarray:
        """The request index of every event (int64 [events])."""
        counts = np.diff(self.offsets)
        return np.repeat(np.arange(self.requests, dtype=np.int64), counts)

    def summary(self) -> dict:
        span = float(self.timestamps.max() - self.timestamps.min()) if self.requests else 0.0
        return {
            "format": self.format,
            "sources": self.sources,
            "requests": self.requests,
            "blockEvents": self.events,
            "blockSize": self.block_size,
            "inputTokens": int(self.input_lengths.sum()),
            "blockTokens": int(self.tokens.sum(dtype=np.uint64)),
            "skippedRecords": self.skipped,
            "badLines": self.bad_lines,
            "timeSpanSeconds": span,
        }


def block_weights(offsets: np.ndarray, input_lengths: np.ndarray, block_size: int) -> np.ndarray:
    """Token weight of every block: ``max(1, min(B, L - i*B))`` for block i of a request
    of input length L; ids beyond ``ceil(L/B)`` weigh 1 token. Computed a few thousand
    requests at a time, so the temporaries stay small whatever the trace's size."""
    n = int(offsets[-1])
    out = np.empty(n, dtype=np.uint32)
    lengths = input_lengths.astype(np.int64, copy=False)
    step = 4096
    for first in range(0, len(offsets) - 1, step):
        last = min(len(offsets) - 1, first + step)
        lo, hi = int(offsets[first]), int(offsets[last])
        counts = np.diff(offsets[first:last + 1])
        remaining = np.repeat(lengths[first:last], counts)
        position = np.arange(lo, hi, dtype=np.int64)
        position -= np.repeat(offsets[first:last], counts)
        position *= block_size
        remaining -= position
        np.clip(remaining, 1, block_size, out=remaining)
        out[lo:hi] = remaining
    return out


def build(ids: np.ndarray, counts: np.ndarray, input_lengths: np.ndarray,
          timestamps: np.ndarray, output_lengths: np.ndarray, block_size: int, fmt: str, *,
          sources: list[str], skipped: int = 0, id_names: Sequence[str] | None = None,
          explicit_tokens: dict[int, list[int]] | None = None,
          kinds: list | None = None) -> EventTrace:
    """Assemble an EventTrace; ``explicit_tokens`` maps a request to its own weights,
    ``kinds`` gives each request's type (or None)."""
    offsets = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    input_lengths = np.asarray(input_lengths, dtype=np.int64)
    tokens = block_weights(offsets, input_lengths, block_size)
    for request, weights in (explicit_tokens or {}).items():
        tokens[offsets[request]:offsets[request + 1]] = weights
    return EventTrace(
        ids=np.asarray(ids, dtype=np.int64), tokens=tokens, offsets=offsets,
        timestamps=np.asarray(timestamps, dtype=np.float64), input_lengths=input_lengths,
        output_lengths=np.asarray(output_lengths, dtype=np.int64), block_size=block_size,
        format=fmt, sources=sources, skipped=skipped,
        id_names=id_names if id_names is not None else [],
        **_kind_codes(kinds))


def _kind_codes(kinds: list | None) -> dict:
    """Request types as codes; nothing when no request has one."""
    if not kinds or all(k is None for k in kinds):
        return {}
    names = sorted({str(k) for k in kinds if k is not None})
    index = {name: i for i, name in enumerate(names)}
    codes = np.array([index[str(k)] if k is not None else -1 for k in kinds], dtype=np.int16)
    return {"kinds": codes, "kind_names": names}


def concatenate(traces: list[EventTrace]) -> EventTrace:
    """Several traces replayed one after another (files given in order)."""
    if len(traces) == 1:
        return traces[0]
    sizes = {t.block_size for t in traces}
    if len(sizes) > 1:
        raise ValueError(f"the traces have different block sizes {sorted(sizes)}")
    if any(t.id_names for t in traces):
        raise ValueError("traces with string ids can only be simulated one file at a time")
    counts = np.concatenate([np.diff(t.offsets) for t in traces])
    offsets = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    return EventTrace(
        ids=np.concatenate([t.ids for t in traces]),
        tokens=np.concatenate([t.tokens for t in traces]),
        offsets=offsets,
        timestamps=np.concatenate([t.timestamps for t in traces]),
        input_lengths=np.concatenate([t.input_lengths for t in traces]),
        output_lengths=np.concatenate([t.output_lengths for t in traces]),
        block_size=traces[0].block_size, format=traces[0].format,
        sources=[s for t in traces for s in t.sources],
        skipped=sum(t.skipped for t in traces), bad_lines=traces[0].bad_lines)
