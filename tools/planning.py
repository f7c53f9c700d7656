"""Capacity arithmetic: budgets to blocks, hit rate to speedup, and the recommended budget."""

from __future__ import annotations

import math

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


def knee(points: list[tuple[float, float]], min_speedup_per_tib: float) -> dict:
    """The recommended budget from ``(gib, speedup)`` points in ascending budget order:
    the smallest budget past which no step adds at least ``min_speedup_per_tib`` of
    speedup per TiB. ``reason`` says how it was chosen."""
    if not points:
        return {"gib": None, "reason": "no budget was simulated"}
    last_steep = None
    for k in range(len(points) - 1):
        (g0, s0), (g1, s1) = points[k], points[k + 1]
        if g1 > g0 and (s1 - s0) / ((g1 - g0) / 1024) >= min_speedup_per_tib:
            last_steep = k + 1
    if last_steep is None:
        gib, speedup = points[0]
        reason = (f"no step adds {min_speedup_per_tib:g}x per TiB or more: the smallest "
                  "budget already gets what the curve offers")
    elif last_steep == len(points) - 1:
        gib, speedup = points[-1]
        reason = (f"still gaining at least {min_speedup_per_tib:g}x per TiB at the largest "
                  "simulated budget: try larger budgets")
    else:
        gib, speedup = points[last_steep]
        reason = f"past this budget every step adds less than {min_speedup_per_tib:g}x per TiB"
    return {"gib": gib, "idealSpeedup": speedup, "minSpeedupPerTib": min_speedup_per_tib,
            "reason": reason}
