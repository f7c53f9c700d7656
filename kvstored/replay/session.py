"""One replay of a trace against a live store, end to end: read the store's capacities,
predict, replay, and put measurement and prediction in one document (``report``).

``kvstore replay TRACE``, the multi-round experiment and ``make demo`` all go through
:func:`replay_trace`; they differ in where the store and the trace come from.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvstored.errors import UnreachableError
from kvstored.replay import report
from kvstored.replay.keys import new_namespace
from kvstored.replay.predict import Capacities, StorePolicy, capacities, predict
from kvstored.replay.runner import Replayer, ReplayOptions, ReplayRun
from kvstored.replay.workload import Workload
from kvstored.tools.events import EventTrace
from kvstored.tools.tiered import TierReplay


@dataclass
class ReplayResult:
    document: dict[str, Any]
    run: ReplayRun
    model: TierReplay
    capacities: Capacities


def replay_trace(client, trace: EventTrace, policy: StorePolicy, *, block_bytes: int,
                 concurrency: int = 1, speed: float | None = None,
                 namespace: str | None = None, warmup: float = 0.0,
                 window: float | None = None, master: str = "",
                 progress: Callable[[int, int], None] | None = None) -> ReplayResult:
    """Replay ``trace`` on the store behind ``client`` and predict it with ``policy``
    (the store's tiering settings, see ``predict``)."""
    namespace = namespace or new_namespace()
    workload = Workload(trace)
    status = client.call("status")
    if not [n for n in status["nodes"] if n.get("alive", True)]:
        raise UnreachableError("the master has no live storage node; start one with "
                               "`kvstored node` (or use `kvstored up`)")
    key_bytes = len(workload.request(0).keys(namespace)[0].encode()) if len(workload) else 0
    caps = capacities(status, block_bytes, key_bytes, policy)
    model = predict(trace, caps, warmup)
    run = Replayer(client, ReplayOptions(block_bytes, namespace, concurrency, speed)).run(
        workload, progress)
    seconds = window or report.nice_window(workload.span)
    doc = report.document(run, model, trace=trace.summary(), window_seconds=seconds, store={
        "master": master, "capacities": caps.describe(),
        "policy": {"dram_high_watermark": policy.dram_high_watermark,
                   "dram_low_watermark": policy.dram_low_watermark,
                   "promote_reads": policy.promote_reads, "dram_only": policy.dram_only,
                   "offload": policy.offload, "backend": policy.backend,
                   "backend_options": policy.backend_options, "source": policy.source},
        "objects_at_start": status["objects"]})
    notes = []
    if status["objects"]:
        notes.append(f"the store held {status['objects']:,} objects before the replay; the "
                     "prediction starts from an empty store")
    if doc["lookups"]["by_others"]:
        notes.append(f"{doc['lookups']['by_others']:,} lookups by other clients during the "
                     "replay: the split between DRAM and SSD is approximate")
    doc["notes"] = notes
    return ReplayResult(doc, run, model, caps)
