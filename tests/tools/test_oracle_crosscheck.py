"""Cross-checks against the reference simulator itself (PyPI kvcache-simulator 0.1.3).

Runs when the package is installed (it is in the dev extras). Inputs the reference files
do not cover: small generated Mooncake traces, string ids, Bailian JSONL, and session
traces (which the reference cannot read: they go through `kvstore trace convert` first,
and kvstore sim reads the sessions directly).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from kvstored.tools import reader, writers
from kvstored.tools.core import Replay
from kvstored.tools.runs import PolicySpec
from kvstored.tools.simulate import SimOptions, simulate

from .conftest import random_requests, write_mooncake

oracle_trace = pytest.importorskip("kvcache_sim.trace")
oracle_plan = pytest.importorskip("kvcache_sim.plan")
oracle_policies = pytest.importorskip("kvcache_sim.policies")
oracle_sim = pytest.importorskip("kvcache_sim.simulator")


def _oracle(path, block_size, warmup=0.5):
    trace = oracle_trace.parse_trace_file(path, block_size=block_size)
    return trace, oracle_plan.build_execution_plan(trace, warmup_fraction=warmup)


def _assert_same(path, fmt, block_size, warmup=0.5):
    _, plan = _oracle(path, block_size, warmup)
    ours = Replay(reader.load([path], fmt, block_size), warmup)
    assert ours.unique_blocks == plan.unique_blocks
    ceiling = oracle_policies.simulate_ceiling(plan)
    mine = ours.ceiling()
    assert (mine.hit_tokens, mine.total_tokens) == (ceiling.hitTokens, ceiling.totalTokens)
    for capacity in sorted({1, 2, 3, 7, 19, 50, 120, plan.unique_blocks - 1}):
        if not 0 < capacity < plan.unique_blocks:
            continue
        for policy in ("fifo", "lru", "optimal"):
            expected = oracle_policies.simulate_policy(plan, policy, capacity)
            got = ours.run(PolicySpec(policy, capacity))
            assert got.underfilled == (expected.measurementMode == "underfilled_at_window")
            if not got.underfilled:
                assert (got.hit_tokens, got.total_tokens) == \
                    (expected.hitTokens, expected.totalTokens), (path.name, policy, capacity)


@pytest.mark.parametrize("seed", range(6))
def test_generated_mooncake(tmp_path, seed):
    path = write_mooncake(tmp_path / "t.jsonl", random_requests(seed, requests=80), block_size=8)
    _assert_same(path, "mooncake", 8, warmup=0.4 if seed % 2 else 0.5)


def test_string_and_integer_ids_by_decimal_text(tmp_path):
    # "5" and 5 are one block for the reference; "05" another; long texts are fine too.
    requests = random_requests(11, requests=50)
    mixed = [[str(i) if (k + j) % 3 == 0 else i for j, i in enumerate(r)]
             for k, r in enumerate(requests)]
    mixed[3] = ["05", "sys-prompt-\u00e9", *mixed[3]]
    mixed[9] = ["05", "sys-prompt-\u00e9", 10**30, *mixed[9]]
    path = write_mooncake(tmp_path / "mixed.jsonl", mixed, block_size=4)
    _assert_same(path, "mooncake", 4)


def test_bailian_format(tmp_path):
    rng = np.random.default_rng(5)
    path = tmp_path / "bailian.jsonl"
    with path.open("w") as out:
        for k, ids in enumerate(random_requests(21, requests=70, vocab=25)):
            out.write(json.dumps({
                "chat_id": k, "parent_chat_id": -1 if k % 4 == 0 else k - 1,
                "timestamp": k * 0.5, "input_length": len(ids) * 16 - int(rng.integers(0, 16)),
                "output_length": 7, "type": "text", "turn": 1 + k % 4, "hash_ids": ids}) + "\n")
    assert reader.detect_format(path) == "bailian"
    _assert_same(path, "bailian", 16)


def _sessions(tmp_path):
    folder = tmp_path / "sessions"
    folder.mkdir()
    rng = np.random.default_rng(9)
    for s in range(4):
        context = list(range(1, int(rng.integers(3, 8))))
        requests, t = [], 0.0
        for _ in range(int(rng.integers(4, 9))):
            context = context + [int(x) for x in rng.integers(50, 90, size=2)]
            t += float(rng.exponential(20))
            request = {"t": round(t, 3), "type": "n", "in": len(context) * 64 - 5, "out": 9,
                       "hash_ids": list(context)}
            if rng.random() < 0.3:
                request["requests"] = [{"t": 1.5, "type": "subagent", "in": 3 * 64,
                                        "out": 2, "hash_ids": [1, 2, 500 + s]}]
            requests.append(request)
        (folder / f"s{s:02d}.json").write_text(json.dumps(
            {"id": f"s{s}", "block_size": 64, "hash_id_scope": "local",
             "requests": requests}))
    return folder


def test_session_traces_through_convert(tmp_path):
    folder = _sessions(tmp_path)
    trace = reader.load([folder])
    assert trace.format == "sessions" and trace.block_size == 64
    converted = tmp_path / "sessions-as-mooncake.jsonl"
    writers.write(trace, "mooncake", converted)
    _assert_same(converted, "mooncake", 64)
    direct = Replay(trace, 0.5)
    via_file = Replay(reader.load([converted]), 0.5)
    for capacity in (2, 5, 11):
        for policy in ("fifo", "lru", "optimal"):
            assert direct.run(PolicySpec(policy, capacity)) == \
                via_file.run(PolicySpec(policy, capacity))


def test_sweep_against_reference_sweep(tmp_path):
    """Budgets, underfilled handling and skipped budgets against the reference's sweep:
    the reference omits an underfilled budget where kvstore sim shows the ceiling, and
    both end the curve there."""
    path = write_mooncake(tmp_path / "t.jsonl", random_requests(4, requests=300, vocab=200,
                                                                max_len=14), block_size=512)
    trace = oracle_trace.parse_trace_file(path, block_size=512)
    budgets = [0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 4.0, 8.0]
    theirs = oracle_sim.run_sweep(trace, model_id="glm-5.1", budgets_gib=budgets,
                                  backend="python")
    ours = simulate([path], SimOptions(model="glm-5.1", block_size=512, budgets_gib=budgets))
    assert ours["reuseCeiling"] == theirs["hitRateCeiling"]
    fixed = [p for p in ours["points"] if p["mode"] == "fixed_window"]
    assert len(fixed) == len(theirs["points"]) >= 2
    for mine, ref in zip(fixed, theirs["points"], strict=True):
        assert mine["cacheBlocks"] == ref["cacheBlocks"]
        for policy in ("fifo", "lru", "optimal"):
            assert mine["results"][policy]["hitTokens"] == ref["results"][policy]["hitTokens"]
            assert mine["results"][policy]["totalTokens"] == ref["results"][policy]["totalTokens"]
