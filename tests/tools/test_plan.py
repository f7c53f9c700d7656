"""`kvstore sim plan`: the DRAM x SSD grid, its costs and TTFT model, the recommendation,
and its outputs (table, JSON, heatmap, HTML)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from kvstored.cli.tool import main
from kvstored.tools import events, plan, tiered
from kvstored.tools.cli_common import parse_gib
from kvstored.tools.core import Replay
from kvstored.tools.errors import UsageProblem
from kvstored.tools.runs import PolicySpec
from kvstored.tools.simulate import SimOptions

from .conftest import random_requests

# 4-token blocks at 2**30 / 40 bytes per token: 1 GiB holds exactly 10 blocks.
BYTES_PER_TOKEN = (1 << 30) / 40


def _trace(seed=11, requests=200):
    reqs = random_requests(seed, requests=requests)
    counts = np.array([len(r) for r in reqs], dtype=np.int64)
    return events.build(np.array([i for r in reqs for i in r], dtype=np.int64), counts,
                        counts * 4, np.arange(len(reqs), dtype=np.float64) * 30,
                        np.zeros(len(reqs), dtype=np.int64), 4, "mooncake", sources=["gen"])


def run(*args):
    return CliRunner().invoke(main, list(map(str, args)), catch_exceptions=False)


def test_parse_grid():
    assert plan.parse_grid("64GiB..4TiB", [], parse_gib) == [64, 128, 256, 512, 1024, 2048,
                                                             4096]
    assert plan.parse_grid("0..32TiB", [], parse_gib) == [0, 512, 1024, 2048, 4096, 8192,
                                                          16384, 32768]
    assert plan.parse_grid("1TiB,256GiB", [], parse_gib) == [256, 1024]
    assert plan.parse_grid(None, [1.0], parse_gib) == [1.0]
    with pytest.raises(UsageProblem):
        plan.parse_grid("4TiB..1TiB", [], parse_gib)


def test_every_cell_is_the_tiered_replay_of_its_sizes():
    trace = _trace()
    options = plan.PlanOptions(dram_gib=[0, 0.5, 1, 2], ssd_gib=[0, 1, 4],
                               dram_cost_per_gib=5, ssd_cost_per_gib=0.5)
    result = plan.plan([], SimOptions(bytes_per_token=BYTES_PER_TOKEN), options, trace=trace)
    assert len(result["cells"]) == 12
    replay = Replay(trace, 0.5, next_use=False)
    cfg = tiered.TierConfig(0)
    for cell in result["cells"]:
        d, s = int(cell["dramGib"] * 10), int(cell["ssdGib"] * 10)
        assert (cell["dramBlocks"], cell["ssdBlocks"]) == (d, s)
        assert cell["cost"] == pytest.approx(cell["dramGib"] * 5 + cell["ssdGib"] * 0.5)
        if d == s == 0:
            assert cell["hitTokens"] == 0 and cell["ttftSpeedup"] == pytest.approx(1.0)
            continue
        want = replay.run(PolicySpec("tiered", d, s, full_run=True))
        assert (cell["hitTokens"], round(cell["ssdHitRate"] * cell["totalTokens"])) == \
            (want.hit_tokens, want.ssd_hit_tokens), cell
        timing = tiered.ttft(cfg, total_tokens=want.total_tokens,
                             dram_tokens=want.hit_tokens - want.ssd_hit_tokens,
                             ssd_tokens=want.ssd_hit_tokens,
                             requests=replay.requests - replay.warmup_requests,
                             bytes_per_token=BYTES_PER_TOKEN)
        assert cell["ttftSpeedup"] == pytest.approx(timing["speedup"])
    # no DRAM: the SSD alone, as lru at its size
    ssd_only = next(c for c in result["cells"] if c["dramGib"] == 0 and c["ssdGib"] == 1)
    assert ssd_only["hitTokens"] == replay.run(PolicySpec("lru", 10)).hit_tokens
    assert ssd_only["dramShareOfHits"] == 0


def _cells(rows):
    """A plan result from (dram, ssd, speedup, cost) rows, for the recommendation rules."""
    cells = [{"dramGib": d, "ssdGib": s, "ttftSpeedup": x, "cost": c, "hitRate": 0.5,
              "dramShareOfHits": 0.9} for d, s, x, c in rows]
    return {"cells": cells, "dramGib": sorted({c["dramGib"] for c in cells}),
            "ssdGib": sorted({c["ssdGib"] for c in cells}), "fits": False,
            "ceilingTtft": {"speedup": 10.0}}


GRID = _cells([(1, 0, 2.0, 10), (1, 4, 4.9, 12), (2, 0, 4.0, 20), (2, 4, 5.0, 22)])


def test_recommendation_cheapest_near_the_best_or_target_or_budget():
    near = plan.recommend(GRID, plan.PlanOptions(margin=0.05))
    assert (near["dramGib"], near["ssdGib"]) == (1, 4)          # 4.9 within 5% of 5.0
    assert "within 5% of the best" in near["reason"] and "$12" in near["reason"]
    assert [s["what"] for s in near["marginal"]] == ["DRAM"]     # 4 is the largest SSD
    assert near["marginal"][0]["speedupGain"] == pytest.approx(0.1)
    assert near["marginal"][0]["gainPer1000"] == pytest.approx(0.1 / 10 * 1000)
    strict = plan.recommend(GRID, plan.PlanOptions(margin=0.0))
    assert (strict["dramGib"], strict["ssdGib"]) == (2, 4)
    target = plan.recommend(GRID, plan.PlanOptions(target_speedup=3.5))
    assert (target["dramGib"], target["ssdGib"]) == (1, 4)
    unreachable = plan.recommend(GRID, plan.PlanOptions(target_speedup=9))
    assert (unreachable["dramGib"], unreachable["ssdGib"]) == (2, 4)
    assert "no cell reaches" in unreachable["reason"]
    budget = plan.recommend(GRID, plan.PlanOptions(budget=21))
    assert (budget["dramGib"], budget["ssdGib"]) == (1, 4)
    assert "within the $21 budget" in budget["reason"]
    # the reason is one or two sentences (plus the edge warning when it applies)
    assert near["reason"].count(". ") <= 2


def test_extend_the_grid_only_when_the_trace_does_not_fit():
    edge = plan.recommend(GRID, plan.PlanOptions(margin=0.0))
    assert "extend --dram / --ssd" in edge["reason"]
    fitted = dict(GRID, fits=True)
    assert "extend" not in plan.recommend(fitted, plan.PlanOptions(margin=0.0))["reason"]
    # and the same grid at 1000x the sizes (a bigger trace) recommends the same cell
    scaled = _cells([(d * 1000, s * 1000, x, c) for d, s, x, c in
                     ((1, 0, 2.0, 10), (1, 4, 4.9, 12), (2, 0, 4.0, 20), (2, 4, 5.0, 22))])
    big = plan.recommend(scaled, plan.PlanOptions(margin=0.05))
    assert (big["dramGib"], big["ssdGib"]) == (1000, 4000)


def test_cli_table_json_heatmap_and_html(tmp_path):
    png, page = tmp_path / "heat.png", tmp_path / "plan.html"
    args = ["sim", "plan", "builtin:multi-turn-chat", "--model", "glm-5.1", "--dram",
            "16GiB..64GiB", "--ssd", "0,64GiB,256GiB"]
    table = run(*args, "--heatmap", png, "--html", page)
    assert table.exit_code == 0, table.output
    assert "Recommended" in table.output and "DRAM \\ SSD" in table.output
    assert png.read_bytes()[:4] == b"\x89PNG"
    text = page.read_text()
    assert "DRAM x SSD plan" in text and text.count("data:image/png;base64,") == 2
    document = json.loads(run(*args, "--json").stdout)
    assert len(document["cells"]) == 9
    rec = document["recommended"]
    assert {"dramGib", "ssdGib", "ttftSpeedup", "cost", "reason", "marginal"} <= set(rec)
    assert run(*args, "--target-speedup", "2", "--budget", "5").exit_code == 2


def test_cli_defaults_are_the_plan_modules():
    from kvstored.tools import cli_sim

    assert (cli_sim._DRAM_COST, cli_sim._SSD_COST, cli_sim._MARGIN) == (
        plan.DEFAULT_DRAM_COST_PER_GIB, plan.DEFAULT_SSD_COST_PER_GIB, plan.DEFAULT_MARGIN)
