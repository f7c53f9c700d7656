"""The master's tiering policies: offload, DRAM eviction and promotion.

Each heartbeat, :func:`plan_node` looks at one node's DRAM and queues tasks for it:

- **offload** (``eager``: every committed object is queued at commit time, elsewhere;
  ``watermark``: once DRAM use passes ``offload_watermark``, the least recently used
  DRAM-only objects are queued);
- **eviction**: above ``dram_high_watermark`` the least recently used unleased DRAM
  replicas are dropped until use would fall to ``dram_low_watermark``. A replica whose
  object has no other copy is offloaded first and dropped when its SSD copy lands,
  unless ``dram_only`` is set, in which case it is simply dropped;
- **promotion**: SSD-only objects read ``promote_reads`` times within
  ``promote_window`` seconds are copied back to DRAM while DRAM is below its high
  watermark.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvstored.master.nodes import NodeState
from kvstored.master.table import DRAM, SSD, ObjectMeta, ObjectTable


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    offload: str = "eager"
    dram_high_watermark: float = 0.90
    dram_low_watermark: float = 0.80
    offload_watermark: float = 0.70
    promote_reads: int = 2
    promote_window: float = 60.0
    dram_only: bool = False

    @classmethod
    def from_section(cls, section: dict) -> PolicyConfig:
        return cls(**{k: section[k] for k in cls.__dataclass_fields__ if k in section})


@dataclass(slots=True)
class Plan:
    """What :func:`plan_node` decided; the caller turns it into tasks."""

    offload: list[str]
    drop_now: list[str]
    promote: list[str]
    #: Eviction waits on offloads: the node should write them now, not when its batch
    #: would have filled or aged.
    offload_urgent: bool = False


def plan_node(node: NodeState, table: ObjectTable, cfg: PolicyConfig, now: float) -> Plan:
    plan = Plan([], [], [])
    lru = table.dram_lru.get(node.node_id) or {}
    if not node.dram_capacity:
        return plan
    used = node.dram_used
    cap = node.dram_capacity

    if not cfg.dram_only and cfg.offload == "watermark" and used > cfg.offload_watermark * cap:
        budget = used - cfg.dram_low_watermark * cap
        for key in lru:
            if budget <= 0:
                break
            meta = table.objects[key]
            if key in node.offload_queued or meta.has_other_copy(node.node_id, DRAM):
                continue
            plan.offload.append(key)
            budget -= meta.size

    if used > cfg.dram_high_watermark * cap:
        need = used - cfg.dram_low_watermark * cap
        for key in list(lru):
            if need <= 0:
                break
            meta = table.objects[key]
            if key in node.evict_after_offload:
                need -= meta.size  # already on its way out, once its offload lands
                plan.offload_urgent = True
                continue
            if meta.leased(now):
                continue
            if meta.has_other_copy(node.node_id, DRAM) or cfg.dram_only:
                table.mark_removing(key, node.node_id, DRAM)
                plan.drop_now.append(key)
            else:
                node.evict_after_offload.add(key)
                plan.offload_urgent = True
                if key not in node.offload_queued:
                    plan.offload.append(key)
            need -= meta.size

    if node.promote_queued and used < cfg.dram_high_watermark * cap:
        room = cfg.dram_high_watermark * cap - used
        for key in list(node.promote_queued):
            meta = table.objects.get(key)
            if meta is None or meta.replica(node.node_id, SSD) is None \
                    or meta.replica(node.node_id, DRAM) is not None:
                node.promote_queued.discard(key)
                continue
            if meta.size > room:
                break
            room -= meta.size
            plan.promote.append(key)
            node.promote_queued.discard(key)
    return plan


def count_ssd_read(meta: ObjectMeta, cfg: PolicyConfig, now: float) -> bool:
    """Count a read served only by SSD; True when the object should be promoted."""
    if now - meta.window_start > cfg.promote_window:
        meta.window_start = now
        meta.window_reads = 0
    meta.window_reads += 1
    return meta.window_reads >= cfg.promote_reads
