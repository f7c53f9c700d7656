"""The replay: every request of a workload sent to a live store as an engine sends it,
by a few worker threads, paced by the trace's arrival times or as fast as possible.

Per request, as SGLang HiCache or LMCache do against their L3 store:

1. ``prefix_hits(keys)``: how many leading blocks the store holds;
2. ``batch_get_into`` of that prefix, into the worker's buffers; each block is checked
   byte for byte against the value of its key (``values``). The request's hit is the
   leading run of blocks that arrived intact; a block announced but gone by the get (its
   eviction raced the request) ends the run, and so does a wrong one, which is also
   counted in ``wrong_bytes``: a wrong byte is a failure of the store, never a miss;
3. ``batch_put`` of every block after the hit, with its value (objects are written once,
   so blocks the store already has are left as they are).

Which tier served each block is in the get's answer (``batch_get_into(..., tiers=)``),
so it is exact at any concurrency. The master's lookup counters (``status``) are read
once before and once after the run, so that ``report`` can tell whether another client
read from the store meanwhile.

This module sends requests and records what happened; it neither predicts (``predict``)
nor summarises (``report``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kvstored.errors import BadRequestError, NoSpaceError
from kvstored.protocol import Tier
from kvstored.replay import values
from kvstored.replay.workload import EngineRequest, Workload

#: How many wrong blocks a run keeps the keys of, for the message that names them.
WRONG_EXAMPLES = 5


@dataclass(frozen=True, slots=True)
class ReplayOptions:
    block_bytes: int
    namespace: str
    concurrency: int = 1
    #: Trace seconds per wall second; None: as fast as possible.
    speed: float | None = None


@dataclass(slots=True)
class RequestOutcome:
    """What one request met. Times are seconds; ``sent`` is since the replay began."""

    index: int
    arrival: float
    sent: float = 0.0
    blocks: int = 0
    tokens: int = 0
    #: Leading blocks ``prefix_hits`` said the store holds (the get asks for these).
    announced: int = 0
    hit_blocks: int = 0
    hit_tokens: int = 0
    #: Lookups the master counted as DRAM (SSD) hits since the previous request's get
    #: (exactly this request's with one worker).
    dram_lookups: int = 0
    ssd_lookups: int = 0
    lookup_seconds: float = 0.0
    get_seconds: float | None = None
    put_seconds: float | None = None
    bytes_read: int = 0
    bytes_written: int = 0
    wrong_blocks: int = 0
    wrong_bytes: int = 0
    #: Blocks ``prefix_hits`` announced that the get then missed.
    vanished: int = 0
    #: Blocks the put could not place (the store had no room that could be freed).
    put_refused: int = 0


@dataclass
class ReplayRun:
    options: ReplayOptions
    outcomes: list[RequestOutcome]
    wall_seconds: float
    #: ``(key, wrong bytes)`` of the first wrong blocks.
    wrong_examples: list[tuple[str, int]] = field(default_factory=list)
    #: The master's lookup counters before and after the run.
    lookups_before: dict[str, int] = field(default_factory=dict)
    lookups_after: dict[str, int] = field(default_factory=dict)

    @property
    def wrong_bytes(self) -> int:
        return sum(o.wrong_bytes for o in self.outcomes)


def lookup_counts(client) -> dict[str, int]:
    """The master's lookup counters (``hit_dram``, ``hit_ssd``, ``miss``) now."""
    return dict(client.call("status")["lookups"])


class _Buffers:
    """One worker's memory: the get buffers of a request, the values it puts, and the
    scratch that holds an expected value; grown to the longest request met so far."""

    def __init__(self, block_bytes: int) -> None:
        self.block_bytes = block_bytes
        self.get = bytearray()
        self.put = bytearray()
        self.expected = bytearray(block_bytes)

    def _views(self, name: str, count: int) -> list[memoryview]:
        buf = getattr(self, name)
        if len(buf) < count * self.block_bytes:
            buf = bytearray(count * self.block_bytes)
            setattr(self, name, buf)
        whole = memoryview(buf)
        return [whole[i * self.block_bytes:(i + 1) * self.block_bytes] for i in range(count)]

    def for_get(self, count: int) -> list[memoryview]:
        return self._views("get", count)

    def for_put(self, keys: list[str]) -> list[memoryview]:
        views = self._views("put", len(keys))
        for key, view in zip(keys, views):
            values.fill(key, view)
        return views


class Replayer:
    """Sends a workload's requests to the store behind ``client`` (a
    :class:`kvstored.client.Client`, shared by the workers: it keeps a connection per
    thread)."""

    def __init__(self, client, options: ReplayOptions) -> None:
        if options.block_bytes < 1:
            raise ValueError("the block size must be at least one byte")
        if options.concurrency < 1:
            raise ValueError("the concurrency must be at least 1")
        if options.speed is not None and not options.speed > 0:
            raise ValueError("the speed must be positive")
        self.client = client
        self.options = options
        self._wrong: list[tuple[str, int]] = []
        self._wrong_lock = threading.Lock()

    def run(self, workload: Workload,
            progress: Callable[[int, int], None] | None = None) -> ReplayRun:
        """Replay every request; ``progress(done, total)`` is called from this thread
        while the workers run."""
        before = lookup_counts(self.client)
        outcomes: list[RequestOutcome | None] = [None] * len(workload)
        next_index = iter(range(len(workload)))
        take = threading.Lock()
        stop = threading.Event()
        failures: list[BaseException] = []
        done = [0]
        started = time.monotonic()

        def worker() -> None:
            buffers = _Buffers(self.options.block_bytes)
            try:
                while not stop.is_set():
                    with take:
                        index = next(next_index, None)
                    if index is None:
                        return
                    request = workload.request(index)
                    if self.options.speed is not None:
                        due = started + request.arrival / self.options.speed
                        # Pacing to the trace's clock, not waiting on a condition.
                        pause = due - time.monotonic()
                        if pause > 0 and stop.wait(pause):
                            return
                    outcome = self._one(request, buffers)
                    outcome.sent -= started
                    outcomes[index] = outcome
                    with take:
                        done[0] += 1
            except BaseException as exc:  # handed to the main thread, which re-raises
                failures.append(exc)
                stop.set()

        threads = [threading.Thread(target=worker, name=f"replay-{i}", daemon=True)
                   for i in range(self.options.concurrency)]
        for thread in threads:
            thread.start()
        try:
            for thread in threads:
                while thread.is_alive():
                    thread.join(0.2)
                    if progress is not None:
                        progress(done[0], len(workload))
        except BaseException:
            stop.set()
            for thread in threads:
                thread.join()
            raise
        if failures:
            raise failures[0]
        wall = time.monotonic() - started
        return ReplayRun(self.options, [o for o in outcomes if o is not None], wall,
                         list(self._wrong), before, lookup_counts(self.client))

    def _one(self, request: EngineRequest, buffers: _Buffers) -> RequestOutcome:
        keys = request.keys(self.options.namespace)
        block_bytes = self.options.block_bytes
        out = RequestOutcome(request.index, request.arrival, sent=time.monotonic(),
                             blocks=len(keys), tokens=int(request.tokens.sum()))
        t0 = time.perf_counter()
        announced = out.announced = self.client.prefix_hits(keys)
        out.lookup_seconds = time.perf_counter() - t0
        served = 0
        if announced:
            t0 = time.perf_counter()
            bufs = buffers.for_get(announced)
            tiers: list[Tier | None] = []
            try:
                sizes = self.client.batch_get_into(keys[:announced], bufs, tiers=tiers)
                got = [memoryview(b)[:n] if n >= 0 else None for b, n in zip(bufs, sizes)]
            except BadRequestError:
                # A value larger than a block does not fit the engine's buffer: fetch the
                # batch whole to see which keys hold what.
                got = [None if v is None else memoryview(v)
                       for v in self.client.batch_get(keys[:announced])]
            out.get_seconds = time.perf_counter() - t0
            out.dram_lookups = tiers.count(Tier.DRAM)
            out.ssd_lookups = tiers.count(Tier.SSD)
            served = self._check(keys[:announced], got, buffers, out)
            out.hit_blocks = served
            out.hit_tokens = int(request.tokens[:served].sum())
            out.bytes_read = sum(len(g) for g in got if g is not None)
        if served < len(keys):
            missed = keys[served:]
            t0 = time.perf_counter()
            try:
                stored = self.client.batch_put(missed, buffers.for_put(missed))
            except NoSpaceError:
                out.put_refused = len(missed)
            else:
                out.bytes_written = sum(stored) * block_bytes
            out.put_seconds = time.perf_counter() - t0
        return out

    def _check(self, keys: list[str], got: list[memoryview | None], buffers: _Buffers,
               out: RequestOutcome) -> int:
        """Verify every block that arrived; returns the length of the intact prefix."""
        served = None
        for i, (key, data) in enumerate(zip(keys, got)):
            if data is None:
                if served is None:
                    served = i
                    out.vanished = sum(1 for g in got[i:] if g is None)
                continue
            wrong = values.wrong_bytes(key, data, self.options.block_bytes, buffers.expected)
            if wrong:
                out.wrong_blocks += 1
                out.wrong_bytes += wrong
                with self._wrong_lock:
                    if len(self._wrong) < WRONG_EXAMPLES:
                        self._wrong.append((key, wrong))
                if served is None:
                    served = i
        return len(keys) if served is None else served
