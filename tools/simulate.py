"""The simulator as a library call: a trace and options in, the JSON-ready result out.

``kvstore sim``, ``kvstore bench sim`` and the tests all go through :func:`simulate`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from kvstored.tools import models, planning, reader, sweep, tiered
from kvstored.tools.core import POLICIES, Replay
from kvstored.tools.errors import UsageProblem
from kvstored.tools.events import EventTrace

from kvstored import __version__

ProgressFn = Callable[[float, float, str], None]


@dataclass
class SimOptions:
    fmt: str = "auto"
    block_size: int | None = None
    model: str | None = None
    bytes_per_token: float | None = None
    precision: str | None = None               # default: the model's own
    indexer_precision: str | None = None
    include_draft_kv: bool = False
    estimate_tokens: int | None = None         # default: the trace's mean input length
    models_file: Path | None = None
    budgets_gib: list[float] | None = None     # default: 1 GiB .. 16 TiB
    blocks: list[int] | None = None            # instead of budgets
    policies: list[str] = field(default_factory=lambda: ["fifo", "lru", "optimal"])
    warmup: float = 0.5
    ssd_gib: float | None = None               # tiered
    ssd_blocks: int | None = None
    write_through: bool = True
    promote: bool = True
    prefill_tokens_per_s: float = tiered.DEFAULT_PREFILL_TOKENS_PER_S
    dram_gbps: float = tiered.DEFAULT_DRAM_GBPS
    ssd_gbps: float = tiered.DEFAULT_SSD_GBPS
    knee_speedup_per_tib: float = 0.5
    knee_policy: str | None = None
    s3fifo_small: float = 0.1
    jobs: int = 1                              # replays at once; 0: one per CPU
    engine: str = "auto"
    skip_bad_lines: bool = False               # count and leave out malformed lines
    count_distinct_ids: bool = False           # the reference layout's rawUniqueBlocks


def default_jobs() -> int:
    return max(1, os.cpu_count() or 1)


def _check(options: SimOptions) -> None:
    unknown = [p for p in options.policies if p not in POLICIES]
    if unknown or not options.policies:
        raise UsageProblem(f"unknown policy {', '.join(unknown) or '(none)'}; use some of "
                           f"{', '.join(POLICIES)}")
    if len(set(options.policies)) != len(options.policies):
        raise UsageProblem("a policy is listed twice in --policies")
    if not 0 <= options.warmup < 1:
        raise UsageProblem(f"--warmup must be in [0, 1), got {options.warmup}")
    if options.budgets_gib is not None and options.blocks is not None:
        raise UsageProblem("give --budgets or --blocks, not both")
    if options.model and options.bytes_per_token:
        raise UsageProblem("give --model or --bytes-per-token, not both")
    if options.bytes_per_token is not None and options.bytes_per_token <= 0:
        raise UsageProblem("--bytes-per-token must be positive")
    if "tiered" in options.policies and options.ssd_gib is None and options.ssd_blocks is None:
        raise UsageProblem("the tiered policy needs the SSD tier's size: give --ssd (e.g. "
                           "--ssd 2TiB) or --ssd-blocks")
    if not 0 < options.s3fifo_small < 1:
        raise UsageProblem("the s3fifo small-queue share must be in (0, 1)")


def simulate(paths: list[str | Path], options: SimOptions, *,
             progress: ProgressFn | None = None, trace: EventTrace | None = None) -> dict:
    """Load the trace (unless given), replay it, and return the result document."""
    _check(options)
    started = time.perf_counter()
    table = models.load(options.models_file)
    if options.model:
        table.get(options.model)  # an unknown model fails before the trace is read
    elif options.bytes_per_token is None and options.blocks is None:
        raise UsageProblem("give --model (see --list-models) or --bytes-per-token to turn "
                           "budgets into blocks, or give capacities in --blocks")
    if progress:
        progress(0, 1, "reading the trace")
    owned = trace is None
    if trace is None:
        trace = reader.load(paths, options.fmt, options.block_size,
                            skip_bad_lines=options.skip_bad_lines)
    loaded = time.perf_counter()
    sizing = None
    sizing_tokens = options.estimate_tokens or estimate_tokens(trace)
    if options.model:
        sizing = table.sizing(options.model, options.precision,
                              indexer_precision=options.indexer_precision,
                              tokens=sizing_tokens, draft=options.include_draft_kv)
        bytes_per_token = sizing.bytes_per_token
    else:
        bytes_per_token = options.bytes_per_token
    if progress:
        progress(0, 1, "building the prefix trie")
    distinct = len(np.unique(trace.ids)) if options.count_distinct_ids else None
    replay = Replay(trace, options.warmup, next_use="optimal" in options.policies,
                    engine=options.engine)
    if owned:  # the block ids are in the trie now; free their 8 bytes per event
        trace.ids = trace.ids[:0]
    bytes_per_block = bytes_per_token * trace.block_size if bytes_per_token else None
    budgets = _budgets(options, bytes_per_block)
    tier = None
    if "tiered" in options.policies:
        ssd_blocks = options.ssd_blocks
        if ssd_blocks is None:
            if bytes_per_block is None:
                raise UsageProblem("--ssd is a size: it needs --model or --bytes-per-token; "
                                   "or give --ssd-blocks")
            ssd_blocks = planning.cache_blocks(options.ssd_gib, bytes_per_block)
        tier = tiered.TierConfig(ssd_blocks, options.write_through, options.promote,
                                 options.prefill_tokens_per_s, options.dram_gbps,
                                 options.ssd_gbps)
    spec = sweep.SweepSpec(tuple(options.policies), tuple(budgets), tier,
                           options.s3fifo_small, options.jobs or default_jobs())
    swept = sweep.run(replay, spec, bytes_per_token=bytes_per_token, progress=progress)
    ceiling = swept["ceiling"]
    result = {
        "tool": "kvstore sim",
        "version": __version__,
        "engine": replay.engine,
        "trace": trace.summary() | {"uniqueBlocks": replay.unique_blocks,
                                    "distinctIds": distinct},
        "model": _model_info(table, options, sizing, bytes_per_token, sizing_tokens),
        "blockSize": trace.block_size,
        "bytesPerToken": bytes_per_token,
        "bytesPerBlock": bytes_per_block,
        "warmupFraction": options.warmup,
        "warmupRequests": replay.warmup_requests,
        "totalMeasuredTokens": replay.measured_tokens(),
        "policies": list(options.policies),
        "reuseCeiling": ceiling.hit_rate,
        "ceiling": {"hitTokens": ceiling.hit_tokens, "totalTokens": ceiling.total_tokens,
                    "hitRate": ceiling.hit_rate,
                    "idealSpeedup": planning.ideal_speedup(ceiling.hit_rate)},
        "tiered": tier.describe(bytes_per_block) if tier else None,
        "points": swept["points"],
    }
    result["recommended"] = _recommend(result, options)
    result["memory"] = replay.memory_bytes() | {"jobs": spec.jobs}
    result["timing"] = {"loadSeconds": loaded - started,
                        "replaySeconds": time.perf_counter() - loaded}
    return result


def _budgets(options: SimOptions, bytes_per_block: float | None) -> list[sweep.Budget]:
    if options.blocks is not None:
        if any(b < 0 for b in options.blocks):
            raise UsageProblem("--blocks must not be negative")
        return [sweep.Budget(b * bytes_per_block / planning.GIB if bytes_per_block else None, b)
                for b in sorted(set(options.blocks))]
    gibs = sorted(set(options.budgets_gib or planning.DEFAULT_BUDGETS_GIB))
    if any(g < 0 for g in gibs):
        raise UsageProblem("--budgets must not be negative")
    return [sweep.Budget(g, planning.cache_blocks(g, bytes_per_block)) for g in gibs]


def estimate_tokens(trace: EventTrace) -> int:
    """The sequence length that length-dependent formulas are sized at: the trace's mean
    input tokens (the sum of the block weights over the requests), as the reference
    simulator takes it."""
    return max(1, int(int(trace.tokens.sum(dtype="uint64")) // max(1, trace.requests)))


def _model_info(table: models.ModelTable, options: SimOptions, sizing, bytes_per_token,
                tokens: int) -> dict | None:
    if sizing is not None:
        model = table.models[options.model]
        return {"id": model.id, "label": model.label, "formula": model.formula,
                "family": model.family, "tokenDependent": model.spec.uses_tokens} \
            | sizing.to_dict() | {"estimateTokens": tokens}
    if bytes_per_token:
        return {"id": None, "label": f"{bytes_per_token:g} bytes/token (given)",
                "precision": None, "formula": None}
    return None


def _recommend(result: dict, options: SimOptions) -> dict:
    policy = options.knee_policy or next(
        p for p in ("tiered", "lru", "s3fifo", "fifo", "optimal") if p in options.policies)
    if policy not in options.policies:
        raise UsageProblem(f"--knee-policy {policy} is not among --policies")
    points = [(p["gib"], p["results"][policy]["idealSpeedup"]) for p in result["points"]
              if p["gib"] is not None]
    return {"policy": policy} | planning.knee(points, options.knee_speedup_per_tib)
