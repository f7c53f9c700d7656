"""Tiering decisions: eviction order, offload before dropping a last copy, leases,
promotion."""

from kvstored.master.nodes import NodeState
from kvstored.master.policy import PolicyConfig, count_ssd_read, plan_node
from kvstored.master.table import DRAM, REMOVING, SSD, ObjectTable
from kvstored.protocol.master_api import Endpoint, NodeContact

MiB = 1 << 20


def _node(used: int, cap: int = 100 * MiB) -> NodeState:
    return NodeState("n1", NodeContact(Endpoint("127.0.0.1", 1), "h", "seg", "00"), cap,
                     10 * cap, dram_used=used)


def _fill(table: ObjectTable, count: int, *, on_ssd: bool) -> None:
    for i in range(count):
        table.commit(f"k{i}", "n1", DRAM, 10 * MiB, 1, i * 10 * MiB, now=i)
        if on_ssd:
            table.add_replica(f"k{i}", "n1", SSD)


def test_no_pressure_no_tasks():
    table = ObjectTable()
    _fill(table, 5, on_ssd=True)
    plan = plan_node(_node(50 * MiB), table, PolicyConfig(), now=100)
    assert plan.drop_now == [] and plan.offload == []


def test_eviction_drops_least_recent_copies_down_to_the_low_watermark():
    table = ObjectTable()
    _fill(table, 10, on_ssd=True)
    table.lookup("k0", now=50, lease_ttl=1)  # k0 becomes most recent
    plan = plan_node(_node(95 * MiB), table, PolicyConfig(), now=100)
    # 95 MiB used, low watermark 80 MiB: two 10 MiB objects, least recent first.
    assert plan.drop_now == ["k1", "k2"]
    assert table.objects["k1"].replica("n1", DRAM).state == REMOVING
    table.check()


def test_leased_objects_are_not_evicted():
    table = ObjectTable()
    _fill(table, 10, on_ssd=True)
    table.lookup("k0", now=99, lease_ttl=5)
    plan = plan_node(_node(95 * MiB), table, PolicyConfig(), now=100)
    assert "k0" not in plan.drop_now


def test_last_copies_are_offloaded_before_they_are_dropped():
    table = ObjectTable()
    _fill(table, 10, on_ssd=False)
    node = _node(95 * MiB)
    plan = plan_node(node, table, PolicyConfig(), now=100)
    assert plan.drop_now == []
    assert plan.offload == ["k0", "k1"]
    assert node.evict_after_offload == {"k0", "k1"}


def test_dram_only_policy_drops_without_offloading():
    table = ObjectTable()
    _fill(table, 10, on_ssd=False)
    plan = plan_node(_node(95 * MiB), table, PolicyConfig(dram_only=True), now=100)
    assert plan.drop_now == ["k0", "k1"] and plan.offload == []


def test_watermark_offload_starts_above_its_threshold():
    table = ObjectTable()
    _fill(table, 8, on_ssd=False)
    cfg = PolicyConfig(offload="watermark")
    assert plan_node(_node(60 * MiB), table, cfg, now=100).offload == []
    assert plan_node(_node(75 * MiB), table, cfg, now=100).offload == []  # below low after
    assert plan_node(_node(85 * MiB), table, cfg, now=100).offload == ["k0"]


def test_promotion_after_enough_reads_in_a_window():
    table = ObjectTable()
    table.commit("s", "n1", SSD, MiB, 1, -1, now=0)
    cfg = PolicyConfig(promote_reads=2, promote_window=10)
    meta = table.objects["s"]
    assert not count_ssd_read(meta, cfg, now=1)
    assert count_ssd_read(meta, cfg, now=2)
    assert not count_ssd_read(meta, cfg, now=20)  # a new window
    node = _node(10 * MiB)
    node.promote_queued.add("s")
    assert plan_node(node, table, cfg, now=21).promote == ["s"]
    assert not node.promote_queued
