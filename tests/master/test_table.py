"""The master's object table: write-once commits, leases, removal, node loss, listing,
with the invariants checked after every mutation."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from kvstored.master.table import DRAM, REMOVING, SSD, ObjectTable


def test_commit_is_write_once():
    t = ObjectTable()
    assert t.commit("k", "n1", DRAM, 10, 0xAB, 0, now=0)
    assert not t.commit("k", "n2", DRAM, 10, 0xCD, 4096, now=1)  # a different value loses
    assert [r.node for r in t.objects["k"].replicas] == ["n1"]
    t.check()


def test_reserve_blocks_a_second_put_until_it_expires():
    t = ObjectTable()
    assert t.reserve("k", "n1", 10, now=0, timeout=5)
    assert not t.reserve("k", "n2", 10, now=1, timeout=5)
    assert t.expire_pending(now=6) == ["k"]
    assert t.reserve("k", "n2", 10, now=6, timeout=5)
    t.check()


def test_lookup_grants_a_lease_and_skips_removing_replicas():
    t = ObjectTable()
    t.commit("k", "n1", DRAM, 10, 1, 0, now=0)
    meta = t.lookup("k", now=1, lease_ttl=5)
    assert meta is not None and meta.leased(5.9) and not meta.leased(6.1)
    t.mark_removing("k", "n1", DRAM)
    assert t.lookup("k", now=2, lease_ttl=5) is None  # nothing readable
    assert t.objects["k"].replicas[0].state == REMOVING
    assert t.drop_replica("k", "n1", DRAM)  # the last replica: the object is gone
    assert "k" not in t.objects
    t.check()


def test_drop_node_forgets_its_replicas_and_keeps_other_copies():
    t = ObjectTable()
    t.commit("a", "n1", DRAM, 1, 1, 0, now=0)
    t.commit("b", "n1", DRAM, 1, 1, 4096, now=0)
    t.add_replica("b", "n2", SSD)
    assert t.drop_node("n1") == ["a"]
    assert [(r.node, r.tier) for r in t.objects["b"].replicas] == [("n2", SSD)]
    t.check()


def test_prefix_listing_pages_in_order():
    t = ObjectTable()
    for i in range(25):
        t.commit(f"p/{i:02d}", "n", SSD, 1, 1, -1, now=0)
        t.commit(f"q/{i:02d}", "n", SSD, 1, 1, -1, now=0)
    pages, after = [], None
    while True:
        page = t.keys_with_prefix("p/", after, 10)
        if not page:
            break
        pages.append(page)
        after = page[-1]
    assert [len(p) for p in pages] == [10, 10, 5]
    assert [k for page in pages for k in page] == [f"p/{i:02d}" for i in range(25)]


class TableMachine(RuleBasedStateMachine):
    """Random operations against a plain model; invariants after every step."""

    def __init__(self):
        super().__init__()
        self.table = ObjectTable()
        self.model: dict[str, set[tuple[str, str]]] = {}
        self.now = 0.0

    keys = st.sampled_from([f"k{i}" for i in range(6)])
    nodes = st.sampled_from(["n1", "n2", "n3"])
    tiers = st.sampled_from([DRAM, SSD])

    @rule(key=keys, node=nodes, tier=tiers)
    def commit(self, key, node, tier):
        ok = self.table.commit(key, node, tier, 100, 7, 0, self.now)
        if key not in self.model:
            assert ok
            self.model[key] = {(node, tier)}
        elif (node, tier) not in self.model[key]:
            assert ok
            self.model[key].add((node, tier))

    @rule(key=keys, node=nodes, tier=tiers)
    def copy(self, key, node, tier):
        ok = self.table.add_replica(key, node, tier, 4096)
        assert ok == (key in self.model)
        if ok:
            self.model[key].add((node, tier))

    @rule(key=keys, node=nodes, tier=tiers)
    def start_removing(self, key, node, tier):
        replica = self.table.mark_removing(key, node, tier)
        assert (replica is not None) == ((node, tier) in self.model.get(key, ()))

    @rule(key=keys, node=nodes, tier=tiers)
    def drop(self, key, node, tier):
        self.table.drop_replica(key, node, tier)
        if key in self.model:
            self.model[key].discard((node, tier))
            if not self.model[key]:
                del self.model[key]

    @rule(key=keys)
    def remove(self, key):
        assert (self.table.remove(key) is not None) == (key in self.model)
        self.model.pop(key, None)

    @rule(node=nodes)
    def lose_node(self, node):
        self.table.drop_node(node)
        for key in list(self.model):
            self.model[key] = {p for p in self.model[key] if p[0] != node}
            if not self.model[key]:
                del self.model[key]

    @rule(key=keys)
    def lookup(self, key):
        self.now += 1
        found = self.table.lookup(key, self.now, 5)
        readable = key in self.model and self.table.objects[key].readable()
        assert (found is not None) == bool(readable)

    @rule(prefix=st.sampled_from(["", "k", "k1", "x"]))
    def listing(self, prefix):
        assert self.table.keys_with_prefix(prefix, None, 100) == sorted(
            k for k in self.model if k.startswith(prefix))

    @invariant()
    def consistent(self):
        self.table.check()
        assert {k: {(r.node, r.tier) for r in m.replicas}
                for k, m in self.table.objects.items()} == self.model


TestTableMachine = TableMachine.TestCase
TestTableMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
