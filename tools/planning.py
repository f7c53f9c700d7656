"""Capacity arithmetic: budgets to blocks, hit rate to speedup, and the recommended budget."""

from __future__ import annotations

import itertools
import math

from kvstored.sdk.units import format_size

GIB = 1 << 30
DEFAULT_BUDGETS_GIB = [float(1 << k) for k in range(15)]  # 1 GiB .. 16 TiB
SPEEDUP_CAP = 1000.0
MISS_FLOOR = 0.001


def cache_blocks(gib: float, bytes_per_block: float) -> int:
    """``floor(GiB * 2**30 / bytesPerBlock)``, in the reference's floating point."""
    if not math.isfinite(bytes_per_block) or bytes_per_block <= 0:
        return 0
    return max(0, math.floor(gib * GIB / bytes_per_block))


def ideal_speedup(hit_rate: float) -> float:
    """Prefill speedup when hit tokens cost nothing: ``min(1000, 1/max(1 - r, 0.001))``."""
    return min(SPEEDUP_CAP, 1.0 / max(1.0 - max(0.0, min(1.0, hit_rate)), MISS_FLOOR))


def recommend_budget(points: list[tuple[float, float]], margin: float, *,
                     ceiling_speedup: float, fits: bool) -> dict:
    """The recommended budget from ``(gib, speedup)`` points in ascending budget order:
    the smallest budget whose speedup is within ``margin`` (a share, e.g. 0.05) of the
    best on the curve. Relative, so it does not move with the trace's size or units.

    ``fits`` says the whole trace fits in the largest budget asked for (a point is the
    ceiling, or a budget was at least the trace's unique blocks): only when it does not,
    and the curve's best is still short of the ceiling, does the reason suggest larger
    budgets."""
    if not points:
        return {"gib": None, "reason": "no budget was simulated"}
    best_gib, best = max(points, key=lambda p: (p[1], -p[0]))
    gib, speedup = next(p for p in points if p[1] >= best * (1 - margin))
    out = {"gib": gib, "idealSpeedup": speedup, "margin": margin, "bestGib": best_gib,
           "bestSpeedup": best}
    if gib == best_gib:
        reason = f"the best speedup on the curve ({best:.2f}x)"
    else:
        reason = (f"the smallest budget within {margin:.0%} of the best speedup on the "
                  f"curve ({best:.2f}x at {size_label(best_gib)})")
    if fits:
        reason += "; the whole trace fits at the largest budgets"
    elif (len(points) > 1 and best_gib == points[-1][0] and points[-2][1] < best
          and best < ceiling_speedup * (1 - margin)):
        reason += (f"; the curve still rises at the largest budget and the trace does not "
                   f"fit: larger budgets may reach up to {ceiling_speedup:.2f}x")
    out["reason"] = reason
    return out


def marginal_gains(points: list[tuple[float, float]]) -> list[float | None]:
    """Speedup added per extra TiB from the previous budget: the marginal gain column."""
    gains: list[float | None] = [None]
    for (g0, s0), (g1, s1) in itertools.pairwise(points):
        gains.append((s1 - s0) / ((g1 - g0) / 1024) if g1 > g0 else None)
    return gains


def size_label(gib: float) -> str:
    """``512 GiB``, ``2 TiB``, ``1.5 GiB``: budgets as people write them."""
    for unit, scale in (("TiB", 1024.0), ("GiB", 1.0)):
        if gib >= scale or unit == "GiB":
            value = gib / scale
            if value == round(value, 3):
                return f"{value:g} {unit}"
            return format_size(gib * GIB)
    raise AssertionError("unreachable")
