"""The issue's acceptance run: the public Mooncake synthetic trace (../shared) against a
live store whose DRAM and SSD both overflow, measured within 2 percentage points of the
prediction, overall and for each tier.

The store runs without promotion (``policy.promote_reads`` out of reach): its promotion
path is one of the two places where it is not the model yet (docs/replay.md, "Where the
store and the model part"); with it, the DRAM share is measured about 3 points under the
prediction, which the run in docs/benchmarks.md records."""

from __future__ import annotations

import pytest

import kvstored
from kvstored.replay.embedded import EmbeddedStore
from kvstored.replay.predict import StorePolicy
from kvstored.replay.session import replay_trace
from kvstored.tools import reader
from tests.shared_data import SHARED, missing_reason

TRACE = SHARED / "traces" / "mooncake_synthetic.jsonl"

pytestmark = pytest.mark.slow


@pytest.mark.skipif(not TRACE.exists(), reason=missing_reason(TRACE))
def test_mooncake_synthetic_measured_within_two_points_of_the_prediction():
    trace = reader.load([TRACE])
    settings = {"policy.promote_reads": "1000000000"}
    block = 4096
    with EmbeddedStore(dram=2000 * block, ssd=82_000_000, settings=settings,
                       label="mooncake") as store, kvstored.connect(store.address) as client:
        doc = replay_trace(client, trace, StorePolicy.from_config(store.config()),
                           block_bytes=block).document
    m, p = doc["measured"], doc["predicted"]
    assert doc["wrong_bytes"] == 0
    assert doc["store"]["capacities"]["dram_blocks"] == 1800
    assert m["dram_hit_rate"] > 0.05 and m["ssd_hit_rate"] > 0.05, "a tier served nothing"
    assert doc["put_refused_blocks"] == 0
    for name in ("hit_rate", "dram_hit_rate", "ssd_hit_rate"):
        assert abs(m[name] - p[name]) < 0.02, (name, m, p)
