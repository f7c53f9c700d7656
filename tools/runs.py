"""One replay asked for (:class:`PolicySpec`: a policy and its capacities) and what it
gave (:class:`RunResult`): what the compiled core (:mod:`kvstored.tools.core`) and the
plain-Python replay (:mod:`kvstored.tools.refsim`) both take and return."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np


@dataclass(frozen=True)
class PolicySpec:
    """One replay: a policy and its capacity in blocks (DRAM for tiered)."""

    policy: str
    capacity: int
    ssd_capacity: int = 0        # tiered
    write_through: bool = True   # tiered: else offload-on-evict
    promote: bool = True         # tiered: copy SSD hits into DRAM
    small_fraction: float = 0.1  # s3fifo: share of the small FIFO
    full_run: bool = False       # replay every request even if underfilled
    promote_reads: int = 1       # tiered: promote a block on its n-th SSD hit (and later)
    ssd_fifo: bool = False       # tiered: the SSD evicts oldest first (no trie rule)

    @property
    def small_capacity(self) -> int:
        return max(1, int(self.capacity * self.small_fraction))


@dataclass
class RunResult:
    hit_tokens: int
    total_tokens: int
    underfilled: bool
    ssd_hit_tokens: int = 0
    evictions: int = 0
    promotions: int = 0
    ssd_writes: int = 0
    # tiered with per_request: hit tokens of every request (measured or not), and the
    # part the SSD served
    request_hit_tokens: np.ndarray | None = field(default=None, repr=False)
    request_ssd_hit_tokens: np.ndarray | None = field(default=None, repr=False)

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.total_tokens if self.total_tokens else 0.0

    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if not k.startswith("request_")}
