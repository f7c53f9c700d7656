"""Tiering decisions: eviction order, offload before dropping a last copy, leases,
promotion."""

from kvstored.master import nodes as nodes_module
from kvstored.master.nodes import NodeState
from kvstored.master.policy import count_ssd_read, plan_node
from kvstored.master.table import DRAM, REMOVING, SSD, ObjectTable
from kvstored.protocol.master_api import Endpoint, NodeContact, NodeStats, RegisterRequest
from tests.master.harness import policy

MiB = 1 << 20


def _node(used: int, cap: int = 100 * MiB) -> NodeState:
    contact = NodeContact(Endpoint("127.0.0.1", 1), "h", "seg", "00")
    return NodeState("n1", RegisterRequest("n1", contact, cap, 10 * cap),
                     NodeStats(used, 0, 0, 0, 0))


def _fill(table: ObjectTable, count: int, *, on_ssd: bool) -> None:
    for i in range(count):
        table.commit(f"k{i}", "n1", DRAM, 10 * MiB, 1, i * 10 * MiB, now=i)
        if on_ssd:
            table.add_replica(f"k{i}", "n1", SSD)


def test_no_pressure_no_tasks():
    table = ObjectTable()
    _fill(table, 5, on_ssd=True)
    plan = plan_node(_node(50 * MiB), table, policy(), now=100)
    assert plan.evict == [] and plan.offload == []


def test_eviction_drops_least_recent_copies_down_to_the_low_watermark():
    table = ObjectTable()
    _fill(table, 10, on_ssd=True)
    table.lookup("k0", now=50, lease_ttl=1)  # k0 becomes most recent
    plan = plan_node(_node(95 * MiB), table, policy(), now=100)
    # 95 MiB used, low watermark 80 MiB: two 10 MiB objects, least recent first.
    assert plan.evict == ["k1", "k2"]
    assert table.objects["k1"].replica("n1", DRAM).state == REMOVING
    table.check()


def test_eviction_goes_by_recency_even_under_a_read_lease():
    table = ObjectTable()
    _fill(table, 10, on_ssd=True)
    # k0 and k1 are the least recently used, and still leased (until 150) when DRAM
    # passes its high watermark at 100; the objects written or read since are hotter.
    for i, key in enumerate(["k0", "k1", *(f"k{i}" for i in range(2, 10))]):
        table.lookup(key, now=50 + i, lease_ttl=100 if key in ("k0", "k1") else 1)
    plan = plan_node(_node(95 * MiB), table, policy(), now=100)
    assert plan.evict == ["k0", "k1"]
    assert table.objects["k0"].replica("n1", DRAM).state == REMOVING  # no new leases
    table.check()


def test_replicas_on_their_way_out_are_not_evicted_for_twice():
    table = ObjectTable()
    _fill(table, 10, on_ssd=True)
    node = _node(95 * MiB)
    assert plan_node(node, table, policy(), now=100).evict == ["k0", "k1"]
    # Leased: the node still holds them (95 MiB used) until their leases end.
    node.dram_freeing = {("k0", 0): 10 * MiB, ("k1", 10 * MiB): 10 * MiB}
    assert plan_node(node, table, policy(), now=100).evict == []


def test_last_copies_are_offloaded_before_they_are_dropped():
    table = ObjectTable()
    _fill(table, 10, on_ssd=False)
    node = _node(95 * MiB)
    plan = plan_node(node, table, policy(), now=100)
    assert plan.evict == []
    assert plan.offload == ["k0", "k1"]
    assert node.evict_after_offload == {"k0", "k1"}


def test_dram_only_policy_drops_without_offloading():
    table = ObjectTable()
    _fill(table, 10, on_ssd=False)
    plan = plan_node(_node(95 * MiB), table, policy(dram_only=True), now=100)
    assert plan.evict == ["k0", "k1"] and plan.offload == []


def test_watermark_offload_starts_above_its_threshold():
    table = ObjectTable()
    _fill(table, 8, on_ssd=False)
    cfg = policy(offload="watermark")
    assert plan_node(_node(60 * MiB), table, cfg, now=100).offload == []
    assert plan_node(_node(75 * MiB), table, cfg, now=100).offload == []  # below low after
    assert plan_node(_node(85 * MiB), table, cfg, now=100).offload == ["k0"]


def test_promotion_after_enough_reads_in_a_window():
    table = ObjectTable()
    table.commit("s", "n1", SSD, MiB, 1, -1, now=0)
    cfg = policy(promote_reads=2, promote_window=10)
    meta = table.objects["s"]
    assert not count_ssd_read(meta, cfg, now=1)
    assert count_ssd_read(meta, cfg, now=2)
    assert not count_ssd_read(meta, cfg, now=20)  # a new window
    node = _node(10 * MiB)
    node.queue_promotion("s")
    assert plan_node(node, table, cfg, now=21).promote == ["s"]
    assert not node.promote_queued


def _ssd_only(table: ObjectTable, key: str, size: int, read_at: float) -> None:
    table.commit(key, "n1", SSD, size, 1, -1, now=0)
    table.lookup(key, now=read_at, lease_ttl=0)


def test_promotions_wait_in_read_order_and_the_latest_read_goes_first():
    table = ObjectTable()
    for i, key in enumerate(["a", "b", "c"]):
        _ssd_only(table, key, 4 * MiB, read_at=10 + i)
    node = _node(0)
    for key in ["a", "b", "c", "a"]:  # a read again: the most recent now
        node.queue_promotion(key)
    # The budget (high - low watermark, 10 MiB) takes two: the two read last.
    assert plan_node(node, table, policy(), now=20).promote == ["a", "c"]
    assert list(node.promote_queued) == ["b"]


def test_promotion_above_the_high_watermark_makes_room_from_colder_objects():
    table = ObjectTable()
    _fill(table, 9, on_ssd=True)  # written at 0..8: colder than s, read at 50
    _ssd_only(table, "s", 4 * MiB, read_at=50)
    node = _node(92 * MiB)  # room now: 8 MiB, but above the high watermark
    node.queue_promotion("s")
    plan = plan_node(node, table, policy(), now=60)
    assert plan.promote == ["s"]
    # 92 + 4 MiB down to the low watermark (80 MiB): two 10 MiB objects go.
    assert plan.evict == ["k0", "k1"]


def test_promotion_below_the_high_watermark_evicts_colder_objects_for_its_room():
    table = ObjectTable()
    _fill(table, 8, on_ssd=True)
    _ssd_only(table, "s", 10 * MiB, read_at=50)
    node = _node(85 * MiB)  # 5 MiB short of the high watermark for s's 10 MiB
    node.queue_promotion("s")
    plan = plan_node(node, table, policy(), now=60)
    assert plan.evict == ["k0", "k1"]  # 85 + 10 MiB down to 80 MiB
    assert plan.promote == ["s"]       # the physical room (15 MiB) is there now


def test_no_hotter_object_is_evicted_to_promote_a_colder_one():
    table = ObjectTable()
    _ssd_only(table, "s", 10 * MiB, read_at=0.5)
    _fill(table, 8, on_ssd=True)
    for i in range(8):
        table.lookup(f"k{i}", now=10 + i, lease_ttl=0)  # every DRAM object read since
    node = _node(85 * MiB)
    node.queue_promotion("s")
    plan = plan_node(node, table, policy(), now=60)
    assert plan.evict == [] and plan.promote == []
    assert list(node.promote_queued) == ["s"]  # still waiting, not dropped


def test_the_promotion_queue_is_bounded_and_says_how_many_it_let_go(monkeypatch):
    monkeypatch.setattr(nodes_module, "MAX_PROMOTE_QUEUE", 2)
    node = _node(0)
    assert [node.queue_promotion(k) for k in ["a", "b", "a", "c"]] == [0, 0, 0, 1]
    assert list(node.promote_queued) == ["a", "c"]  # b, the least recently read, went
