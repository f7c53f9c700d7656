"""The experiments' embedded store: a real ``kvstored up`` that starts, serves with the
default security, stops with exit 0 and leaves nothing behind."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

import kvstored
from kvstored.replay.embedded import EmbeddedStore, EmbeddedStoreError, setting_variable


def test_a_store_serves_then_stops_cleanly_and_removes_its_directory():
    before = set(Path(tempfile.gettempdir()).glob("kvstored-unit-*"))
    with EmbeddedStore(dram=8 << 20, ssd=64 << 20, label="unit",
                       settings={"policy.promote_reads": "3"}) as store:
        home = set(Path(tempfile.gettempdir()).glob("kvstored-unit-*")) - before
        assert len(home) == 1
        with kvstored.connect(store.address) as client:
            assert client.put("k", b"v" * 5000)
            assert client.get("k") == b"v" * 5000
            assert client.call("status")["tiers"]["dram"]["capacity_bytes"] > 0
        assert store.config()["policy.promote_reads"] == 3
        assert store.config()["node.dram"] == 8 << 20
    assert not any(path.exists() for path in home)


def test_a_store_that_cannot_start_says_why():
    with pytest.raises(EmbeddedStoreError, match="did not start") as failure, \
            EmbeddedStore(dram=8 << 20, ssd=64 << 20, label="broken",
                          settings={"policy.dram_only": "perhaps"}):
        pass
    assert "dram_only" in str(failure.value)


def test_setting_variables_follow_the_configuration_rule():
    assert setting_variable("policy.dram_only") == "KVSTORED_POLICY_DRAM_ONLY"
    assert setting_variable("master.lease_ttl") == "KVSTORED_MASTER_LEASE_TTL"
