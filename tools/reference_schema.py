"""The result of ``kvstore sim`` in the JSON layout of the reference simulator.

``--json-schema reference`` writes what ``kvcache-simulator run --format json`` writes, so
scripts written for it keep working: a ``metadata`` object (model, precisions, block
size, bytes per token and block, trace counts, warm-up, measured tokens, parse errors
and skipped records), ``hitRateCeiling``, ``ceiling``, ``points`` (each ``gib``,
``cacheBlocks`` and per policy ``policy``, ``cacheBlocks``, ``warmupRequests``,
``measurementStartRequest``, ``measurementMode``, ``hitTokens``, ``totalTokens``,
``hitRate``, ``idealPrefillSpeedup``) and ``policies``.

As in the reference, a budget whose cache never filled during the warm-up is left out
with every larger one (kvstored's own layout shows it as the ceiling). Policies the
reference does not have (``s3fifo``, ``tiered``) appear in the same shape, ``tiered``
with its tier fields added. This module only reshapes a finished result.
"""

from __future__ import annotations

from kvstored.tools.sweep import CEILING

# kvstored's precision names -> the reference's ids and labels.
_PRECISION = {"bf16": ("bf16_fp16", "BF16 / FP16"), "fp8": ("fp8_int8", "FP8 / INT8"),
              "fp4": ("fp4_int4", "FP4 / INT4")}
_TIER_FIELDS = ("dramHitTokens", "ssdHitTokens", "dramShareOfHits", "promotions",
                "ssdWrites", "dramEvictions", "twoPointDramShare", "ttft")


def _precision(name: str | None) -> tuple[str | None, str | None]:
    if name is None:
        return None, None
    return _PRECISION.get(name, (name, name))


def _policy_result(policy: str, blocks: int, warmup: int, result: dict) -> dict:
    out = {"policy": policy, "cacheBlocks": blocks, "warmupRequests": warmup,
           "measurementStartRequest": warmup, "measurementMode": "fixed_window",
           "hitTokens": result["hitTokens"], "totalTokens": result["totalTokens"],
           "hitRate": result["hitRate"], "idealPrefillSpeedup": result["idealSpeedup"]}
    out.update({k: result[k] for k in _TIER_FIELDS if k in result})
    return out


def convert(result: dict) -> dict:
    """The reference's layout of a ``simulate`` result."""
    trace = result["trace"]
    model = result.get("model") or {}
    warmup = result["warmupRequests"]
    precision, precision_label = _precision(model.get("precision"))
    indexer, indexer_label = _precision(model.get("indexerPrecision"))
    fraction = result["warmupFraction"]
    requests = trace["requests"]
    points = []
    for point in result["points"]:
        if point["mode"] == CEILING:
            break
        points.append({"gib": point["gib"], "cacheBlocks": point["cacheBlocks"],
                       "results": {p: _policy_result(p, point["cacheBlocks"], warmup, r)
                                   for p, r in point["results"].items()}})
    ceiling = result["ceiling"]
    bad = trace.get("badLines") or {}
    return {
        "metadata": {
            "modelId": model.get("id"),
            "modelLabel": model.get("label"),
            "precision": precision,
            "precisionLabel": precision_label,
            "indexerPrecision": indexer,
            "indexerPrecisionLabel": indexer_label,
            "includeDraftKvCache": bool(model.get("includeDraftKv")),
            "blockSize": result["blockSize"],
            "bytesPerToken": result["bytesPerToken"],
            "bytesPerBlock": result["bytesPerBlock"],
            "estimateTokens": model.get("estimateTokens"),
            "requestCount": requests,
            "eventCount": trace["blockEvents"],
            "rawUniqueBlocks": trace.get("distinctIds"),
            "uniqueBlocks": trace["uniqueBlocks"],
            "backend": f"kvstored-{result['engine']}",
            "warmupFraction": fraction,
            "warmupRequests": warmup,
            "measurementWindow": "last_50_percent_requests" if fraction == 0.5
            else f"last_{max(0.0, 1.0 - fraction):.6f}_fraction_requests",
            "underfilledBudgetPolicy": "omit_budget_and_larger_points",
            "speedupBaseline": "1.0x is the prefill throughput with no cache, every input "
                               "token computed.",
            "totalMeasuredTokens": result["totalMeasuredTokens"],
            "averageInputTokens": trace["blockTokens"] / requests if requests else 0.0,
            "parseErrors": bad.get("skipped", 0),
            "skippedRecords": trace["skippedRecords"],
        },
        "hitRateCeiling": result["reuseCeiling"],
        "ceiling": {"policy": "ceiling", "cacheBlocks": trace["uniqueBlocks"],
                    "warmupRequests": warmup, "measurementStartRequest": warmup,
                    "measurementMode": "fixed_window", "hitTokens": ceiling["hitTokens"],
                    "totalTokens": ceiling["totalTokens"], "hitRate": ceiling["hitRate"]},
        "points": points,
        "policies": list(result["policies"]),
    }
