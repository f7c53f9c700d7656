"""``kvstore sim plan``: DRAM and SSD sized together for a trace and a model, priced.

Every cell of a DRAM x SSD grid is one replay of the ``tiered`` policy (each request
replayed, ``full_run``), reported with its hit rate, the DRAM and SSD shares of the hits,
the ideal speedup, the modelled TTFT (``tiered.ttft``) and its cost. The recommendation
is the cheapest cell within ``margin`` of the best modelled TTFT speedup on the grid, or
the cheapest that meets ``target_speedup``, or the fastest within ``budget``; with the
marginal speedup of one more step of DRAM or SSD beside it. Every threshold is relative
or in the user's units, so none moves with the trace's size.

This module computes the plan; the CLI, plots and HTML render it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from kvstored.tools import planning, sweep, tiered
from kvstored.tools.errors import UsageProblem
from kvstored.tools.planning import ideal_speedup, size_label
from kvstored.tools.runs import PolicySpec
from kvstored.tools.simulate import SimOptions, default_jobs, prepare

#: Rough list prices per GiB, for the default cost column only: server DDR5 RDIMMs and
#: data-centre NVMe drives. Give your own with --dram-cost / --ssd-cost.
DEFAULT_DRAM_COST_PER_GIB = 4.0
DEFAULT_SSD_COST_PER_GIB = 0.10
DEFAULT_MARGIN = 0.02
DEFAULT_DRAM_GIB = [float(64 << k) for k in range(7)]            # 64 GiB .. 4 TiB
DEFAULT_SSD_GIB = [0.0] + [float(512 << k) for k in range(7)]    # 0, 512 GiB .. 32 TiB


@dataclass
class PlanOptions:
    dram_gib: list[float] = field(default_factory=lambda: list(DEFAULT_DRAM_GIB))
    ssd_gib: list[float] = field(default_factory=lambda: list(DEFAULT_SSD_GIB))
    dram_cost_per_gib: float = DEFAULT_DRAM_COST_PER_GIB
    ssd_cost_per_gib: float = DEFAULT_SSD_COST_PER_GIB
    write_through: bool = True
    promote: bool = True
    prefill_tokens_per_s: float = tiered.DEFAULT_PREFILL_TOKENS_PER_S
    dram_gbps: float = tiered.DEFAULT_DRAM_GBPS
    ssd_gbps: float = tiered.DEFAULT_SSD_GBPS
    margin: float = DEFAULT_MARGIN
    target_speedup: float | None = None
    budget: float | None = None
    jobs: int = 1


def parse_grid(text: str | None, default: list[float], parse_gib) -> list[float]:
    """``A..B``: A, 2A, 4A, ... up to B (from 0: 0, then B/64 doubling up to B); or a
    comma-separated list of sizes. ``parse_gib`` turns one size into GiB."""
    if text is None:
        return list(default)
    if ".." in text:
        low_text, high_text = text.split("..", 1)
        low, high = parse_gib(low_text), parse_gib(high_text)
        if high <= 0 or low > high:
            raise UsageProblem(f"{text!r}: the range must go up, as in 64GiB..4TiB")
        values = [0.0] if low == 0 else []
        step = low if low > 0 else high / 64
        while step <= high * (1 + 1e-9):
            values.append(step)
            step *= 2
        return values
    values = [parse_gib(part) for part in text.split(",") if part.strip()]
    if not values:
        raise UsageProblem(f"{text!r}: give sizes, e.g. 64GiB..4TiB or 256GiB,1TiB")
    return sorted(set(values))


def _check(options: PlanOptions) -> None:
    if not options.dram_gib or not options.ssd_gib:
        raise UsageProblem("the grid needs at least one DRAM and one SSD size")
    if any(v < 0 for v in options.dram_gib + options.ssd_gib):
        raise UsageProblem("sizes must not be negative")
    if options.dram_cost_per_gib < 0 or options.ssd_cost_per_gib < 0:
        raise UsageProblem("costs must not be negative")
    if not 0 <= options.margin < 1:
        raise UsageProblem(f"--margin must be in [0, 1), got {options.margin}")
    if options.target_speedup is not None and options.budget is not None:
        raise UsageProblem("give --target-speedup or --budget, not both")
    if options.target_speedup is not None and options.target_speedup < 1:
        raise UsageProblem("--target-speedup is a speedup over no cache: at least 1")
    if options.budget is not None and options.budget < 0:
        raise UsageProblem("--budget must not be negative")


def plan(paths: list, sim: SimOptions, options: PlanOptions, *, progress=None,
         trace=None) -> dict:
    """Replay the grid and return the plan document."""
    _check(options)
    if not sim.model and not sim.bytes_per_token:
        raise UsageProblem("the plan sizes tiers in bytes: give --model (see --list-models) "
                           "or --bytes-per-token")
    ready = prepare(paths, sim, progress=progress, trace=trace)
    replay, per_block, per_token = ready.replay, ready.bytes_per_block, ready.bytes_per_token
    cfg = tiered.TierConfig(0, options.write_through, options.promote,
                            options.prefill_tokens_per_s, options.dram_gbps, options.ssd_gbps)
    dram = [(g, planning.cache_blocks(g, per_block)) for g in sorted(set(options.dram_gib))]
    ssd = [(g, planning.cache_blocks(g, per_block)) for g in sorted(set(options.ssd_gib))]
    specs = {}
    for _, d in dram:
        for _, s in ssd:
            if d or s:
                specs[(d, s)] = PolicySpec("tiered", d, s, options.write_through,
                                           options.promote, full_run=True)
    tasks = [(0, spec, False) for spec in dict.fromkeys(specs.values())]
    runs = sweep.execute(replay, tasks, options.jobs or default_jobs(), progress)
    measured = replay.requests - replay.warmup_requests
    total = replay.measured_tokens()
    cells = []
    for dram_gib, d in dram:
        for ssd_gib, s in ssd:
            run = runs.get(specs.get((d, s)))
            hits = run.hit_tokens if run else 0
            ssd_hits = run.ssd_hit_tokens if run else 0
            timing = tiered.ttft(cfg, total_tokens=total, dram_tokens=hits - ssd_hits,
                                 ssd_tokens=ssd_hits, requests=measured,
                                 bytes_per_token=per_token)
            cells.append({
                "dramGib": dram_gib, "ssdGib": ssd_gib, "dramBlocks": d, "ssdBlocks": s,
                "hitTokens": hits, "totalTokens": total,
                "hitRate": hits / total if total else 0.0,
                "dramHitRate": (hits - ssd_hits) / total if total else 0.0,
                "ssdHitRate": ssd_hits / total if total else 0.0,
                "dramShareOfHits": (hits - ssd_hits) / hits if hits else None,
                "idealSpeedup": ideal_speedup(hits / total if total else 0.0),
                "ttftSeconds": timing["meanSeconds"], "ttftSpeedup": timing["speedup"] or 1.0,
                "ttft": timing,
                "cost": dram_gib * options.dram_cost_per_gib
                + ssd_gib * options.ssd_cost_per_gib,
                "filled": bool(run and not run.underfilled),
            })
    header = ready.header("kvstore sim plan")
    ceiling_hits = header["ceiling"]["hitTokens"]
    ceiling_ttft = tiered.ttft(cfg, total_tokens=total, dram_tokens=ceiling_hits,
                               ssd_tokens=0, requests=measured, bytes_per_token=per_token)
    unique = replay.unique_blocks
    result = header | {
        "warmupFraction": sim.warmup,
        "tierMode": cfg.mode, "promotion": cfg.promote,
        "ttftModel": cfg.describe(per_block)["ttftModel"],
        "costs": {"dramPerGib": options.dram_cost_per_gib,
                  "ssdPerGib": options.ssd_cost_per_gib},
        "ceilingTtft": ceiling_ttft,
        "dramGib": [g for g, _ in dram], "ssdGib": [g for g, _ in ssd],
        "cells": cells,
        "fits": any(max(c["dramBlocks"], c["ssdBlocks"]) >= unique for c in cells),
    }
    result["recommended"] = recommend(result, options)
    result["timing"] = {"loadSeconds": ready.loaded - ready.started,
                        "replaySeconds": time.perf_counter() - ready.loaded}
    return result


def _name(cell: dict) -> str:
    ssd = f"{size_label(cell['ssdGib'])} SSD" if cell["ssdGib"] else "no SSD"
    return f"{size_label(cell['dramGib'])} DRAM + {ssd}"


def _money(value: float) -> str:
    return f"${value:,.0f}"


def _neighbour(cells: list[dict], cell: dict, axis: str, grid: list[float]) -> dict | None:
    """The cell one grid step up along ``axis`` ("dramGib" or "ssdGib"), if any."""
    at = grid.index(cell[axis])
    if at + 1 >= len(grid):
        return None
    other = "ssdGib" if axis == "dramGib" else "dramGib"
    return next(c for c in cells if c[axis] == grid[at + 1] and c[other] == cell[other])


def _step(cell: dict, up: dict | None, what: str) -> dict | None:
    if up is None:
        return None
    gain = up["ttftSpeedup"] - cell["ttftSpeedup"]
    extra_cost = up["cost"] - cell["cost"]
    extra_tib = (up["dramGib"] + up["ssdGib"] - cell["dramGib"] - cell["ssdGib"]) / 1024
    return {"to": {"dramGib": up["dramGib"], "ssdGib": up["ssdGib"]}, "what": what,
            "speedupGain": gain, "extraCost": extra_cost,
            "gainPer1000": gain / extra_cost * 1000 if extra_cost > 0 else None,
            "gainPerTib": gain / extra_tib if extra_tib > 0 else None}


def recommend(result: dict, options: PlanOptions) -> dict:
    """The recommended cell and one or two sentences of why."""
    cells = result["cells"]
    best = max(cells, key=lambda c: (c["ttftSpeedup"], -c["cost"]))
    if options.target_speedup is not None:
        meeting = [c for c in cells if c["ttftSpeedup"] >= options.target_speedup]
        if meeting:
            chosen = min(meeting, key=lambda c: (c["cost"], -c["ttftSpeedup"]))
            why = f"the cheapest cell that meets the {options.target_speedup:g}x target"
        else:
            chosen = best
            why = (f"no cell reaches the {options.target_speedup:g}x target; this is the "
                   "fastest on the grid")
    elif options.budget is not None:
        within = [c for c in cells if c["cost"] <= options.budget]
        if within:
            chosen = max(within, key=lambda c: (c["ttftSpeedup"], -c["cost"]))
            why = f"the fastest cell within the {_money(options.budget)} budget"
        else:
            chosen = min(cells, key=lambda c: c["cost"])
            why = f"no cell fits the {_money(options.budget)} budget; this is the cheapest"
    else:
        near = [c for c in cells if c["ttftSpeedup"] >= best["ttftSpeedup"] * (1 - options.margin)]
        chosen = min(near, key=lambda c: (c["cost"], -c["ttftSpeedup"]))
        why = (f"the cheapest cell within {options.margin:.0%} of the best modelled speedup "
               f"({best['ttftSpeedup']:.2f}x, {_name(best)}, {_money(best['cost'])})"
               if chosen is not best else "the best modelled speedup on the grid")
    share = chosen["dramShareOfHits"]
    first = (f"{_name(chosen)} ({_money(chosen['cost'])}): {chosen['ttftSpeedup']:.2f}x "
             f"modelled TTFT speedup, {chosen['hitRate']:.1%} hit rate"
             + (f" with {share:.1%} of the hits from DRAM" if share is not None else "")
             + f"; {why}.")
    steps = [_step(chosen, _neighbour(cells, chosen, "dramGib", result["dramGib"]), "DRAM"),
             _step(chosen, _neighbour(cells, chosen, "ssdGib", result["ssdGib"]), "SSD")]
    steps = [s for s in steps if s is not None]
    second = "; ".join(
        f"the next {s['what']} size adds {s['speedupGain']:+.2f}x for "
        f"{_money(s['extraCost'])} more"
        + (f" ({s['gainPer1000']:+.3f}x per $1,000)" if s["gainPer1000"] is not None else "")
        for s in steps)
    sentences = first + (f" {second[0].upper()}{second[1:]}." if second else "")
    ceiling = result["ceilingTtft"]["speedup"] or 1.0
    edge = chosen["dramGib"] == result["dramGib"][-1] or chosen["ssdGib"] == result["ssdGib"][-1]
    if (edge and not result["fits"] and options.target_speedup is None
            and best["ttftSpeedup"] < ceiling * (1 - options.margin)):
        sentences += (" The grid's largest cells still gain and the trace does not fit in "
                      f"them: extend --dram / --ssd (an infinite DRAM gets {ceiling:.2f}x).")
    return {"dramGib": chosen["dramGib"], "ssdGib": chosen["ssdGib"],
            "ttftSpeedup": chosen["ttftSpeedup"], "cost": chosen["cost"],
            "best": {"dramGib": best["dramGib"], "ssdGib": best["ssdGib"],
                     "ttftSpeedup": best["ttftSpeedup"], "cost": best["cost"]},
            "margin": options.margin, "targetSpeedup": options.target_speedup,
            "budget": options.budget, "marginal": steps, "reason": sentences}
