"""A plain-Python replay of ceiling, fifo, lru and optimal, written straight from the rules
in docs/simulator.md.

It favours being obviously right over being fast: victims are found by scanning the
current leaves. It serves two purposes: an independent check of the compiled core in the
tests (same inputs, same integers), and a fallback when the core was not built (fine for
small traces, slow for large ones).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from kvstored.tools.runs import PolicySpec, RunResult

if TYPE_CHECKING:
    from kvstored.tools.core import Replay


def build_trie(ids: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    edges: dict[tuple[int, int], int] = {}
    parent = [0]
    node_of_event = np.empty(int(offsets[-1]), dtype=np.uint32)
    for r in range(len(offsets) - 1):
        at = 0
        for i in range(offsets[r], offsets[r + 1]):
            key = (at, int(ids[i]))
            node = edges.get(key)
            if node is None:
                node = len(parent)
                edges[key] = node
                parent.append(at)
            node_of_event[i] = node
            at = node
    return node_of_event, np.array(parent, dtype=np.uint32)


def next_use(node_of_event: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    requests = len(offsets) - 1
    out = np.empty(len(node_of_event), dtype=np.uint32)
    last: dict[int, int] = {}
    for r in range(requests - 1, -1, -1):
        span = range(offsets[r], offsets[r + 1])
        for i in span:
            out[i] = last.get(int(node_of_event[i]), requests + 1)
        for i in span:
            last[int(node_of_event[i])] = r
    return out


def _requests(replay: Replay):
    """(measured, [(node, tokens, next use)]) per request."""
    nodes, tokens, nexts = replay.node_of_event, replay.tokens, replay.next_use
    for r in range(replay.requests):
        span = range(replay.offsets[r], replay.offsets[r + 1])
        yield r >= replay.warmup_requests, [
            (int(nodes[i]), int(tokens[i]), int(nexts[i]) if nexts is not None else 0)
            for i in span]


def ceiling(replay: Replay) -> RunResult:
    seen: set[int] = set()
    hit = total = 0
    for measured, path in _requests(replay):
        alive = True
        for node, weight, _ in path:
            if measured:
                total += weight
                if alive and node in seen:
                    hit += weight
            if node not in seen:
                alive = False
        seen.update(node for node, _, _ in path)
    return RunResult(hit, total, False)


def run(replay: Replay, spec: PolicySpec) -> RunResult:
    capacity = spec.capacity
    parent = replay.parent
    cached: dict[int, int] = {}          # node -> key (clock, or next use)
    kids: dict[int, int] = {}            # cached children per node
    order: list[int] = []                # fifo: insertion order
    clock = 0
    filled = False
    hit = total = evictions = 0
    for r, (measured, path) in enumerate(_requests(replay)):
        if r >= replay.warmup_requests and not filled:
            return RunResult(hit, total, True)
        alive = True
        for node, weight, nxt in path:
            present = node in cached
            if measured:
                total += weight
                if alive and present:
                    hit += weight
            if alive and present and spec.policy != "fifo":
                clock += 1
                cached[node] = clock if spec.policy == "lru" else nxt
            if not present:
                alive = False
        protected = {node for node, _, _ in path if node in cached}
        for node, _, nxt in path:
            if node in cached:
                continue
            if spec.policy == "fifo":
                if len(cached) >= capacity:
                    del cached[order.pop(0)]
                    evictions += 1
                cached[node] = 0
                order.append(node)
            else:
                if len(cached) >= capacity:
                    leaves = [n for n in cached if not kids.get(n) and n not in protected]
                    if not leaves:
                        break
                    if spec.policy == "lru":
                        victim = min(leaves, key=lambda n: (cached[n], -n))
                    else:
                        victim = max(leaves, key=lambda n: (cached[n], n))
                        if cached[victim] <= nxt:
                            break
                    del cached[victim]
                    evictions += 1
                    kids[int(parent[victim])] = kids.get(int(parent[victim]), 0) - 1
                up = int(parent[node])
                if len(cached) < capacity and (up == 0 or up in cached):
                    clock += 1
                    cached[node] = clock if spec.policy == "lru" else nxt
                    kids[up] = kids.get(up, 0) + 1
                else:
                    break
            if len(cached) >= capacity and not measured:
                filled = True
    return RunResult(hit, total, not filled or total == 0, evictions=evictions)
