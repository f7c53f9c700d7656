"""The multi-round experiment: its conversations, its default sizes, and its shape on
two real embedded stores (DRAM only collapses once DRAM overflows, DRAM+SSD holds)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from kvstored.config import load_config
from kvstored.replay import multiturn
from kvstored.replay.predict import StorePolicy
from tests.daemon.harness import BIN


def test_conversations_grow_every_round_and_share_their_past():
    spec = multiturn.MultiturnSpec(clients=3, rounds=4, context_tokens=1000, block_tokens=128)
    convo = multiturn.conversations(spec)
    trace = convo.trace
    assert trace.requests == 12 and convo.rounds.tolist() == [1] * 3 + [2] * 3 + [3] * 3 + [4] * 3
    ids = [trace.ids[trace.offsets[r]:trace.offsets[r + 1]].tolist() for r in range(12)]
    for r in range(3, 12):
        before = ids[r - 3]          # the same client, one round earlier
        # every full block of the previous prompt opens this one
        full = trace.input_lengths[r - 3] // 128
        assert ids[r][:full] == before[:full]
        assert len(ids[r]) > len(before)
    assert len({i for r in ids[:3] for i in r}) == sum(len(r) for r in ids[:3]), \
        "clients share nothing"
    assert convo.blocks_after[-1] == len({i for r in ids for i in r})
    assert multiturn.conversations(spec).trace.ids.tolist() == trace.ids.tolist()


def test_default_dram_overflows_in_round_seven_of_ten():
    spec = multiturn.MultiturnSpec.parse("20x10")
    assert (spec.clients, spec.rounds, spec.overflow_round) == (20, 10, 7)
    convo = multiturn.conversations(spec)
    policy = StorePolicy.from_config(load_config(env={}))
    dram, ssd = multiturn.default_sizes(spec, convo, 65536, policy, 34)
    held = int(dram * policy.dram_high_watermark // 65536)
    assert convo.blocks_after[6] < held < convo.blocks_after[7]
    assert ssd > convo.blocks_after[-1] * (65536 + 4096)
    for bad in ("20", "x10", "0x10", "3x0"):
        with pytest.raises(ValueError):
            multiturn.MultiturnSpec.parse(bad)


def test_dram_only_collapses_once_dram_overflows_and_dram_ssd_holds(tmp_path):
    run = subprocess.run(
        [str(BIN / "kvstore"), "replay", "--multiturn", "6x10", "--context", "2048",
         "--block-bytes", "16KiB", "--json", "--plot", str(tmp_path / "m.png")],
        capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL,
        env=os.environ)
    assert run.returncode == 0, run.stderr
    doc = json.loads(run.stdout)
    assert doc["wrong_bytes"] == 0 and doc["overflow_round"] == 7
    rounds = doc["rounds"]
    assert [r["round"] for r in rounds] == list(range(1, 11))
    for r in rounds:
        for run_name in ("dram_only", "dram_ssd"):
            assert {"hit_rate", "ttft_s", "dram_hit_rate", "ssd_hit_rate",
                    "predicted_hit_rate"} <= set(r[run_name])
    before = rounds[5]            # round 6: both runs alike, everything in DRAM
    assert before["dram_only"]["hit_rate"] == pytest.approx(before["dram_ssd"]["hit_rate"])
    assert before["dram_ssd"]["ssd_hit_rate"] == 0
    last = rounds[-1]
    peak = max(r["dram_only"]["hit_rate"] for r in rounds)
    # The store's DRAM is not an exact LRU (docs/replay.md), so DRAM only falls less than
    # the model's collapse to nothing; it falls all the same, and DRAM+SSD does not.
    assert last["dram_only"]["hit_rate"] < peak - 0.05, "DRAM only did not fall"
    assert last["dram_only"]["predicted_hit_rate"] < 0.2
    assert last["dram_ssd"]["hit_rate"] > last["dram_only"]["hit_rate"] + 0.08
    assert last["dram_ssd"]["hit_rate"] >= before["dram_ssd"]["hit_rate"], "DRAM+SSD fell"
    assert last["dram_ssd"]["ssd_hit_rate"] > 0.05
    assert last["dram_only"]["ttft_s"] > last["dram_ssd"]["ttft_s"]
    assert (tmp_path / "m.png").stat().st_size > 10_000
