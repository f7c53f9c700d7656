"""The replay's document: rates, windows, latency, and its JSON schema."""

from __future__ import annotations

import numpy as np
import pytest

from kvstored.replay import report
from kvstored.replay.runner import ReplayOptions, ReplayRun, RequestOutcome
from kvstored.tools.tiered import replay_tiers

from .conftest import trace_of


def test_nice_window_and_latency():
    assert report.nice_window(1022) == 100
    assert report.nice_window(3594) == 500
    assert report.nice_window(0) == 1.0
    assert report.latency([]) == {"count": 0, "p50": None, "p99": None}
    lat = report.latency([0.001] * 99 + [1.0])
    assert lat["count"] == 100 and lat["p50"] == pytest.approx(0.001)
    assert lat["p99"] > 0.001


def test_hit_tokens_split_by_the_lookups_of_each_tier():
    outcomes = [RequestOutcome(0, 0.0, tokens=100, hit_tokens=60, dram_lookups=2,
                               ssd_lookups=1),
                RequestOutcome(1, 1.0, tokens=100, hit_tokens=0)]
    rates = report.tier_rates(outcomes)
    assert rates["hit_rate"] == pytest.approx(0.3)
    assert rates["dram_hit_rate"] == pytest.approx(0.2)
    assert rates["ssd_hit_rate"] == pytest.approx(0.1)
    assert rates["miss_rate"] == pytest.approx(0.7)


def _document(outcomes, trace, **model_args):
    run = ReplayRun(ReplayOptions(4096, "ns"), outcomes, 1.0,
                    lookups_before={"hit_dram": 0}, lookups_after={"hit_dram": 5})
    model = replay_tiers(trace, 2, 10, **model_args)
    return report.document(run, model, trace=trace.summary(), store={"capacities": {}},
                           window_seconds=2.0)


def test_document_schema_and_windows():
    trace = trace_of([[1, 2], [1, 2], [3], [1, 2, 4]], times=[0.0, 1.0, 2.5, 3.0])
    outcomes = [
        RequestOutcome(0, 0.0, tokens=32, announced=0),
        RequestOutcome(1, 1.0, tokens=32, announced=2, hit_blocks=2, hit_tokens=32,
                       dram_lookups=2, get_seconds=0.001),
        RequestOutcome(2, 2.5, tokens=16),
        RequestOutcome(3, 3.0, tokens=48, announced=2, hit_blocks=2, hit_tokens=32,
                       ssd_lookups=2, get_seconds=0.002, put_seconds=0.003),
    ]
    doc = _document(outcomes, trace)
    check_replay_schema(doc)
    assert doc["requests"] == 4 and doc["wrong_bytes"] == 0
    assert doc["measured"]["hit_rate"] == pytest.approx(64 / 128)
    assert doc["predicted"]["hit_rate"] == pytest.approx(64 / 128)
    assert doc["difference_pp"] == pytest.approx(0.0)
    assert doc["lookups"] == {"dram": 2, "ssd": 2, "by_others": 1}
    assert [w["start"] for w in doc["windows"]] == [0.0, 2.0]
    assert [w["requests"] for w in doc["windows"]] == [2, 2]
    assert doc["windows"][1]["measured"]["ssd_hit_rate"] == pytest.approx(32 / 64)


def test_windows_gather_requests_by_arrival_even_out_of_order():
    """Session traces interleave: a window's requests need not be contiguous."""
    trace = trace_of([[1], [1], [2], [2]], times=[0.0, 5.0, 1.0, 5.5])
    outcomes = [RequestOutcome(0, 0.0, tokens=16), RequestOutcome(1, 5.0, tokens=16),
                RequestOutcome(2, 1.0, tokens=16),
                RequestOutcome(3, 5.5, tokens=16, hit_tokens=16, dram_lookups=1)]
    doc = _document(outcomes, trace)
    first, second = doc["windows"]
    assert (first["start"], first["requests"], second["start"]) == (0.0, 2, 4.0)
    # the window of 4-6 s holds requests 1 and 3, the second use of blocks 1 and 2
    assert second["predicted"]["hit_rate"] == pytest.approx(1.0)
    assert second["measured"]["hit_rate"] == pytest.approx(0.5)
    assert first["predicted"]["hit_rate"] == 0.0


def check_replay_schema(doc: dict) -> None:
    """The fields docs/replay.md documents, with their types."""
    rate_keys = {"hit_rate", "dram_hit_rate", "ssd_hit_rate"}
    assert doc["schema"] == report.SCHEMA
    assert isinstance(doc["requests"], int) and doc["requests"] > 0
    for side in ("measured", "predicted"):
        assert rate_keys <= set(doc[side])
        for key in rate_keys:
            assert 0.0 <= doc[side][key] <= 1.0
        assert doc[side]["hit_rate"] == pytest.approx(
            doc[side]["dram_hit_rate"] + doc[side]["ssd_hit_rate"])
    assert isinstance(doc["difference_pp"], float)
    assert set(doc["difference_pp_by_tier"]) == {"dram", "ssd"}
    assert isinstance(doc["wrong_bytes"], int) and isinstance(doc["wrong_examples"], list)
    for name in ("prefix_hits", "get", "put"):
        assert set(doc["latency_seconds"][name]) == {"count", "p50", "p99"}
    assert set(doc["bytes"]) == {"read", "written"}
    for window in doc["windows"]:
        assert {"start", "requests", "measured", "predicted", "difference_pp"} <= set(window)
        assert rate_keys <= set(window["measured"]) and rate_keys <= set(window["predicted"])
    assert np.isfinite(doc["wall_seconds"])
