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

from kvstored import __version__
from kvstored.tools import models, planning, reader, sweep, tiered
from kvstored.tools.core import POLICIES, Replay, trim_heap
from kvstored.tools.errors import UsageProblem
from kvstored.tools.events import EventTrace

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
    margin: float = 0.05                       # recommended: within this share of the best
    recommend_policy: str | None = None
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
    if not 0 <= options.margin < 1:
        raise UsageProblem(f"--margin must be in [0, 1), got {options.margin}")
    if not 0 < options.s3fifo_small < 1:
        raise UsageProblem("the s3fifo small-queue share must be in (0, 1)")


@dataclass
class Prepared:
    """A trace read, sized for a model and built into a prefix trie: what ``simulate``
    and the DRAM x SSD plan both start from."""

    trace: EventTrace
    replay: Replay
    bytes_per_token: float | None
    bytes_per_block: float | None
    model: dict | None
    distinct_ids: int | None
    started: float
    loaded: float

    def header(self, tool: str) -> dict:
        """The result fields that describe the input."""
        ceiling = self.replay.ceiling()
        return {
            "tool": tool,
            "version": __version__,
            "engine": self.replay.engine,
            "trace": self.trace.summary() | {"uniqueBlocks": self.replay.unique_blocks,
                                             "distinctIds": self.distinct_ids},
            "model": self.model,
            "blockSize": self.trace.block_size,
            "bytesPerToken": self.bytes_per_token,
            "bytesPerBlock": self.bytes_per_block,
            "warmupFraction": None,  # set by the caller
            "warmupRequests": self.replay.warmup_requests,
            "totalMeasuredTokens": self.replay.measured_tokens(),
            "reuseCeiling": ceiling.hit_rate,
            "ceiling": {"hitTokens": ceiling.hit_tokens, "totalTokens": ceiling.total_tokens,
                        "hitRate": ceiling.hit_rate,
                        "idealSpeedup": planning.ideal_speedup(ceiling.hit_rate)},
        }


def prepare(paths: list[str | Path], options: SimOptions, *,
            progress: ProgressFn | None = None, trace: EventTrace | None = None,
            need_blocks_size: bool = True, keep_ids: bool = False) -> Prepared:
    """Read the trace (unless given), size it for the model, build the trie. The block
    ids are freed afterwards unless ``keep_ids`` or the trace was given."""
    started = time.perf_counter()
    table = models.load(options.models_file)
    if options.model:
        table.get(options.model)  # an unknown model fails before the trace is read
    elif options.bytes_per_token is None and need_blocks_size:
        raise UsageProblem("give --model (see --list-models) or --bytes-per-token to turn "
                           "budgets into blocks, or give capacities in --blocks")
    if progress:
        progress(0, 1, "reading the trace")
    owned = trace is None
    if trace is None:
        trace = reader.load(paths, options.fmt, options.block_size,
                            skip_bad_lines=options.skip_bad_lines, keep_id_names=keep_ids,
                            progress=progress)
        trim_heap()
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
    if owned and not keep_ids:  # the ids are in the trie now; free their 8 bytes per event
        trace.ids = trace.ids[:0]
        trim_heap()
    bytes_per_block = bytes_per_token * trace.block_size if bytes_per_token else None
    return Prepared(trace, replay, bytes_per_token, bytes_per_block,
                    _model_info(table, options, sizing, bytes_per_token, sizing_tokens),
                    distinct, started, loaded)


def simulate(paths: list[str | Path], options: SimOptions, *,
             progress: ProgressFn | None = None, trace: EventTrace | None = None) -> dict:
    """Load the trace (unless given), replay it, and return the result document."""
    _check(options)
    ready = prepare(paths, options, progress=progress, trace=trace,
                    need_blocks_size=options.blocks is None)
    replay, bytes_per_block = ready.replay, ready.bytes_per_block
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
    swept = sweep.run(replay, spec, bytes_per_token=ready.bytes_per_token, progress=progress)
    result = ready.header("kvstore sim") | {
        "warmupFraction": options.warmup,
        "policies": list(options.policies),
        "tiered": tier.describe(bytes_per_block, options.ssd_gib if options.ssd_blocks is None
                                else None) if tier else None,
        "points": swept["points"],
    }
    if tier and ready.bytes_per_token:  # an infinite DRAM under the TTFT model
        result["ceilingTtft"] = tiered.ttft(
            tier, total_tokens=result["ceiling"]["totalTokens"],
            dram_tokens=result["ceiling"]["hitTokens"], ssd_tokens=0,
            requests=replay.requests - replay.warmup_requests,
            bytes_per_token=ready.bytes_per_token)
    fits = any(b.blocks >= replay.unique_blocks for b in budgets)
    result["recommended"] = _recommend(result, options, fits)
    result["memory"] = replay.memory_bytes() | {"jobs": spec.jobs}
    result["timing"] = {"loadSeconds": ready.loaded - ready.started,
                        "replaySeconds": time.perf_counter() - ready.loaded}
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


def recommendation_metric(result: dict, policy: str) -> str:
    """What the recommendation compares: the modelled TTFT speedup for tiered (its ideal
    speedup is the same at every DRAM size under write-through), else the ideal one."""
    return "ttftSpeedup" if policy == "tiered" and result.get("ceilingTtft") else "idealSpeedup"


def point_speedup(result: dict, point: dict, policy: str) -> float:
    """The recommendation metric of one point (a ceiling point: the ceiling's)."""
    if recommendation_metric(result, policy) == "idealSpeedup":
        return point["results"][policy]["idealSpeedup"]
    timing = point["results"][policy].get("ttft")
    return timing["speedup"] if timing else result["ceilingTtft"]["speedup"]


def _recommend(result: dict, options: SimOptions, fits: bool) -> dict:
    policy = options.recommend_policy or next(
        p for p in ("tiered", "lru", "s3fifo", "fifo", "optimal") if p in options.policies)
    if policy not in options.policies:
        raise UsageProblem(f"--recommend-policy {policy} is not among --policies")
    metric = recommendation_metric(result, policy)
    chosen = [p for p in result["points"] if p["gib"] is not None]
    points = [(p["gib"], point_speedup(result, p, policy)) for p in chosen]
    ceiling = result["ceilingTtft"]["speedup"] if metric == "ttftSpeedup" \
        else result["ceiling"]["idealSpeedup"]
    fits = fits or any(p["mode"] == sweep.CEILING for p in result["points"])
    out = {"policy": policy, "metric": metric} | planning.recommend_budget(
        points, options.margin, ceiling_speedup=ceiling, fits=fits)
    if out.get("gib") is not None:
        at = next(p for p in chosen if p["gib"] == out["gib"])
        out["speedup"] = out.pop("idealSpeedup")
        out["idealSpeedup"] = at["results"][policy]["idealSpeedup"]
    return out
