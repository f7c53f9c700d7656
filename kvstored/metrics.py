"""Prometheus metrics of the master and the nodes (prefix ``kvstored_``).

Each role registers into a registry it is given, so that the embedded store (master
and node in one process) serves both sets from one endpoint without name clashes.
Counters end in ``_total``, byte figures in ``_bytes``, durations in ``_seconds``.
"""

from __future__ import annotations

import logging
import weakref
from collections import Counter as Tally
from collections.abc import Iterable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from kvstored.errors import ListenError
from kvstored.protocol import OffloadFailure

log = logging.getLogger(__name__)

#: The tiers' label values.
TIERS = ("dram", "ssd")
IO_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
              0.5, 1.0, 2.5, 5.0)


class MasterMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry or CollectorRegistry()
        self.puts = Counter("kvstored_puts", "Objects committed.", registry=r)
        self.lookups = _TalliedCounter(Counter(
            "kvstored_lookups", "Lookups by result: hit_dram, hit_ssd or miss.", ["result"],
            registry=r))
        self.offloads = Counter("kvstored_offloads", "Objects copied DRAM to SSD.", registry=r)
        self.offload_bytes = Counter("kvstored_offloaded_bytes", "Bytes copied DRAM to SSD.",
                                     registry=r)
        self.promotions = Counter("kvstored_promotions", "Objects copied SSD to DRAM.",
                                  registry=r)
        self.promotions_skipped = Counter(
            "kvstored_promotions_skipped",
            "Promotions let go, by reason: queue_full (more waiting than a node's queue "
            "holds; the least recently read go) or no_room (the node had no DRAM for it).",
            ["reason"], registry=r)
        self.evictions = Counter(
            "kvstored_evictions", "Replicas evicted, by tier (a DRAM replica waiting for its "
            "offload counts when it lands).", ["tier"], registry=r)
        self.tier_used = Gauge("kvstored_tier_used_bytes", "Bytes in use, by tier.", ["tier"],
                               registry=r)
        self.tier_capacity = Gauge("kvstored_tier_capacity_bytes", "Capacity, by tier.",
                                   ["tier"], registry=r)
        self.tier_objects = Gauge("kvstored_tier_objects", "Replicas held, by tier.", ["tier"],
                                  registry=r)
        self.nodes = Gauge("kvstored_nodes", "Live storage nodes.", registry=r)
        self.checksum_failures = Gauge(
            "kvstored_cluster_checksum_failures", "Checksum failures the nodes reported.",
            registry=r)
        self.quarantined = Gauge("kvstored_cluster_quarantined_records",
                                 "Records the nodes quarantined.", registry=r)
        self.locks = Counter(
            "kvstored_locks", "Keys a lookup-and-lock asked for, by result: locked (found, "
            "held against eviction until read, unlocked or expired) or miss.", ["result"],
            registry=r)
        self.prefix_removals = Counter(
            "kvstored_prefix_removed_objects", "Objects removed by a removal of their prefix.",
            registry=r)
        self.namespace_objects = Gauge(
            "kvstored_namespace_objects", "Objects, by registered namespace (key prefix).",
            ["namespace"], registry=r)
        self.namespace_tier_objects = Gauge(
            "kvstored_namespace_tier_objects", "Replicas held, by namespace and tier.",
            ["namespace", "tier"], registry=r)
        self.namespace_tier_bytes = Gauge(
            "kvstored_namespace_tier_bytes", "Logical bytes of the replicas held, by "
            "namespace and tier.", ["namespace", "tier"], registry=r)
        self.background_errors = background_errors(r)
        _export_from_start(self.locks, "result", ("locked", "miss"))
        _export_from_start(self.evictions, "tier", TIERS)
        _export_from_start(self.promotions_skipped, "reason", ("queue_full", "no_room"))
        _export_from_start(self.lookups.counter, "result", ("hit_dram", "hit_ssd", "miss"))

    def lookup_counts(self) -> dict[str, int]:
        return dict(self.lookups.tally)

    def set_tiers(self, tiers: Mapping[str, tuple[int, int, int]]) -> None:
        """Per tier: (replicas held, bytes used, capacity)."""
        for tier, (objects, used, capacity) in tiers.items():
            self.tier_used.labels(tier=tier).set(used)
            self.tier_capacity.labels(tier=tier).set(capacity)
            self.tier_objects.labels(tier=tier).set(objects)


    def set_namespaces(self, usage: Mapping[str, tuple[int, Mapping[str, Any]]]) -> None:
        """Per namespace: (objects, tier -> an object with ``objects`` and ``bytes``).
        The number of namespaces is bounded by the master (MAX_NAMESPACES), and so are
        these gauges' label values."""
        for ns, (objects, tiers) in usage.items():
            self.namespace_objects.labels(namespace=ns).set(objects)
            for tier, count in tiers.items():
                self.namespace_tier_objects.labels(namespace=ns, tier=tier).set(count.objects)
                self.namespace_tier_bytes.labels(namespace=ns, tier=tier).set(count.bytes)


class NodeMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry or CollectorRegistry()
        self.checksum_failures = Counter(
            "kvstored_checksum_failures", "Reads that failed their checksum (served as "
            "misses), by tier: SSD records, and DRAM copies a client found bad.", ["tier"],
            registry=r)
        self.quarantined = Counter("kvstored_quarantined_records",
                                   "Records moved to quarantine.", registry=r)
        self.io_seconds = Histogram("kvstored_io_seconds", "SSD batch latency, by operation.",
                                    ["op"], buckets=IO_BUCKETS, registry=r)
        self.bytes_served = Counter("kvstored_node_served_bytes", "Bytes sent to clients, by "
                                    "tier.", ["tier"], registry=r)
        self.bytes_received = Counter("kvstored_node_received_bytes",
                                      "Bytes received from clients.", registry=r)
        self.dram_used = Gauge("kvstored_node_dram_used_bytes", "DRAM segment bytes in use.",
                               registry=r)
        self.ssd_used = Gauge("kvstored_node_ssd_used_bytes", "SSD bytes in use (physical).",
                              registry=r)
        self.offload_failures = Counter(
            "kvstored_offload_failures", "Objects whose offload attempt failed, by reason "
            "(no_space is retried with backoff).", ["reason"], registry=r)
        self.offload_waiting = Gauge(
            "kvstored_offload_waiting_objects", "Objects whose offload failed and waits for "
            "a retry.", registry=r)
        self.shutdown_flushed = Counter(
            "kvstored_shutdown_flushed", "DRAM-only objects written to SSD while shutting "
            "down.", registry=r)
        self.background_errors = background_errors(r)
        _export_from_start(self.io_seconds, "op", ("offload", "load"))
        _export_from_start(self.bytes_served, "tier", TIERS)
        _export_from_start(self.checksum_failures, "tier", TIERS)
        _export_from_start(self.offload_failures, "reason", [r.value for r in OffloadFailure])


def _export_from_start(metric: Counter | Gauge | Histogram, label: str,
                       values: Iterable[str]) -> None:
    """Create ``metric``'s series for each of ``values`` of ``label`` now, before anything
    is counted, so that dashboards see zeros, not gaps."""
    for value in values:
        metric.labels(**{label: value})


_BACKGROUND_ERRORS: weakref.WeakKeyDictionary[CollectorRegistry, Counter] = \
    weakref.WeakKeyDictionary()


def background_errors(registry: CollectorRegistry) -> Counter:
    """``kvstored_background_errors_total{task}``: failures of background tasks that the
    supervisor survived. One counter per registry, shared by the master and the node of an
    embedded store (their task names differ)."""
    counter = _BACKGROUND_ERRORS.get(registry)
    if counter is None:
        counter = _BACKGROUND_ERRORS[registry] = Counter(
            "kvstored_background_errors", "Background task failures the daemon survived, "
            "by task.", ["task"], registry=registry)
    return counter


class _TalliedCounter:
    """A labelled Counter that also keeps plain counts for `kvstore status`."""

    def __init__(self, counter: Counter) -> None:
        self.counter = counter
        self.tally: Tally[str] = Tally()

    def labels(self, *, result: str) -> _TalliedCounter._Child:
        return _TalliedCounter._Child(self, result)

    class _Child:
        def __init__(self, parent: _TalliedCounter, result: str) -> None:
            self.parent, self.result = parent, result

        def inc(self, amount: int = 1) -> None:
            self.parent.counter.labels(result=self.result).inc(amount)
            self.parent.tally[self.result] += amount


def serve_metrics(address: tuple[str, int], registry: CollectorRegistry) -> None:
    """Serve /metrics on ``address`` from a background thread."""
    try:
        start_http_server(address[1], addr=address[0], registry=registry)
    except OSError as exc:
        raise ListenError(address, exc, role="serve metrics") from exc
    log.info("metrics on http://%s:%d/metrics", *address)
