"""kvstore sim against the reference's own output, integer for integer.

The files in ../shared/reference hold the reference simulator's results on the two
Mooncake traces with model glm-5.1 and 512-token blocks: hit and total tokens of every
policy at every budget, the ceiling, which budget is replaced by the ceiling (the cache
never filled during the warm-up) and where the curve ends.
"""

from __future__ import annotations

import json

import pytest

from kvstored.tools.simulate import SimOptions, simulate

from .conftest import shared_file

CASES = [("synthetic_glm-5.1.json", "mooncake_synthetic.jsonl"),
         ("conversation_glm-5.1.json", "mooncake_conversation.jsonl")]


@pytest.mark.parametrize("reference_name, trace_name", CASES)
def test_matches_reference_exactly(reference_name, trace_name):
    reference = json.loads(shared_file("reference", reference_name).read_text())
    trace = shared_file("traces", trace_name)
    result = simulate([trace], SimOptions(model="glm-5.1", block_size=512))

    assert result["bytesPerToken"] == reference["bytesPerToken"]
    assert result["bytesPerBlock"] == reference["bytesPerBlock"]
    assert result["blockSize"] == reference["blockSize"]
    assert result["warmupRequests"] == reference["warmupRequests"]
    assert result["trace"]["requests"] == reference["summary"]["requests"]
    assert result["trace"]["uniqueBlocks"] == reference["summary"]["uniqueBlocks"]
    assert result["trace"]["inputTokens"] == reference["summary"]["totalInputTokens"]
    assert result["reuseCeiling"] == reference["reuseCeiling"]

    # The same budgets, in the same order, ending at the same place.
    assert [(p["gib"], p["cacheBlocks"]) for p in result["points"]] == \
        [(p["gib"], p["cacheBlocks"]) for p in reference["points"]]
    for ours, theirs in zip(result["points"], reference["points"], strict=True):
        for policy, expected in theirs["results"].items():
            got = ours["results"][policy]
            assert (got["hitTokens"], got["totalTokens"], got["mode"]) == \
                (expected["hitTokens"], expected["totalTokens"], expected["mode"]), \
                (ours["gib"], policy)
            assert got["hitRate"] == expected["hitRate"]


def test_budget_at_or_above_unique_blocks_is_not_simulated():
    trace = shared_file("traces", "mooncake_synthetic.jsonl")
    # 43,924 unique blocks: capacities at or above it are not simulated, below it are.
    result = simulate([trace], SimOptions(bytes_per_token=1, block_size=512,
                                          blocks=[43923, 43924, 50000]))
    assert [p["cacheBlocks"] for p in result["points"]] == [43923]
    at_unique = simulate([trace], SimOptions(bytes_per_token=1, block_size=512,
                                             blocks=[43924]))
    assert at_unique["points"] == []
