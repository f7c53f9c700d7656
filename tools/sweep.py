"""The sweep: every budget x every policy, with the reference's rules for the curve.

- Budgets are taken in ascending order. A budget whose block count is at least the
  trace's unique blocks is not simulated (it could only return the ceiling), and neither
  is any larger one.
- A budget of 0 blocks is a cache that holds nothing: 0 hits; except for ``tiered``,
  where the budget is the DRAM tier and 0 DRAM leaves the SSD tier (lru on the SSD).
- When a policy's cache never filled during the warm-up, that budget's point is
  replaced by the ceiling for every policy (mode ``ceiling_no_pressure``) and the curve
  ends there.

Replays run on ``jobs`` threads, in budget order; once a budget turns out underfilled,
larger budgets that have not started are skipped.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass

import numpy as np

from kvstored.tools import tiered
from kvstored.tools.core import Replay
from kvstored.tools.planning import ideal_speedup
from kvstored.tools.runs import PolicySpec, RunResult

FIXED = "fixed_window"
CEILING = "ceiling_no_pressure"
ProgressFn = Callable[[float, float, str], None]


@dataclass(frozen=True)
class Budget:
    gib: float | None   # None when given in blocks without a model
    blocks: int


@dataclass(frozen=True)
class SweepSpec:
    policies: tuple[str, ...]
    budgets: tuple[Budget, ...]          # ascending
    tier: tiered.TierConfig | None = None
    s3fifo_small: float = 0.1
    jobs: int = 1


def _specs(spec: SweepSpec, budget: Budget) -> dict[str, PolicySpec]:
    out = {}
    for policy in spec.policies:
        if policy == "tiered":
            tier = spec.tier
            out[policy] = PolicySpec("tiered", budget.blocks, tier.ssd_blocks,
                                     tier.write_through, tier.promote)
        elif policy == "s3fifo":
            out[policy] = PolicySpec(policy, budget.blocks, small_fraction=spec.s3fifo_small)
        else:
            out[policy] = PolicySpec(policy, budget.blocks)
    return out


def _two_point_spec(spec: SweepSpec, budget: Budget, unique: int) -> PolicySpec | None:
    """The single-tier LRU of DRAM + SSD size that the two-point estimate divides by."""
    total = budget.blocks + spec.tier.ssd_blocks
    return PolicySpec("lru", total) if total < unique else None


def run(replay: Replay, spec: SweepSpec, *, bytes_per_token: float | None = None,
        progress: ProgressFn | None = None) -> dict:
    """Run the sweep; returns the JSON-ready result (points, ceiling, ...)."""
    unique = replay.unique_blocks
    ceiling = replay.ceiling()
    simulated = []
    for budget in spec.budgets:
        if budget.blocks >= unique:
            break
        simulated.append(budget)
    # Tasks in budget order, each distinct replay once.
    tasks: list[tuple[int, PolicySpec, bool]] = []  # (budget index, spec, ends the curve)
    seen: set[PolicySpec] = set()
    for k, budget in enumerate(simulated):
        if budget.blocks == 0:
            if "tiered" in spec.policies and spec.tier.ssd_blocks > 0:
                tasks.append((k, _specs(spec, budget)["tiered"], False))
            continue
        wanted = [(s, True) for s in _specs(spec, budget).values()]
        if "tiered" in spec.policies:
            extra = _two_point_spec(spec, budget, unique)
            if extra is not None:
                wanted.append((extra, False))
            wanted.append((PolicySpec("lru", budget.blocks), False))
        for s, ends in wanted:
            if s not in seen:
                seen.add(s)
                tasks.append((k, s, ends))
    results = execute(replay, tasks, spec.jobs, progress)
    points = []
    for budget in simulated:
        point = _point(replay, spec, budget, results, ceiling, unique, bytes_per_token)
        points.append(point)
        if point["mode"] == CEILING:
            break
    return {"ceiling": ceiling, "points": points}


def execute(replay: Replay, tasks, jobs: int, progress: ProgressFn | None
            ) -> dict[PolicySpec, RunResult]:
    """Run ``tasks`` (budget index, spec, whether an underfilled result ends the curve)
    on ``jobs`` threads; a task past an ending budget is skipped."""
    stop_at = [len(tasks) and max(k for k, _, _ in tasks)]
    lock = threading.Lock()
    cancel = np.zeros(1, dtype=np.int32)
    counters = [np.zeros(1, dtype=np.int64) for _ in tasks]
    results: dict[PolicySpec, RunResult] = {}

    def work(index: int) -> None:
        k, s, ends = tasks[index]
        with lock:
            if k > stop_at[0]:
                return
        result = replay.run(s, progress=counters[index], cancel=cancel)
        with lock:
            results[s] = result
            if ends and result.underfilled:
                stop_at[0] = min(stop_at[0], k)

    total = float(len(tasks) * max(1, replay.requests))
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        pending = {pool.submit(work, i) for i in range(len(tasks))}
        try:
            while pending:
                done, pending = wait(pending, timeout=0.1, return_when=FIRST_COMPLETED)
                for future in done:
                    future.result()
                if progress:
                    progress(float(sum(int(c[0]) for c in counters)), total, "replaying")
        except BaseException:
            cancel[0] = 1
            raise
    return results


def _result(run: RunResult) -> dict:
    return {"hitTokens": run.hit_tokens, "totalTokens": run.total_tokens,
            "hitRate": run.hit_rate, "mode": FIXED, "idealSpeedup": ideal_speedup(run.hit_rate)}


def _point(replay: Replay, spec: SweepSpec, budget: Budget, results, ceiling: RunResult,
           unique: int, bytes_per_token: float | None) -> dict:
    specs = _specs(spec, budget)
    measured = replay.requests - replay.warmup_requests
    if budget.blocks == 0:
        empty = RunResult(0, replay.measured_tokens(), False)
        out = {p: _result(empty) for p in spec.policies}
        if "tiered" in out:
            ssd_only = results.get(specs["tiered"], empty)
            if ssd_only.underfilled:  # the SSD never filled: it holds every block
                ssd_only = RunResult(ceiling.hit_tokens, ceiling.total_tokens, False,
                                     ssd_hit_tokens=ceiling.hit_tokens)
            out["tiered"] = tiered.point(spec.tier, ssd_only, lru_dram_hits=None,
                                         lru_total_hits=None, requests=measured,
                                         bytes_per_token=bytes_per_token) | {"mode": FIXED}
        return {"gib": budget.gib, "cacheBlocks": budget.blocks, "mode": FIXED, "results": out}
    runs = {p: results[s] for p, s in specs.items()}
    if any(r.underfilled for r in runs.values()):
        at_ceiling = _result(ceiling) | {"mode": CEILING}
        return {"gib": budget.gib, "cacheBlocks": budget.blocks, "mode": CEILING,
                "results": {p: dict(at_ceiling) for p in spec.policies}}
    out = {p: _result(r) for p, r in runs.items()}
    if "tiered" in runs:
        dram_only = results.get(PolicySpec("lru", budget.blocks))
        two_point = _two_point_spec(spec, budget, unique)
        total = results.get(two_point) if two_point else ceiling
        out["tiered"] = tiered.point(
            spec.tier, runs["tiered"],
            lru_dram_hits=dram_only.hit_tokens if dram_only else None,
            lru_total_hits=total.hit_tokens if total else None,
            requests=measured, bytes_per_token=bytes_per_token) | {"mode": FIXED}
    return {"gib": budget.gib, "cacheBlocks": budget.blocks, "mode": FIXED, "results": out}
