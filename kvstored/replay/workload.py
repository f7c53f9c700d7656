"""A trace as the requests an engine sends to the store: per request its arrival time,
its block keys (prefix-chained, ``keys``) and the prompt tokens each block carries.

The trace is any that ``kvstored.tools.reader`` reads (Mooncake, sessions, Bailian,
binary event files, ``builtin:NAME``); the event arrays are kept as they are and each
request's keys are made when it is sent, so a large trace costs no Python object per
block before the replay. This module describes requests; it does not send them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvstored.replay.keys import chained_keys
from kvstored.tools.events import EventTrace


@dataclass(frozen=True, slots=True)
class EngineRequest:
    """One request: its position in the trace, its arrival (seconds after the first
    request), and its blocks' ids and token weights, in prefix order."""

    index: int
    arrival: float
    ids: np.ndarray
    tokens: np.ndarray

    def keys(self, namespace: str) -> list[str]:
        return chained_keys(namespace, self.ids)


class Workload:
    """The requests of ``trace``, in trace order."""

    def __init__(self, trace: EventTrace) -> None:
        self.trace = trace
        self.start = float(trace.timestamps.min()) if trace.requests else 0.0

    def __len__(self) -> int:
        return self.trace.requests

    def request(self, index: int) -> EngineRequest:
        lo, hi = int(self.trace.offsets[index]), int(self.trace.offsets[index + 1])
        return EngineRequest(index, float(self.trace.timestamps[index]) - self.start,
                             self.trace.ids[lo:hi], self.trace.tokens[lo:hi])

    @property
    def span(self) -> float:
        """Seconds from the first request to the last."""
        if not self.trace.requests:
            return 0.0
        return float(self.trace.timestamps.max()) - self.start

    @property
    def longest(self) -> int:
        """Blocks of the longest request."""
        return int(np.diff(self.trace.offsets).max()) if self.trace.requests else 0

    @property
    def block_tokens(self) -> int:
        return self.trace.block_size
