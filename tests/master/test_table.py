"""The master's object table: write-once commits, leases, locks, removal (cancelled puts
included), node loss, listing and namespaces, with the invariants checked after every
mutation."""

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


def test_a_lock_ends_at_its_holders_read_its_unlock_or_its_expiry():
    t = ObjectTable()
    for key in ("read", "unlocked", "expires"):
        t.commit(key, "n1", DRAM, 10, 1, 0, now=0)
    assert t.lock("nothing", "h1", now=1, ttl=5) is None
    for key in ("read", "unlocked", "expires"):
        assert t.lock(key, "h1", now=1, ttl=5) is not None
        assert t.objects[key].locked(now=5.9)
    t.lookup("read", now=2, lease_ttl=5, holder="h2")  # another holder's read
    assert t.objects["read"].locked(now=2)
    t.lookup("read", now=2, lease_ttl=5, holder="h1")  # the read the lock was for
    assert not t.objects["read"].locked(now=2)
    assert not t.unlock("unlocked", "h2", now=2)  # not h2's lock
    assert t.unlock("unlocked", "h1", now=2)
    assert not t.objects["unlocked"].locked(now=2)
    assert not t.unlock("unlocked", "h1", now=2)  # once
    assert not t.objects["expires"].locked(now=6.1)
    assert t.objects["expires"].locks is None  # forgotten, not kept as garbage
    t.check()


def test_locks_of_two_holders_are_independent_and_a_lock_is_never_shortened():
    t = ObjectTable()
    t.commit("k", "n1", DRAM, 10, 1, 0, now=0)
    t.lock("k", "h1", now=0, ttl=10)
    t.lock("k", "h1", now=1, ttl=2)  # a shorter lock of the same holder keeps the longer
    t.lock("k", "h2", now=1, ttl=2)
    assert t.unlock("k", "h2", now=2)
    assert t.objects["k"].locked(now=9) and not t.objects["k"].locked(now=10.5)


def test_a_put_in_flight_when_its_prefix_is_removed_never_lands():
    t = ObjectTable()
    assert t.reserve("p/old", "n1", 10, now=0, timeout=30)
    assert t.reserve("q/other", "n1", 10, now=0, timeout=30)
    assert t.cancel_pending("p/") == 1
    assert not t.reserve("p/old", "n1", 10, now=1, timeout=30)  # still being put
    assert not t.commit("p/old", "n1", DRAM, 10, 1, 0, now=1)   # its commit is refused
    assert "p/old" not in t.objects
    assert t.reserve("p/old", "n1", 10, now=2, timeout=30)       # a new put may go now
    assert t.commit("p/old", "n1", DRAM, 10, 1, 0, now=2)
    assert t.commit("q/other", "n1", DRAM, 10, 1, 4096, now=2)   # other prefixes: untouched
    t.check()


def test_sequence_numbers_order_objects_by_when_their_put_started():
    t = ObjectTable()
    assert t.reserve("early", "n1", 1, now=0, timeout=30)
    fence = t.next_seq()
    assert t.reserve("late", "n1", 1, now=0, timeout=30)
    t.commit("late", "n1", DRAM, 1, 1, 0, now=1)
    t.commit("early", "n1", DRAM, 1, 1, 4096, now=2)   # committed last, started first
    assert t.objects["early"].seq < fence < t.objects["late"].seq


def test_namespaces_count_objects_and_bytes_per_tier_by_the_longest_prefix():
    t = ObjectTable()
    t.commit("a/x", "n1", DRAM, 10, 1, 0, now=0)
    t.commit("a/b/y", "n1", DRAM, 20, 1, 4096, now=0)
    t.add_replica("a/b/y", "n1", SSD)
    t.commit("c", "n1", SSD, 5, 1, -1, now=0)
    assert t.add_namespace("a/b/") == 1        # counts what is there already
    assert t.add_namespace("a/") == 1          # a/b/y stays in the longer one
    assert t.add_namespace("a/") == 1          # idempotent
    t.commit("a/b/z", "n1", DRAM, 30, 1, 8192, now=1)
    usage = {ns: (u.objects, u.usage()[DRAM].bytes, u.usage()[SSD].bytes)
             for ns, u in t.namespaces.items()}
    assert usage == {"": (1, 0, 5), "a/": (1, 10, 0), "a/b/": (2, 50, 20)}
    t.mark_removing("a/b/z", "n1", DRAM)       # a replica on its way out is not counted
    t.remove("a/x")
    assert t.namespaces["a/b/"].usage()[DRAM].bytes == 20
    assert t.namespaces["a/"].objects == 0
    t.check()


def test_per_node_per_tier_keys_follow_promotion_eviction_removal_and_node_loss():
    t = ObjectTable()
    for i in range(5):
        t.commit(f"s{i}", "n1", SSD, 1, 1, -1, now=0)
    t.commit("d", "n1", DRAM, 1, 1, 0, now=0)
    t.commit("x", "n2", DRAM, 1, 1, 0, now=0)
    assert sorted(t.keys_on("n1", DRAM)) == ["d"]
    t.add_replica("s0", "n1", DRAM, 4096)       # promoted
    t.add_replica("d", "n1", SSD)               # offloaded
    assert sorted(t.keys_on("n1", DRAM)) == ["d", "s0"]
    assert sorted(t.keys_on("n1", SSD)) == ["d", "s0", "s1", "s2", "s3", "s4"]
    assert t.count_on("n1") == 6
    t.mark_removing("s0", "n1", DRAM)           # evicting: still held until freed
    assert sorted(m.key for m in t.on_node("n1", DRAM)) == ["d", "s0"]
    t.drop_replica("s0", "n1", DRAM)            # freed
    assert sorted(t.keys_on("n1", DRAM)) == ["d"]
    t.remove("d")
    assert t.keys_on("n1", DRAM) == []
    assert sorted(t.keys_on("n1")) == ["s0", "s1", "s2", "s3", "s4"]
    t.add_replica("s1", "n2", SSD)
    assert sorted(t.drop_node("n1")) == ["s0", "s2", "s3", "s4"]
    assert t.keys_on("n1") == [] and t.count_on("n1") == 0
    assert sorted(t.keys_on("n2")) == ["s1", "x"]
    t.check()


def test_dropping_a_node_with_few_or_with_most_of_the_objects_keeps_every_index():
    for on_n1 in (3, 90):  # few: removed one by one; most: the sorted keys rebuilt
        t = ObjectTable()
        t.add_namespace("a/")
        for i in range(100):
            node = "n1" if i < on_n1 else "n2"
            t.commit(f"a/{i:03d}" if i % 2 else f"{i:03d}", node, SSD, 10, 1, -1, now=0)
        t.add_replica("a/001", "n1", DRAM, 4096)
        t.add_replica("a/001", "n2", DRAM, 0)       # a copy elsewhere: it stays
        t.mark_removing("002", "n1", SSD)           # not counted, and goes too
        gone = t.drop_node("n1")
        assert sorted(gone) == sorted(k for k in (f"a/{i:03d}" if i % 2 else f"{i:03d}"
                                                  for i in range(on_n1)) if k != "a/001")
        assert "a/001" in t.objects and t.keys_on("n1") == []
        t.check()


class _CountingDict(dict):
    """A dict that counts the lookups made through ``[]``."""

    looked_up = 0

    def __getitem__(self, key):
        self.looked_up += 1
        return super().__getitem__(key)


def test_walking_a_nodes_dram_objects_costs_what_it_returns_not_what_the_node_holds():
    t = ObjectTable()
    for i in range(10_000):
        t.commit(f"s{i}", "n1", SSD, 1, 1, -1, now=0)
    for i in range(3):
        t.commit(f"d{i}", "n1", DRAM, 1, 1, 4096 * i, now=0)
    t.objects = counting = _CountingDict(t.objects)
    assert sorted(m.key for m in t.on_node("n1", DRAM)) == ["d0", "d1", "d2"]
    assert counting.looked_up == 3


def test_a_nodes_dram_keys_come_oldest_first_so_a_flush_writes_a_batch_together():
    t = ObjectTable()
    keys = [f"batch/{i}" for i in range(40)]  # a set's order of these is not theirs
    for n, key in enumerate(keys):
        t.commit(key, "n1", DRAM, 1, 1, 4096 * n, now=0)
    t.commit("elsewhere", "n2", DRAM, 1, 1, 0, now=0)
    assert t.dram_keys_oldest_first("n1") == keys
    t.lookup("batch/3", now=1, lease_ttl=5)  # read: the most recently used now
    t.mark_removing("batch/0", "n1", DRAM)  # on its way out: last
    assert t.dram_keys_oldest_first("n1") == [*keys[1:3], *keys[4:], "batch/3", "batch/0"]
    assert t.dram_keys_oldest_first("n3") == []


class TableMachine(RuleBasedStateMachine):
    """Random operations against a plain model; invariants after every step."""

    def __init__(self):
        super().__init__()
        self.table = ObjectTable()
        self.model: dict[str, set[tuple[str, str]]] = {}
        self.now = 0.0

    keys = st.sampled_from(["k0", "a/k1", "a/b/k2", "a/b/k3", "b/k4", "k5"])
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

    @rule(key=keys, holder=st.sampled_from(["h1", "h2"]))
    def lock(self, key, holder):
        self.now += 1
        found = self.table.lock(key, holder, self.now, 3)
        readable = key in self.model and self.table.objects[key].readable()
        assert (found is not None) == bool(readable)

    @rule(prefix=st.sampled_from(["a/", "a/b/", "b/"]))
    def namespace(self, prefix):
        self.table.add_namespace(prefix)

    @rule(prefix=st.sampled_from(["", "k", "a/", "a/b/k2", "x"]))
    def listing(self, prefix):
        assert self.table.keys_with_prefix(prefix, None, 100) == sorted(
            k for k in self.model if k.startswith(prefix))

    @rule(node=nodes, tier=st.sampled_from([DRAM, SSD, None]))
    def held_by_node(self, node, tier):
        expected = sorted(k for k, places in self.model.items()
                          if any(n == node and tier in (None, t) for n, t in places))
        assert sorted(self.table.keys_on(node, tier)) == expected
        assert sorted(m.key for m in self.table.on_node(node, tier)) == expected
        if tier is None:
            assert self.table.count_on(node) == len(expected)

    @invariant()
    def consistent(self):
        self.table.check()
        assert {k: {(r.node, r.tier) for r in m.replicas}
                for k, m in self.table.objects.items()} == self.model


TestTableMachine = TableMachine.TestCase
TestTableMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
