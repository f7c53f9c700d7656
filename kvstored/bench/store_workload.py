"""The workload of ``kvstore bench store``, shared by every runner (kvstored, the raw
socket, memcpy and Mooncake, which runs in its own process).

A runner is a :class:`Target`: four calls that move objects between the caller's
buffers and the store. :func:`run_ops` drives them the same way for everyone:

- ``put-single``: ``count`` objects put one call each;
- ``put-batch``:  ``count`` other objects put ``batch`` per call;
- ``get-single``: the put-single objects read back one call each;
- ``get-batch``:  the put-batch objects read back ``batch`` per call.

Values come from a pre-touched source buffer of ``batch`` slots (object ``i`` holds slot
``i % batch``) and are read into a pre-touched destination buffer of ``batch`` slots, so
no runner pays for first-touch page faults (see DESIGN.md: fresh pages are slow). The
last call of each read phase is checked against the source bytes: a fast wrong answer is
an error, not a result.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from kvstored.bench import BenchError

BATCH = 32
SIZES = (64 << 10, 1 << 20, 4 << 20)
OPS = ("put-single", "put-batch", "get-single", "get-batch")
GET_OPS = ("get-single", "get-batch")


class Target(Protocol):
    """What a runner implements. ``slots`` index the shared source/destination buffers."""

    def put_one(self, key: str, slot: int) -> None: ...

    def put_many(self, keys: Sequence[str], slots: Sequence[int]) -> None: ...

    def get_one(self, key: str, slot: int) -> int: ...

    def get_many(self, keys: Sequence[str], slots: Sequence[int]) -> list[int]: ...


@dataclass
class Buffers:
    """Source and destination slots, each ``batch`` x ``size`` bytes, pre-touched.

    ``allocate`` lets a runner place them in memory its store can reach (Mooncake's
    shared-memory pool); by default they are numpy arrays."""

    size: int
    batch: int = BATCH
    allocate: Callable[[int], np.ndarray] | None = None
    src: np.ndarray = field(init=False)
    dst: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        make = self.allocate or (lambda n: np.empty(n, dtype=np.uint8))
        self.src = make(self.size * self.batch)
        self.dst = make(self.size * self.batch)
        # Random bytes: a store that compressed or deduplicated would be caught lying.
        self.src[:] = np.random.default_rng(self.size).integers(
            0, 256, self.src.size, dtype=np.uint8)
        self.dst.fill(0)  # touch every page now, not in the first timed read

    def src_slot(self, slot: int) -> np.ndarray:
        return self.src[slot * self.size:(slot + 1) * self.size]

    def dst_slot(self, slot: int) -> np.ndarray:
        return self.dst[slot * self.size:(slot + 1) * self.size]

    def check(self, slots: Sequence[int], what: str) -> None:
        for slot in slots:
            if not np.array_equal(self.src_slot(slot), self.dst_slot(slot)):
                raise BenchError(f"{what}: slot {slot} came back with different bytes")
            self.dst_slot(slot)[:8] = 0  # so the next phase must really write it


def object_count(total: int, size: int, batch: int = BATCH) -> int:
    """Objects per phase: ``total`` bytes of ``size``, a whole number of batches, at least
    one batch."""
    return max(batch, (total // size) // batch * batch)


def keys_for(prefix: str, phase: str, count: int) -> list[str]:
    return [f"{prefix}/{phase}/{i}" for i in range(count)]


def summarize(op: str, size: int, objects: int, seconds: float,
              latencies: list[float]) -> dict[str, float | int | str]:
    """One op's figures; latencies are per call (per object for singles, per batch for
    batches), in seconds."""
    ordered = sorted(latencies)
    return {
        "op": op, "object_size": size, "objects": objects, "bytes": objects * size,
        "seconds": seconds, "calls": len(latencies),
        "bytes_per_s": objects * size / seconds if seconds > 0 else 0.0,
        "objects_per_s": objects / seconds if seconds > 0 else 0.0,
        "p50_us": statistics.median(ordered) * 1e6 if ordered else 0.0,
        "p99_us": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1e6
        if ordered else 0.0,
    }


def _expect(sizes: Sequence[int], size: int, keys: Sequence[str], what: str) -> None:
    for key, got in zip(keys, sizes):
        if got != size:
            raise BenchError(f"{what}: {key!r} returned {got}, expected {size} bytes")


def _singles(target: Target, buffers: Buffers, op: str, keys: list[str]) -> dict:
    size, batch = buffers.size, buffers.batch
    latencies = []
    clock = time.perf_counter
    started = clock()
    for i, key in enumerate(keys):
        t0 = clock()
        if op == "put-single":
            target.put_one(key, i % batch)
        else:
            got = target.get_one(key, i % batch)
            if got != size:
                raise BenchError(f"{op}: {key!r} returned {got}, expected {size} bytes")
        latencies.append(clock() - t0)
    seconds = clock() - started
    if op == "get-single":
        buffers.check([(len(keys) - 1) % batch], op)
    return summarize(op, size, len(keys), seconds, latencies)


def _batches(target: Target, buffers: Buffers, op: str, keys: list[str]) -> dict:
    size, batch = buffers.size, buffers.batch
    latencies = []
    clock = time.perf_counter
    slots = list(range(batch))
    started = clock()
    for start in range(0, len(keys), batch):
        chunk = keys[start:start + batch]
        t0 = clock()
        if op == "put-batch":
            target.put_many(chunk, slots[:len(chunk)])
        else:
            _expect(target.get_many(chunk, slots[:len(chunk)]), size, chunk, op)
        latencies.append(clock() - t0)
    seconds = clock() - started
    if op == "get-batch":
        buffers.check(slots[:len(keys) - (len(keys) - 1) // batch * batch], op)
    return summarize(op, size, len(keys), seconds, latencies)


def run_op(target: Target, buffers: Buffers, op: str, keys: list[str]) -> dict:
    """Run one op over ``keys``; its summary (see :func:`summarize`)."""
    if op.endswith("-single"):
        return _singles(target, buffers, op, keys)
    return _batches(target, buffers, op, keys)


def run_ops(target: Target, buffers: Buffers, prefix: str, count: int,
            ops: Sequence[str] = OPS) -> dict[str, dict]:
    """Put then get ``count`` objects per op (see the module docstring)."""
    single, batched = keys_for(prefix, "single", count), keys_for(prefix, "batch", count)
    out = {}
    for op in ops:
        out[op] = run_op(target, buffers, op, single if op.endswith("-single") else batched)
    return out


DROP_CACHES = "/proc/sys/vm/drop_caches"


def drop_page_cache() -> str | None:
    """Write back dirty pages and drop the page cache, so SSD reads come from the disk.
    None when done; otherwise why not (not root, a read-only /proc in a container)."""
    os.sync()
    try:
        with open(DROP_CACHES, "w") as f:
            f.write("3\n")
    except OSError as exc:
        return (f"cannot write {DROP_CACHES} ({exc.strerror or exc}); SSD figures may "
                "include page-cache hits. Run as root, outside a read-only container.")
    return None
