"""`kvstore bench sim`: its trace builders, and one tiny end-to-end run (no timing
asserted: benchmarks measure, tests check that the measuring works)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from click.testing import CliRunner

from kvstored.bench import sim as bench_sim
from kvstored.tools import reader
from kvstored.tools.core import Replay
from kvstored.tools.runs import PolicySpec
from tests.tools.conftest import random_requests, write_mooncake


def test_replicated_copies_share_nothing(tmp_path):
    source = write_mooncake(tmp_path / "t.jsonl", random_requests(3, requests=30),
                            block_size=512)
    target = tmp_path / "x3.jsonl"
    events = bench_sim.replicate_jsonl(source, 3, target)
    one, three = reader.load([source]), reader.load([target])
    assert events == 3 * one.events == three.events
    assert Replay(three).unique_blocks == 3 * Replay(one).unique_blocks
    assert np.all(np.diff(three.timestamps) >= 0)


def test_synthetic_sessions_shape():
    trace = bench_sim.synthetic_sessions(200_000)
    assert trace.events >= 200_000 and trace.block_size == 64
    assert np.all(np.diff(trace.timestamps) >= 0)
    replay = Replay(trace, 0.5, next_use=False)
    # Agent sessions resend their context: few unique blocks per event.
    assert replay.unique_blocks < 0.1 * trace.events


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("c++") is None, reason="the reference's C++ backend "
                                                        "needs a C++ compiler")
def test_end_to_end_tiny(tmp_path):
    pytest.importorskip("kvcache_sim")
    source = write_mooncake(tmp_path / "t.jsonl",
                            random_requests(8, requests=400, vocab=300, max_len=12),
                            block_size=512)
    out = tmp_path / "sim.json"
    result = CliRunner().invoke(bench_sim.sim, ["--trace", str(source), "--replicate", "2",
                                                "--rounds", "1", "--json-out", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert [t["trace"] for t in report["traces"]] == ["original", "replicated-2x"]
    for trace in report["traces"]:
        assert trace["check"]["identical"] and trace["check"]["pointsCompared"] > 0
        assert trace["tools"]["kvstore"]["peakRssBytes"] > 0


def test_stringified_trace_replays_the_same(tmp_path):
    source = write_mooncake(tmp_path / "t.jsonl", random_requests(4, requests=60),
                            block_size=512)
    target = tmp_path / "s.jsonl"
    bench_sim.stringify_jsonl(source, target)
    first = json.loads(target.read_text().splitlines()[0])
    assert all(isinstance(h, str) and len(h) == 16 for h in first["hash_ids"])
    ints, strings = reader.load([source]), reader.load([target])
    assert len(strings.id_names) > 0
    a, b = Replay(ints), Replay(strings)
    assert np.array_equal(a.node_of_event, b.node_of_event)
    assert a.run(PolicySpec("lru", 7)).hit_tokens == b.run(PolicySpec("lru", 7)).hit_tokens
