"""The prediction beside a replay: the store's configuration as the simulator sees it.

The master's ``status`` gives each tier's capacity in bytes (the sum over the live
nodes); the simulator counts blocks. :func:`capacities` converts one into the other the
way the store fills its tiers with blocks of ``block_bytes`` (docs/replay.md, "The
prediction", says the same in words):

- **DRAM**: an object takes ``align_up(block_bytes, 4096)`` bytes of the segment (the
  node's allocator hands out 4 KiB granules). The master evicts at a heartbeat once use
  is above the high watermark, down to the low one; between two heartbeats puts take the
  segment on towards full, so the tier spends its time between the low watermark and
  full, about the high watermark on average (measured: docs/replay.md). The model's DRAM
  is ``floor(high * capacity / object bytes)`` blocks of prefix LRU (the master's LRU
  is per object, which on prefix-chained blocks evicts nearly the same).
- **SSD**: an object of the ``bucket`` backend takes its record (a 4 KiB header page,
  the value padded to 4 KiB), its index entry and key, and its share of its bucket's
  index file and spare block (buckets of ``bucket_keys`` objects). The backend evicts
  in the write path once a write would pass its high watermark, oldest bucket first,
  down to its low watermark; measured, the tier then serves as a FIFO of about its high
  watermark (docs/replay.md), so the model's SSD is ``floor(high * capacity / object
  bytes)`` blocks, FIFO (the backends' default ``policy``; ``lru`` gives an LRU SSD).
  Other backends are taken as record-sized objects with the same rule (a note says so).
- **Offload**: ``eager`` is the model's write-through (every new block goes to SSD);
  ``watermark`` is its offload-on-evict.
- **Promotion**: the store copies an SSD object back to DRAM on its ``promote_reads``-th
  read within ``promote_window``; the model does so on a block's ``promote_reads``-th
  SSD hit and every later one (it has no clock for the window). ``dram_only`` stores
  have no SSD.

The master does not report its policy (watermarks, promotion) or the backend's options,
so those come from the configuration this process sees (``kvstored.config``): the same
as the daemon's when both run with the same file and environment, as the embedded store
does. The result says where each figure came from.

This module predicts; it does not run the store (``runner``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from kvstored.backends.bucket.index import index_size
from kvstored.config import Config
from kvstored.sdk.record import record_size
from kvstored.tools.events import EventTrace
from kvstored.tools.tiered import TierReplay, replay_tiers

#: The DRAM allocator's granule (``kvstored.node.dram.DramTier``): an object of n bytes
#: takes n rounded up to it.
DRAM_GRANULE = 4096
#: The bucket backend's defaults (``kvstored.backends.bucket.BucketBackend``).
BUCKET_DEFAULTS = {"bucket_keys": 500, "high_watermark": 0.90}
DISK_BLOCK = 4096


def align_up(n: int, alignment: int) -> int:
    return (n + alignment - 1) // alignment * alignment


@dataclass(frozen=True)
class StorePolicy:
    """The tiering settings of the store, and where they were read."""

    dram_high_watermark: float
    dram_low_watermark: float
    promote_reads: int
    dram_only: bool
    offload: str
    backend: str
    backend_options: dict[str, Any]
    source: str

    @classmethod
    def from_config(cls, cfg: Config, backend: str | None = None) -> StorePolicy:
        """The settings a daemon started with the configuration ``cfg`` would use
        (``backend``: what the master reports the nodes run, if known)."""
        policy, node = cfg.policy, cfg.node
        return cls(policy.dram_high_watermark, policy.dram_low_watermark,
                   policy.promote_reads, policy.dram_only, policy.offload,
                   backend or node.backend, dict(node.backend_options),
                   "this process's configuration (the master does not report its policy)")


@dataclass(frozen=True)
class Capacities:
    """The store's tiers in bytes and in blocks, and how one became the other."""

    block_bytes: int
    dram_bytes: int
    ssd_bytes: int
    dram_object_bytes: int
    ssd_object_bytes: int
    dram_fill: float
    ssd_fill: float
    dram_blocks: int
    ssd_blocks: int
    ssd_fifo: bool
    promote_reads: int
    write_through: bool
    nodes: int
    notes: list[str] = field(default_factory=list)

    def describe(self) -> dict[str, Any]:
        return asdict(self)


def _bucket_object_bytes(block_bytes: int, key_bytes: int, options: dict) -> int:
    keys = int(options.get("bucket_keys", BUCKET_DEFAULTS["bucket_keys"]))
    # A bucket of `keys` objects: their records, its index file rounded up to disk
    # blocks, and the spare block the backend reserves per bucket.
    bucket = (keys * record_size(block_bytes)
              + align_up(index_size(keys, keys * key_bytes), DISK_BLOCK) + DISK_BLOCK)
    return -(-bucket // keys)


def capacities(status: dict, block_bytes: int, key_bytes: int,
               policy: StorePolicy) -> Capacities:
    """The blocks of ``block_bytes`` (keys of ``key_bytes``) each tier of the store whose
    master answered ``status`` holds when it starts to evict."""
    live = [n for n in status["nodes"] if n.get("alive", True)]
    dram_bytes = int(status["tiers"]["dram"]["capacity_bytes"])
    ssd_bytes = int(status["tiers"]["ssd"]["capacity_bytes"])
    notes: list[str] = []
    dram_object = align_up(block_bytes, DRAM_GRANULE)
    backends = {n.get("backend") or policy.backend for n in live} or {policy.backend}
    options = policy.backend_options
    ssd_fill = float(options.get("high_watermark", BUCKET_DEFAULTS["high_watermark"]))
    if backends == {"bucket"}:
        ssd_object = _bucket_object_bytes(block_bytes, key_bytes, options)
    else:
        ssd_object = record_size(block_bytes) + key_bytes
        notes.append(f"SSD backend {', '.join(sorted(backends))}: objects taken as one "
                     "record each (a 4 KiB header page and the value padded to 4 KiB)")
    if policy.dram_only:
        ssd_bytes = 0
        notes.append("policy.dram_only: the store keeps nothing on SSD")
    dram_fill = policy.dram_high_watermark
    return Capacities(
        block_bytes=block_bytes, dram_bytes=dram_bytes, ssd_bytes=ssd_bytes,
        dram_object_bytes=dram_object, ssd_object_bytes=ssd_object,
        dram_fill=dram_fill, ssd_fill=ssd_fill,
        dram_blocks=int(dram_fill * dram_bytes // dram_object),
        ssd_blocks=int(ssd_fill * ssd_bytes // ssd_object) if ssd_bytes else 0,
        ssd_fifo=str(options.get("policy", "fifo")) != "lru",
        promote_reads=policy.promote_reads, write_through=policy.offload == "eager",
        nodes=len(live), notes=notes)


def predict(trace: EventTrace, caps: Capacities, warmup: float = 0.0) -> TierReplay:
    """The simulator's tiered policy on ``trace`` with the store's capacities. With eager
    offload the store writes every new object to SSD in the background (write-through);
    with watermark offload a DRAM object reaches the SSD when it is evicted."""
    return replay_tiers(trace, caps.dram_blocks, caps.ssd_blocks,
                        write_through=caps.write_through, promote=True,
                        promote_reads=caps.promote_reads, ssd_fifo=caps.ssd_fifo,
                        warmup=warmup)
