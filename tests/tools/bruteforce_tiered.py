"""An independent brute-force model of the ``tiered`` policy, written from the rules in
docs/simulator.md (not from the C core): dictionaries of node -> last touch, victims found
by scanning every cached node. Quadratic, so only for small traces.

Rules it implements:
- lookup: a block hits while the prefix is unbroken and either tier holds it; DRAM serves
  it when it holds it; a hit refreshes the block in every tier holding it;
- insert: the request's blocks cached at the start are protected in the tiers holding
  them; each tier takes the request's blocks in order (evict that tier's least recently
  touched unprotected leaf when full, then insert only under a parent cached in either
  tier) until it refuses one; a new block goes to DRAM, and to the SSD in write-through
  mode or when DRAM refused it; a prefix hit served by the SSD is copied to DRAM with
  promotion; in offload mode a block DRAM evicts is written to the SSD unless it is
  there (an SSD with nothing to evict drops it); with ``promote_reads`` k > 1 only a
  block served by the SSD at least k times so far is copied; with ``ssd_fifo`` the SSD
  evicts its oldest write (protected or not, leaf or not), inserts any block, and a hit
  does not refresh it;
- warm-up and "underfilled" as for every policy: the first ``warmup`` requests are not
  measured, and the run is underfilled when DRAM (the SSD without DRAM) never filled
  during them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class BruteResult:
    hit_tokens: int
    ssd_hit_tokens: int
    total_tokens: int
    underfilled: bool
    promotions: int
    ssd_writes: int
    evictions: int


def tiered(paths: list[list[int]], weights: list[list[int]], parent: dict[int, int],
           warmup: int, dram_cap: int, ssd_cap: int, write_through: bool,
           promote: bool, promote_reads: int = 1, ssd_fifo: bool = False) -> BruteResult:
    """``paths[r]``: the trie nodes of request r (root excluded), ``weights[r]`` their
    tokens, ``parent[node]`` the parent node (0 is the root)."""
    clock = [0]
    dram: dict[int, int] = {}
    ssd: dict[int, int] = {}
    counters = {"promotions": 0, "ssd_writes": 0, "evictions": 0}

    def tick() -> int:
        clock[0] += 1
        return clock[0]

    def cached(node: int) -> bool:
        return node == 0 or node in dram or node in ssd

    def victim(tier: dict[int, int], protected: set[int]) -> int | None:
        if tier is ssd and ssd_fifo:
            return min(tier, key=lambda n: tier[n]) if tier else None
        leaves = [n for n in tier if n not in protected
                  and not any(parent[c] == n for c in tier)]
        return min(leaves, key=lambda n: tier[n]) if leaves else None

    def put(tier: dict[int, int], cap: int, node: int, protected: set[int],
            offload_victim: bool) -> bool:
        if len(tier) >= cap:
            out = victim(tier, protected)
            if out is None:
                return False
            del tier[out]
            if tier is dram:
                counters["evictions"] += 1
                if offload_victim and out not in ssd:
                    offload(out, ssd_protected[0])
        if len(tier) < cap and (cached(parent[node]) or (tier is ssd and ssd_fifo)):
            tier[node] = tick()
            if tier is ssd:
                counters["ssd_writes"] += 1
            return True
        return False

    def offload(node: int, protected: set[int]) -> None:
        if ssd_cap == 0:
            return
        if len(ssd) >= ssd_cap:
            out = victim(ssd, protected)
            if out is None:
                return
            del ssd[out]
        ssd[node] = tick()
        counters["ssd_writes"] += 1

    ssd_reads: dict[int, int] = {}
    ssd_protected: list[set[int]] = [set()]
    filled = False
    fill_dram = dram_cap > 0
    hits = ssd_hits = total = 0
    for r, path in enumerate(paths):
        measured = r >= warmup
        if measured and not filled:
            return BruteResult(hits, ssd_hits, total, True, **counters)
        broken = False
        first_miss = len(path)
        for i, node in enumerate(path):
            w = weights[r][i]
            if measured:
                total += w
            if broken:
                continue
            if node not in dram and node not in ssd:
                broken = True
                first_miss = i
                continue
            if measured:
                hits += w
                if node not in dram:
                    ssd_hits += w
            if node in dram:
                dram[node] = tick()
            else:
                ssd_reads[node] = ssd_reads.get(node, 0) + 1
            if node in ssd and not ssd_fifo:
                ssd[node] = tick()
        dram_protected = {n for n in path if n in dram}
        ssd_protected[0] = {n for n in path if n in ssd}
        dram_open, ssd_open = dram_cap > 0, ssd_cap > 0
        for i, node in enumerate(path):
            if not (dram_open or ssd_open):
                break
            if node not in dram and node not in ssd:
                placed = False
                if dram_open:
                    placed = put(dram, dram_cap, node, dram_protected, not write_through)
                    dram_open = placed
                if ssd_open and (write_through or not placed):
                    ok = put(ssd, ssd_cap, node, ssd_protected[0], False)
                    ssd_open = ok
                    placed = placed or ok
                if not placed:
                    break
            elif node not in dram and dram_open and promote and i < first_miss \
                    and ssd_reads.get(node, 0) >= promote_reads:
                if put(dram, dram_cap, node, dram_protected, not write_through):
                    counters["promotions"] += 1
                else:
                    dram_open = False
            if not measured and (len(dram) >= dram_cap if fill_dram
                                 else len(ssd) >= ssd_cap):
                filled = True
    return BruteResult(hits, ssd_hits, total, not filled or total == 0, **counters)
