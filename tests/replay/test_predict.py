"""The prediction's view of the store: capacities in bytes to blocks, as docs/replay.md
says, and the simulator run with the store's policy."""

from __future__ import annotations

import pytest

from kvstored.config import load_config
from kvstored.replay.predict import StorePolicy, capacities, predict
from kvstored.sdk.record import record_size
from kvstored.tools.tiered import replay_tiers

from .conftest import random_trace


def status(dram: int, ssd: int, backend: str = "bucket", nodes: int = 1) -> dict:
    return {"nodes": [{"node": f"n{i}", "alive": True, "backend": backend}
                      for i in range(nodes)],
            "tiers": {"dram": {"capacity_bytes": dram}, "ssd": {"capacity_bytes": ssd}},
            "objects": 0}


def policy(**settings) -> StorePolicy:
    env = {f"KVSTORED_{k.replace('.', '_').upper()}": str(v) for k, v in settings.items()}
    return StorePolicy.from_config(load_config(env=env))


def test_dram_blocks_are_4k_granules_up_to_the_high_watermark():
    caps = capacities(status(100 * 8192, 0), 5000, 30, policy())
    assert caps.dram_object_bytes == 8192          # 5000 bytes take two 4 KiB granules
    assert caps.dram_blocks == 90                   # 0.90 of 100 objects
    caps = capacities(status(100 * 8192, 0), 5000, 30,
                      policy(**{"policy.dram_high_watermark": 0.5,
                                "policy.dram_low_watermark": 0.4}))
    assert caps.dram_blocks == 50


def test_bucket_ssd_blocks_count_record_index_and_watermarks():
    block = 16384
    caps = capacities(status(1 << 20, 1 << 30), block, 33, policy())
    record = record_size(block)
    assert record == 4096 + 16384
    # the record plus its share of a 500-key bucket's index and spare block
    assert record < caps.ssd_object_bytes < record + 200
    assert caps.ssd_fill == pytest.approx(0.90)     # the backend's high watermark
    assert caps.ssd_blocks == int(0.90 * (1 << 30) // caps.ssd_object_bytes)
    half = capacities(status(1 << 20, 1 << 30), block, 33,
                      policy(**{"node.backend_options": "high_watermark=0.5"}))
    assert half.ssd_blocks == int(0.5 * (1 << 30) // caps.ssd_object_bytes)
    assert caps.ssd_fifo and caps.write_through and caps.promote_reads == 2
    lru = capacities(status(1 << 20, 1 << 30), block, 33,
                     policy(**{"node.backend_options": "policy=lru"}))
    assert not lru.ssd_fifo


def test_other_backends_and_policies_say_what_they_assume():
    caps = capacities(status(1 << 20, 1 << 30, backend="offset"), 4096, 20, policy())
    assert caps.ssd_object_bytes == record_size(4096) + 20
    assert any("offset" in note for note in caps.notes)
    only = capacities(status(1 << 20, 1 << 30), 4096, 20, policy(**{"policy.dram_only": 1}))
    assert only.ssd_blocks == 0 and any("dram_only" in n for n in only.notes)
    lazy = capacities(status(1 << 20, 1 << 30), 4096, 20,
                      policy(**{"policy.offload": "watermark"}))
    assert not lazy.write_through


def test_predict_runs_the_tiered_policy_with_the_stores_settings():
    trace = random_trace(4, requests=120)
    caps = capacities(status(6 * 4096, 30 * 8192), 4096, 20,
                      policy(**{"policy.promote_reads": 3}))
    got = predict(trace, caps)
    want = replay_tiers(trace, caps.dram_blocks, caps.ssd_blocks, promote_reads=3,
                        ssd_fifo=True)
    assert got.rates() == want.rates() and got.promote_reads == 3 and got.ssd_fifo
