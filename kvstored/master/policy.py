"""The master's tiering policies: offload, DRAM eviction and promotion.

Each heartbeat, :func:`plan_node` looks at one node's DRAM and queues tasks for it:

- **offload** (``eager``: every committed object is queued at commit time, elsewhere;
  ``watermark``: once DRAM use passes ``offload_watermark``, the least recently used
  DRAM-only objects are queued);
- **eviction**: above ``dram_high_watermark`` the least recently used DRAM replicas
  are dropped until use would fall to ``dram_low_watermark``. Recency alone chooses
  among the objects no lookup-and-lock holds (a locked one is passed over until its lock
  ends): a victim under a read lease is marked removing (no new leases) and freed when
  its lease ends. A replica whose object has no other copy is offloaded first and dropped when its
  SSD copy lands, unless ``dram_only`` is set, in which case it is simply dropped;
- **promotion**: SSD-only objects read ``promote_reads`` times within
  ``promote_window`` seconds wait in an ordered queue (the most recently read first).
  Each heartbeat plans up to ``dram_high_watermark - dram_low_watermark`` of DRAM of
  them, and eviction makes their room from DRAM objects read longer ago than they were;
  one that finds no colder room stays queued.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvstored.config import PolicySettings
from kvstored.master.nodes import NodeState
from kvstored.master.table import DRAM, SSD, ObjectMeta, ObjectTable


@dataclass(slots=True)
class Plan:
    """What :func:`plan_node` decided; the caller turns it into tasks."""

    offload: list[str]
    #: DRAM replicas marked removing (each has another copy): free each once its
    #: object's leases have ended.
    evict: list[str]
    promote: list[str]
    #: Eviction waits on offloads: the node should write them now, not when its batch
    #: would have filled or aged.
    offload_urgent: bool = False


def plan_node(node: NodeState, table: ObjectTable, cfg: PolicySettings, now: float) -> Plan:
    plan = Plan([], [], [])
    lru = table.dram_lru.get(node.node_id) or {}
    cap = node.announced.dram_capacity
    if not cap:
        return plan
    # Replicas already on their way out are not counted twice: their bytes go soon.
    used = node.stats.dram_used - node.dram_given_up()
    high, low = cfg.dram_high_watermark * cap, cfg.dram_low_watermark * cap

    if not cfg.dram_only and cfg.offload == "watermark" and used > cfg.offload_watermark * cap:
        budget = used - low
        for key in lru:
            if budget <= 0:
                break
            meta = table.objects[key]
            if key in node.offload_queued or meta.has_other_copy(node.node_id, DRAM):
                continue
            plan.offload.append(key)
            budget -= meta.size

    promote = _promotions(node, table, budget=high - low)
    promote_bytes = sum(meta.size for meta in promote)
    # Above the high watermark eviction frees down to the low one whatever waits to be
    # promoted (must_free); room for promotions is made only from colder objects.
    must_free = used - low if used > high else 0.0

    def need() -> float:
        return used + promote_bytes - low if used + promote_bytes > high else must_free

    freed = 0
    # Copied (eviction changes the LRU) only when something is to be freed: a copy of
    # every DRAM key each heartbeat was most of a busy master's time.
    for key in list(lru) if need() > 0 else ():
        if freed >= need():
            break
        meta = table.objects[key]
        if meta.locked(now):
            # A lookup-and-lock promised its holder this object until its read.
            continue
        if freed >= must_free:
            while promote and promote[-1].last_access <= meta.last_access:
                # Stays queued, for when something colder is in DRAM.
                promote_bytes -= promote.pop().size
            if freed >= need():
                break
        freed += meta.size
        # By recency alone, leased or not: a victim under a read lease stops taking new
        # leases now and is freed when its last one ends (the caller's part).
        if key in node.evict_after_offload:
            plan.offload_urgent = True  # already on its way out, once its offload lands
        elif meta.has_other_copy(node.node_id, DRAM) or cfg.dram_only:
            table.mark_removing(key, node.node_id, DRAM)
            plan.evict.append(key)
        else:
            node.evict_after_offload.add(key)
            plan.offload_urgent = True
            if key not in node.offload_queued:
                plan.offload.append(key)
    # Promotions take room that is free now: what this plan evicts is freed later (after
    # a drop, an offload or a lease), and the promotions it makes room for wait till then.
    room = min(high - (used - freed), cap - node.stats.dram_used - node.pending_bytes)
    while promote and promote_bytes > room:
        promote_bytes -= promote.pop().size
    for meta in promote:
        del node.promote_queued[meta.key]
    plan.promote = [meta.key for meta in promote]
    return plan


def _promotions(node: NodeState, table: ObjectTable, budget: float) -> list[ObjectMeta]:
    """The queued promotions to plan now, the most recently read first, up to ``budget``
    bytes; keys that no longer need one (gone, or in DRAM already) leave the queue."""
    chosen: list[ObjectMeta] = []
    total = 0
    for key in reversed(list(node.promote_queued)):
        meta = table.objects.get(key)
        if meta is None or meta.replica(node.node_id, SSD) is None \
                or meta.replica(node.node_id, DRAM) is not None:
            del node.promote_queued[key]
            continue
        if total + meta.size > budget:
            break
        chosen.append(meta)
        total += meta.size
    return chosen


def count_ssd_read(meta: ObjectMeta, cfg: PolicySettings, now: float) -> bool:
    """Count a read served only by SSD; True when the object should be promoted."""
    if now - meta.window_start > cfg.promote_window:
        meta.window_start = now
        meta.window_reads = 0
    meta.window_reads += 1
    return meta.window_reads >= cfg.promote_reads
