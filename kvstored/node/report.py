"""What a node tells its master in the next heartbeat, and its count of bad copies.

:class:`Outcomes` gathers task outcomes (offloads written or failed, versions dropped,
promotions, SSD evictions, recovery reports) from the trio loop and from worker threads
alike, and hands them over as one :class:`~kvstored.protocol.master_api.NodeReport`.
:class:`Integrity` counts copies that failed their checksum and records the node
quarantined, for the heartbeat's stats and the metrics.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from typing import Any

from kvstored.metrics import NodeMetrics
from kvstored.protocol import OffloadFailed, Tier
from kvstored.protocol.master_api import NodeReport, RecoveryReport
from kvstored.protocol.messages import Message

log = logging.getLogger(__name__)


class Outcomes:
    """Task outcomes waiting for the next heartbeat; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._report = NodeReport()

    def offloaded(self, items: Iterable[tuple[str, int]]) -> None:
        """``(key, checksum)`` of versions now durable on SSD."""
        with self._lock:
            _append_rows(self._report.offloaded, items)

    def offload_failed(self, failures: Iterable[OffloadFailed]) -> None:
        with self._lock:
            self._report.offload_failed.extend(failures)

    def dropped(self, items: Iterable[tuple[str, Tier, int | None]]) -> None:
        """``(key, tier, version)`` no longer held (version None: whichever it was)."""
        with self._lock:
            _append_rows(self._report.dropped, items)

    def promoted(self, items: Iterable[tuple[str, int, int]]) -> None:
        """``(key, offset, checksum)`` of SSD objects copied into DRAM."""
        with self._lock:
            _append_rows(self._report.promoted, items)

    def promote_failed(self, keys: Iterable[str]) -> None:
        """Promotions that found no DRAM room."""
        with self._lock:
            self._report.promote_failed.extend(keys)

    def ssd_evicted(self, keys: Iterable[str]) -> None:
        with self._lock:
            self._report.ssd_evicted.extend(keys)

    def recovered(self, report: RecoveryReport) -> None:
        with self._lock:
            self._report.recovered.append(report)

    def take(self) -> NodeReport:
        """Everything gathered since the last take."""
        with self._lock:
            report, self._report = self._report, NodeReport()
        return report

    def clear(self) -> None:
        self.take()


def _append_rows(columns: Message, rows: Iterable[tuple[Any, ...]]) -> None:
    """Append each row to a message that holds its rows as parallel lists, one item to each
    list the message names in ``SAME_LENGTH``, in that order."""
    rows = list(rows)
    if not rows:
        return
    for name, values in zip(columns.SAME_LENGTH, zip(*rows, strict=True), strict=True):
        getattr(columns, name).extend(values)


class Integrity:
    """Copies that failed their checksum here (each served as a miss), and records the
    node's recoveries quarantined."""

    def __init__(self, node: str, metrics: NodeMetrics) -> None:
        self.node = node
        self.metrics = metrics
        self.corrupt_reads = 0
        self.quarantined = 0

    def corrupt(self, key: str, tier: Tier) -> None:
        """Count a copy of ``key`` that failed its checksum."""
        self.corrupt_reads += 1
        self.metrics.checksum_failures.labels(tier=tier).inc()
        log.warning("node %s: %r failed its checksum in %s: served as a miss%s", self.node,
                    key, tier, ", quarantining" if tier is Tier.SSD else ", dropped this copy")

    def quarantined_records(self, count: int) -> None:
        self.quarantined += count
        self.metrics.quarantined.inc(count)

