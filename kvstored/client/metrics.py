"""What a client counts of its own calls, for an engine to log or scrape: per kind of
call (:class:`CallKind`) the calls, the errors, the keys asked about, the hits and
misses, the bytes moved, and a latency histogram.

Counted once, in the core: each operation of :class:`~kvstored.client.core.ClientCore`
carries ``@metered(CallKind.X)``, so the blocking, trio and asyncio clients count the
same calls the same way. A call is counted when it ends, with a result or an error (one
abandoned midway, a cancelled task's, is not). What a hit is depends on the call:

| kind | keys | hits | misses | bytes |
|---|---|---|---|---|
| ``put`` | objects given | stored now | already there (not written) | bytes stored now |
| ``get`` | keys read | found | missing | bytes read |
| ``exists``, ``lookup_and_lock`` | keys asked | present (and locked) | absent | |
| ``prefix_hits`` | keys asked | leading keys present | the rest | |
| ``unlock`` | keys | locks ended | no lock of this client's | |
| ``remove`` | keys | removed | not there | |
| ``remove_prefix`` | 1 | objects removed | | |
| ``stat``, ``locate`` | 1 | the object exists | it does not | |
| ``register_namespace``, ``call`` | 1 | | | |

:meth:`ClientMetrics.snapshot` gives typed, consistent numbers (``client.metrics()``);
:func:`register_metrics` exports them to a prometheus-client registry, read at each
scrape (``kvstored_client_*``).
"""

from __future__ import annotations

import bisect
import enum
import functools
import threading
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Concatenate, NamedTuple, ParamSpec, Protocol, TypeVar

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

P = ParamSpec("P")
T = TypeVar("T")


class CallKind(enum.StrEnum):
    """A kind of client call (the ``call`` label of the exported metrics)."""

    PUT = "put"
    GET = "get"
    EXISTS = "exists"
    PREFIX_HITS = "prefix_hits"
    LOOKUP_AND_LOCK = "lookup_and_lock"
    UNLOCK = "unlock"
    REMOVE = "remove"
    REMOVE_PREFIX = "remove_prefix"
    REGISTER_NAMESPACE = "register_namespace"
    STAT = "stat"
    LOCATE = "locate"
    CALL = "call"


#: Upper bounds of the latency buckets, in seconds (a same-host get of a small object
#: takes about 100 µs; a batch of large ones, or a retry, seconds).
LATENCY_BOUNDS: tuple[float, ...] = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
                                     0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass(frozen=True, slots=True)
class Latency:
    """A latency histogram: ``counts[i]`` calls took at most ``bounds[i]`` seconds and
    more than the bound before it; ``counts[-1]`` took longer than the last bound."""

    bounds: tuple[float, ...]
    counts: tuple[int, ...]
    #: Seconds, all calls together.
    total: float

    @property
    def calls(self) -> int:
        return sum(self.counts)


@dataclass(frozen=True, slots=True)
class CallMetrics:
    """One kind of call, since the client was made (see the module's table)."""

    calls: int
    errors: int
    keys: int
    hits: int
    misses: int
    bytes: int
    latency: Latency


@dataclass(frozen=True, slots=True)
class MetricsSnapshot:
    """Every kind of call at one instant (kinds never called are there, at zero)."""

    calls: Mapping[CallKind, CallMetrics]

    def __getitem__(self, kind: CallKind) -> CallMetrics:
        return self.calls[kind]


class Outcome(NamedTuple):
    """What one call that returned adds (see the module's table). A tuple: one is made
    per call, at a third of a frozen dataclass's cost."""

    keys: int
    hits: int
    misses: int
    bytes: int = 0


class _Counts:
    __slots__ = ("buckets", "bytes", "calls", "errors", "hits", "keys", "misses", "seconds")

    def __init__(self) -> None:
        self.calls = self.errors = self.keys = self.hits = self.misses = self.bytes = 0
        self.seconds = 0.0
        self.buckets = [0] * (len(LATENCY_BOUNDS) + 1)


class ClientMetrics:
    """The counts of one client; thread-safe (the blocking client's threads share it)."""

    def __init__(self) -> None:
        self._counts = {kind: _Counts() for kind in CallKind}
        self._lock = threading.Lock()

    def record(self, kind: CallKind, seconds: float, outcome: Outcome | None) -> None:
        """One call of ``kind`` that took ``seconds``: returned ``outcome``, or (None)
        raised."""
        bucket = bisect.bisect_left(LATENCY_BOUNDS, seconds)
        with self._lock:
            counts = self._counts[kind]
            counts.calls += 1
            counts.seconds += seconds
            counts.buckets[bucket] += 1
            if outcome is None:
                counts.errors += 1
                return
            counts.keys += outcome.keys
            counts.hits += outcome.hits
            counts.misses += outcome.misses
            counts.bytes += outcome.bytes

    def snapshot(self) -> MetricsSnapshot:
        with self._lock:
            return MetricsSnapshot({kind: CallMetrics(
                c.calls, c.errors, c.keys, c.hits, c.misses, c.bytes,
                Latency(LATENCY_BOUNDS, tuple(c.buckets), c.seconds))
                for kind, c in self._counts.items()})


# -- counting the core's operations ----------------------------------------------------

class Metered(Protocol):
    """What ``@metered`` needs of the object whose operations it counts (the core)."""

    metrics: ClientMetrics

    def clock(self) -> float: ...


def _nbytes(value: Any) -> int:
    """The size of a value: one buffer, or a list of pieces."""
    if isinstance(value, list | tuple):
        return sum(memoryview(piece).nbytes for piece in value)
    return memoryview(value).nbytes


def _flags(args: tuple[Any, ...], result: Sequence[bool]) -> Outcome:
    hits = sum(map(bool, result))
    return Outcome(len(args[0]), hits, len(result) - hits)


def _put(args: tuple[Any, ...], result: Sequence[bool]) -> Outcome:
    stored = sum(_nbytes(value) for value, ok in zip(args[1], result) if ok)
    return Outcome(len(args[0]), sum(result), len(result) - sum(result), stored)


def _get(args: tuple[Any, ...], result: Sequence[int | bytes | None]) -> Outcome:
    """Lengths (``read_into``: -1 where missing) or values (None where missing)."""
    hits = found = 0
    for r in result:
        size = r if isinstance(r, int) else -1 if r is None else len(r)
        if size >= 0:
            hits += 1
            found += size
    return Outcome(len(args[0]), hits, len(result) - hits, found)


def _prefix(args: tuple[Any, ...], result: int) -> Outcome:
    return Outcome(len(args[0]), result, len(args[0]) - result)


def _one(args: tuple[Any, ...], result: Any) -> Outcome:
    return Outcome(1, int(bool(result)), int(not result))


_MEASURES: dict[CallKind, Callable[[tuple[Any, ...], Any], Outcome]] = {
    CallKind.PUT: _put,
    CallKind.GET: _get,
    CallKind.EXISTS: _flags,
    CallKind.LOOKUP_AND_LOCK: _flags,
    CallKind.UNLOCK: _flags,
    CallKind.REMOVE: _flags,
    CallKind.PREFIX_HITS: _prefix,
    CallKind.REMOVE_PREFIX: lambda args, removed: Outcome(1, removed, 0),
    CallKind.STAT: _one,
    CallKind.LOCATE: _one,
    CallKind.REGISTER_NAMESPACE: lambda args, result: Outcome(1, 0, 0),
    CallKind.CALL: lambda args, result: Outcome(1, 0, 0),
}

M = TypeVar("M", bound=Metered)


def metered(kind: CallKind) -> Callable[[Callable[Concatenate[M, P], Generator[Any, Any, T]]],
                                        Callable[Concatenate[M, P], Generator[Any, Any, T]]]:
    """Count each run of the decorated core operation (a generator: a step) under
    ``kind``, timed by the core's clock from its first effect to its end. The blocking
    client and the async ones drive the same steps, so they count alike."""
    measure = _MEASURES[kind]

    def wrap(op: Callable[Concatenate[M, P], Generator[Any, Any, T]]
             ) -> Callable[Concatenate[M, P], Generator[Any, Any, T]]:
        @functools.wraps(op)
        def counted(core: M, *args: P.args, **kwargs: P.kwargs) -> Generator[Any, Any, T]:
            started = core.clock()
            try:
                result = yield from op(core, *args, **kwargs)
            except GeneratorExit:
                raise  # abandoned (the task was cancelled): neither result nor error
            except Exception:
                core.metrics.record(kind, core.clock() - started, None)
                raise
            core.metrics.record(kind, core.clock() - started, measure(args, result))
            return result
        return counted
    return wrap


# -- prometheus ------------------------------------------------------------------------

_COUNTERS = (("calls", "Client calls that ended, by kind"),
             ("errors", "Client calls that raised, by kind"),
             ("keys", "Keys (objects) the calls were about, by kind"),
             ("hits", "Keys found (put: stored; see docs/client.md), by kind"),
             ("misses", "Keys not found (put: already there), by kind"),
             ("bytes", "Bytes stored (put) or read (get)"))


class _Exported(Collector):
    """A client's counts as prometheus metrics, read at each scrape."""

    def __init__(self, metrics: ClientMetrics, labels: Mapping[str, str]) -> None:
        self.metrics = metrics
        self.label_names = ["call", *labels]
        self.label_values = list(labels.values())

    def collect(self) -> Iterator[Metric]:
        snapshot = self.metrics.snapshot()
        for field, doc in _COUNTERS:
            family = CounterMetricFamily(f"kvstored_client_{field}", doc,
                                         labels=self.label_names)
            for kind, counts in snapshot.calls.items():
                family.add_metric([kind.value, *self.label_values], getattr(counts, field))
            yield family
        latency = HistogramMetricFamily("kvstored_client_latency_seconds",
                                        "Seconds a client call took, by kind",
                                        labels=self.label_names)
        for kind, counts in snapshot.calls.items():
            cumulative, buckets = 0, []
            for bound, count in zip((*LATENCY_BOUNDS, float("inf")), counts.latency.counts):
                cumulative += count
                buckets.append((_bound(bound), cumulative))
            latency.add_metric([kind.value, *self.label_values], buckets,
                               counts.latency.total)
        yield latency


def _bound(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(bound)


def register_metrics(metrics: ClientMetrics, registry: CollectorRegistry | None = None,
                     labels: Mapping[str, str] | None = None) -> Collector:
    """Export ``metrics`` to ``registry`` (prometheus-client's default one if None) as
    ``kvstored_client_{calls,errors,keys,hits,misses,bytes}_total`` and
    ``kvstored_client_latency_seconds``, labelled ``call`` (the kind) and ``labels``
    (say, ``{"engine": "lmcache", "worker": "0"}``). Returns the collector (to
    ``registry.unregister`` it). One client per registry: two would export the same
    names."""
    collector = _Exported(metrics, dict(labels or {}))
    (REGISTRY if registry is None else registry).register(collector)
    return collector
