"""The master in-process, over loopback sockets (tests/master/harness.py): registration
and its inventory, roles, placement and commits, lookups and leases, eviction plans,
tasks riding heartbeats, nodes that leave or die, flushes and recoveries that wait on
nodes, and housekeeping that survives its own failures."""

from __future__ import annotations

import types

import pytest
import trio
import trio.testing

from kvstored.errors import BadRequestError, NoSpaceError, UnauthorizedError, UnreachableError
from kvstored.master import client_ops, node_ops
from kvstored.master import nodes as nodes_module
from kvstored.master.service import Master
from kvstored.protocol import NodePhase, OffloadFailed, OffloadFailure, Role, Tier, ops
from kvstored.protocol.master_api import (
    CommitRequest,
    Dropped,
    DropTask,
    Empty,
    Endpoint,
    EvictRequest,
    FlushRequest,
    HeartbeatRequest,
    KeysRequest,
    LockRequest,
    LookupRequest,
    NamespaceRequest,
    NodeContact,
    NodeReport,
    NodeRequest,
    Offloaded,
    OffloadTask,
    PutTargetRequest,
    RecoverRequest,
    RecoverTask,
    RecoveryReport,
    RegisterObjectsRequest,
    RegisterRequest,
    Registration,
    RemovePrefixRequest,
    StatRequest,
    UnlockRequest,
)
from tests.master.harness import NODE_TOKEN, Cluster, FakeNode, master_settings, policy, run

MiB = 1 << 20
DRAM, SSD = Tier.DRAM, Tier.SSD


async def _found(cluster: Cluster, *keys: str) -> list[list[tuple[str, Tier]]]:
    """Per key, the replicas a lookup (without a lease) returns."""
    reply = await cluster.client().call(ops.LOOKUP, LookupRequest(list(keys), lease=False))
    out: list[list[tuple[str, Tier]]] = [[] for _ in keys]
    columns = reply.replicas
    for i, node, tier in zip(columns.of, columns.nodes, columns.tiers):
        out[i].append((node, tier))
    return out


async def _filled(cluster: Cluster, *, on_ssd: bool = True) -> FakeNode:
    """A node with 100 MiB of DRAM holding k0..k9 (10 MiB each; all on SSD too, unless
    not ``on_ssd``: then DRAM is their only copy)."""
    node = await cluster.node("n1", dram=100 * MiB)
    for i in range(10):
        await node.commit((f"k{i}", 10 * MiB, i, i * 10 * MiB))
    if on_ssd:
        await node.heartbeat(NodeReport(offloaded=Offloaded(
            [f"k{i}" for i in range(10)], list(range(10)))))
    return node


async def _poll(condition, what: str, timeout: float = 10.0) -> None:
    with trio.fail_after(timeout):
        while not condition():
            await trio.sleep(0.01)


# -- registration and roles ----------------------------------------------------------------

def test_a_node_registers_its_inventory_and_a_conflicting_copy_is_refused():
    async def scenario(cluster: Cluster) -> None:
        await cluster.node("n1", inventory=[("a", 10, 7, DRAM, 0), ("b", 20, 8, SSD, -1)])
        assert await _found(cluster, "a", "b", "c") == [[("n1", DRAM)], [("n1", SSD)], []]
        rpc = cluster.rpc(Role.NODE)
        await rpc.call(ops.REGISTER, cluster_register("n2"))
        conflicts = await rpc.call(ops.REGISTER_OBJECTS, RegisterObjectsRequest(
            "n2", ["a", "b"], [10, 20], [99, 8], [DRAM, SSD], [0, -1]))
        assert (conflicts.keys, conflicts.tiers) == (["a"], [DRAM])  # another version
        await rpc.call(ops.REGISTER_DONE, NodeRequest("n2"))
        assert await _found(cluster, "b") == [[("n1", SSD), ("n2", SSD)]]
        cluster.master.cluster.table.check()

    run(scenario)


def cluster_register(name: str, *, dram: int = MiB, ssd: int = MiB,
                     objects: int = 0) -> ops.RegisterRequest:
    """``name``'s registration; with ``objects``, the count its inventory will send."""
    return RegisterRequest(name, NodeContact(Endpoint("127.0.0.1", 1), "h", "s", "00"),
                           dram_capacity=dram, ssd_capacity=ssd, objects=objects)


def inventory_chunk(n: int, count: int = 10) -> RegisterObjectsRequest:
    """Chunk ``n`` of n1's inventory: ``count`` SSD objects ``k<n>-<i>`` of 10 bytes."""
    keys = [f"k{n}-{i}" for i in range(count)]
    return RegisterObjectsRequest("n1", keys, [10] * count, [0] * count, [SSD] * count,
                                  [-1] * count)


def node_ops_clock(monkeypatch: pytest.MonkeyPatch) -> types.SimpleNamespace:
    """The monotonic clock of the master's node ops, which the test moves (``.now``)."""
    clock = types.SimpleNamespace(now=1000.0)
    monkeypatch.setattr(node_ops, "time", types.SimpleNamespace(monotonic=lambda: clock.now))
    return clock


def test_a_live_node_name_belongs_to_its_connection_until_it_disconnects():
    async def scenario(cluster: Cluster) -> None:
        first = await cluster.node("n1")
        other = cluster.rpc(Role.NODE)
        with pytest.raises(BadRequestError, match="belongs to a live node"):
            await other.call(ops.REGISTER, cluster_register("n1"))
        with pytest.raises(BadRequestError, match="registered over another connection"):
            await other.call(ops.HEARTBEAT, HeartbeatRequest("n1"))
        first.rpc.close()
        await _poll(lambda: cluster.master.cluster.nodes["n1"].session is None,
                    "the master to see the disconnect")
        await other.call(ops.REGISTER, cluster_register("n1"))  # free now

    run(scenario)


def test_node_ops_need_the_node_token_and_a_node_may_call_client_ops():
    async def scenario(cluster: Cluster) -> None:
        node = await cluster.node("n1")
        client = cluster.client()
        with pytest.raises(UnauthorizedError, match="commit is a node operation"):
            await client.call(ops.COMMIT, CommitRequest("n1", ["forged"], [1], [1], [0]))
        with pytest.raises(UnauthorizedError, match="node token"):
            await cluster.rpc(Role.NODE, token="client-token").connect()
        assert (await client.call(ops.EXISTS, KeysRequest(["forged"]))).exists == [False]
        assert (await node.rpc.call(ops.EXISTS, KeysRequest(["x"]))).exists == [False]
        hello = await cluster.rpc(Role.NODE, token=NODE_TOKEN).hello()
        assert hello.role is Role.NODE and hello.heartbeat_interval == 0.2

    run(scenario)


# -- puts ----------------------------------------------------------------------------------------

def test_puts_go_to_the_clients_host_and_become_visible_once_committed():
    async def scenario(cluster: Cluster) -> None:
        await cluster.node("n1", host_id="host-a")
        n2 = await cluster.node("n2", host_id="host-b", dram=32 * MiB)
        client = cluster.client()
        placed = await client.call(ops.PUT_TARGET, PutTargetRequest(["k", "j"], [10, 10],
                                                                    host="host-b"))
        assert placed.targets == ["n2", "n2"]  # n1 has more room, but n2 is local
        assert placed.nodes["n2"].host_id == "host-b"
        again = await client.call(ops.PUT_TARGET, PutTargetRequest(["k"], [10]))
        assert again.targets == [None]  # held for the put in flight
        assert await _found(cluster, "k") == [[]]  # nothing is visible before the commit
        assert await n2.commit(("k", 10, 5, 0)) == [True]
        assert await _found(cluster, "k") == [[("n2", DRAM)]]
        assert await n2.commit(("k", 10, 6, 4096)) == [False]  # written once
        await client.call(ops.PUT_ABORT, KeysRequest(["j"]))
        assert (await client.call(ops.PUT_TARGET, PutTargetRequest(["j"], [10]))).targets \
            != [None]
        cluster.master.cluster.table.check()

    run(scenario)


def test_put_target_refuses_objects_no_node_can_hold_and_reserves_nothing():
    async def scenario(cluster: Cluster) -> None:
        await cluster.node("n1", dram=64 * MiB, max_value_size=8 * MiB)
        await cluster.node("n2", dram=32 * MiB, max_value_size=16 * MiB)
        client = cluster.client()
        with pytest.raises(NoSpaceError, match=r"80\.0 MiB.*whole DRAM tier.*64\.0 MiB"):
            await client.call(ops.PUT_TARGET, PutTargetRequest(["a", "huge"], [1, 80 * MiB]))
        with pytest.raises(NoSpaceError, match=r"40\.0 MiB.*8\.0 MiB.*max_value_size"):
            await client.call(ops.PUT_TARGET, PutTargetRequest(["big"], [40 * MiB]))
        assert cluster.master.cluster.table.pending == {}  # the batch was refused whole
        # 12 MiB fits only n2's backend: it goes there, though n1 has more DRAM free.
        reply = await client.call(ops.PUT_TARGET, PutTargetRequest(["mid"], [12 * MiB]))
        assert reply.targets == ["n2"]

    run(scenario)


def test_a_dram_only_store_takes_what_fits_in_dram_and_tells_its_nodes():
    async def scenario(cluster: Cluster) -> None:
        await cluster.node("n1", dram=64 * MiB, max_value_size=8 * MiB)
        reply = await cluster.client().call(ops.PUT_TARGET, PutTargetRequest(["k"],
                                                                             [40 * MiB]))
        assert reply.targets == ["n1"]
        registered = await cluster.rpc(Role.NODE).call(ops.REGISTER, cluster_register("n2"))
        assert registered.dram_only is True and registered.client_token == "client-token"

    run(scenario, policy={"dram_only": True})


# -- reads and leases ------------------------------------------------------------------------

def test_a_removed_object_is_freed_at_once_unless_a_lease_holds_it():
    async def scenario(cluster: Cluster) -> None:
        node = await cluster.node("n1")
        await node.commit(("leased", 10, 1, 0), ("free", 10, 2, 4096))
        client = cluster.client()
        found = await client.call(ops.LOOKUP, LookupRequest(["leased", "nothing"]))
        assert found.sizes == [10, None] and found.checksums == [1, None]
        assert found.lease_ttl == 5.0 and set(found.nodes) == {"n1"}
        removed = await client.call(ops.REMOVE, KeysRequest(["leased", "free", "nothing"]))
        assert removed.removed == [True, True, False]
        tasks = await node.heartbeat()
        assert tasks == [DropTask(DRAM, ["free"], [4096])]  # the leased one waits
        cluster.housekeeping(after=1)
        assert await node.heartbeat() == []
        cluster.housekeeping(after=6)  # its lease has run out
        assert await node.heartbeat() == [DropTask(DRAM, ["leased"], [0])]

    run(scenario, lease_ttl=5.0, policy={"offload": "watermark"})


def test_stat_shows_every_replica_and_its_state():
    async def scenario(cluster: Cluster) -> None:
        node = await cluster.node("n1")
        await node.commit(("k", 10, 3, 8192))
        await node.heartbeat(NodeReport(offloaded=Offloaded(["k"], [3])))
        stat = (await cluster.client().call(ops.STAT, StatRequest("k"))).object
        assert (stat.size, stat.checksum) == (10, 3)
        assert {(r.node, r.tier, r.offset) for r in stat.replicas} == {
            ("n1", DRAM, 8192), ("n1", SSD, -1)}

    run(scenario)


# -- eviction ------------------------------------------------------------------------------------

def test_dram_pressure_offloads_last_copies_first_and_drops_them_once_on_ssd():
    async def scenario(cluster: Cluster) -> None:
        node = await _filled(cluster, on_ssd=False)
        # 95 MiB used, above the high watermark (90%): down to 80 MiB, least recent
        # first; no object has another copy, so they are offloaded now, dropped later.
        tasks = await node.heartbeat(dram_used=95 * MiB)
        assert tasks == [OffloadTask(["k0", "k1"], urgent=True)]
        tasks = await node.heartbeat(NodeReport(offloaded=Offloaded(["k0"], [0])),
                                     dram_used=95 * MiB)
        assert DropTask(DRAM, ["k0"], [0]) in tasks
        assert await _found(cluster, "k0") == [[("n1", SSD)]]  # the DRAM copy is going
        cluster.master.cluster.table.check()

    run(scenario, policy={"offload": "watermark", "offload_watermark": 0.99})


def _count(cluster: Cluster, name: str, **labels: str) -> float:
    value = cluster.master.metrics.registry.get_sample_value(name, labels)
    assert value is not None, f"{name}{labels} is not exported"
    return value


def test_a_leased_victim_stops_taking_leases_and_is_freed_when_its_lease_ends():
    async def scenario(cluster: Cluster) -> None:
        node = await _filled(cluster)
        # Every object read in order, each read leasing it for 5 s.
        await cluster.client().call(ops.LOOKUP, LookupRequest([f"k{i}" for i in range(10)]))
        # k0 and k1, the least recently read, are the victims, leased or not; their DRAM
        # copies take no new leases and are freed when the leases end.
        assert await node.heartbeat(dram_used=95 * MiB) == []
        assert await _found(cluster, "k0", "k1", "k2") == [
            [("n1", SSD)], [("n1", SSD)], [("n1", DRAM), ("n1", SSD)]]
        assert _count(cluster, "kvstored_evictions_total", tier="dram") == 2
        # The node still holds them (95 MiB used): nothing more is evicted meanwhile.
        assert await node.heartbeat(dram_used=95 * MiB) == []
        cluster.housekeeping(after=6)  # the leases have run out
        tasks = await node.heartbeat(dram_used=95 * MiB)
        assert tasks == [DropTask(DRAM, ["k0", "k1"], [0, 10 * MiB])]
        await node.heartbeat(NodeReport(dropped=Dropped(["k0", "k1"], [DRAM, DRAM],
                                                        [0, 10 * MiB])), dram_used=75 * MiB)
        assert cluster.master.cluster.nodes["n1"].dram_freeing == {}
        assert _count(cluster, "kvstored_evictions_total", tier="dram") == 2
        cluster.master.cluster.table.check()

    run(scenario, lease_ttl=5.0, policy={"offload": "watermark", "offload_watermark": 0.99})


def test_a_dram_eviction_that_waited_for_its_offload_is_counted_when_it_lands():
    async def scenario(cluster: Cluster) -> None:
        node = await _filled(cluster, on_ssd=False)
        assert await node.heartbeat(dram_used=95 * MiB) == [
            OffloadTask(["k0", "k1"], urgent=True)]
        assert _count(cluster, "kvstored_evictions_total", tier="dram") == 0
        await node.heartbeat(NodeReport(offloaded=Offloaded(["k0", "k1"], [0, 1])),
                             dram_used=95 * MiB)
        assert _count(cluster, "kvstored_evictions_total", tier="dram") == 2

    run(scenario, lease_ttl=0.0,
        policy={"offload": "watermark", "offload_watermark": 0.99})


def test_promotions_a_node_had_no_room_for_are_counted():
    async def scenario(cluster: Cluster) -> None:
        node = await cluster.node("n1")
        assert _count(cluster, "kvstored_promotions_skipped_total", reason="no_room") == 0
        await node.heartbeat(NodeReport(promote_failed=["a", "b"]))
        assert _count(cluster, "kvstored_promotions_skipped_total", reason="no_room") == 2

    run(scenario)


def test_promotions_the_queue_cannot_hold_are_counted(monkeypatch):
    monkeypatch.setattr(nodes_module, "MAX_PROMOTE_QUEUE", 2)

    async def scenario(cluster: Cluster) -> None:
        keys = ["a", "b", "c"]
        await cluster.node("n1", inventory=[(k, 10, i, SSD, -1) for i, k in enumerate(keys)])
        client = cluster.client()
        for key in keys:  # promote_reads 1: every SSD read asks for a promotion
            await client.call(ops.LOOKUP, LookupRequest([key]))
        assert list(cluster.master.cluster.nodes["n1"].promote_queued) == ["b", "c"]
        assert _count(cluster, "kvstored_promotions_skipped_total",
                      reason="queue_full") == 1

    run(scenario, policy={"promote_reads": 1})


def test_evict_by_key_drops_a_copy_that_has_another_and_offloads_a_last_copy_once():
    async def scenario(cluster: Cluster) -> None:
        node = await cluster.node("n1")
        await node.commit(("both", 10, 1, 0), ("only", 10, 2, 4096))
        await node.heartbeat(NodeReport(offloaded=Offloaded(["both"], [1])))
        client = cluster.client()
        dry = await client.call(ops.EVICT, EvictRequest(DRAM, dry_run=True,
                                                        keys=["both", "only"]))
        assert (dry.evicted, dry.offloading, dry.dry_run) == (["both"], ["only"], True)
        assert await node.heartbeat() == []  # a dry run changes nothing
        # A key named twice is evicted, counted and offloaded once.
        done = await client.call(ops.EVICT, EvictRequest(DRAM, keys=["both", "only", "both",
                                                                     "only"]))
        assert (done.evicted, done.offloading, done.bytes) == (["both"], ["only"], 20)
        tasks = await node.heartbeat()
        assert DropTask(DRAM, ["both"], [0]) in tasks
        assert OffloadTask(["only"], urgent=True) in tasks
        dropped = await client.call(ops.EVICT, EvictRequest(SSD, keys=["both", "both"],
                                                            drop=True))
        assert (dropped.evicted, dropped.bytes) == (["both"], 10)

    run(scenario, policy={"offload": "watermark"}, lease_ttl=0.0)


# -- tasks -------------------------------------------------------------------------------------

def test_tasks_ride_the_next_heartbeat_once_merged_by_kind():
    async def scenario(cluster: Cluster) -> None:
        node = await cluster.node("n1")
        assert await node.commit(("a", 1, 1, 0), ("b", 1, 2, 4096)) == [True, True]
        # Eager offload: both commits in one offload task, not yet sent.
        assert cluster.master.cluster.nodes["n1"].tasks == [OffloadTask(["a", "b"])]
        client = cluster.client()
        await client.call(ops.REMOVE, KeysRequest(["a"]))
        await client.call(ops.REMOVE, KeysRequest(["b"]))
        tasks = await node.heartbeat()
        assert tasks == [OffloadTask(["a", "b"]), DropTask(DRAM, ["a", "b"], [0, 4096])]
        assert await node.heartbeat() == []  # delivered once

    run(scenario, lease_ttl=0.0)


def test_a_recovery_waits_for_its_nodes_and_one_that_leaves_is_reported_missing():
    async def scenario(cluster: Cluster) -> None:
        n1, n2 = await cluster.node("n1"), await cluster.node("n2")
        results: dict = {}

        async def recover() -> None:
            results["recover"] = await cluster.client().call(
                ops.RECOVER, RecoverRequest(repair=True, timeout=3600))

        cluster.nursery.start_soon(recover)
        await _poll(lambda: cluster.master.cluster.recoveries, "the recovery to start")
        (task,) = await n2.heartbeat()
        assert isinstance(task, RecoverTask) and task.repair
        await n2.heartbeat(NodeReport(recovered=[RecoveryReport(task.id, True, 3, [])]))
        assert await n1.unregister() == 0
        await _poll(lambda: "recover" in results, "the recovery to answer")
        assert results["recover"].missing == ["n1"]
        assert results["recover"].reports["n2"].records_checked == 3

    run(scenario)


def test_a_flush_names_a_nodes_objects_in_the_order_they_were_put():
    """So that objects put together are written together (adjacent on SSD, where a
    batched get of them reads adjacent records)."""
    async def scenario(cluster: Cluster) -> None:
        node = await cluster.node("n1")
        keys = [f"batch/{i}" for i in range(24)]
        for start in (0, 12):
            await node.commit(*[(k, 10, 1, 4096 * (start + n))
                                for n, k in enumerate(keys[start:start + 12])])
        await cluster.client().call(ops.FLUSH, FlushRequest(wait=False))
        (task,) = await node.heartbeat()
        assert isinstance(task, OffloadTask) and task.keys == keys

    run(scenario, policy={"offload": "watermark"})


def test_retried_offload_failures_stay_queued_and_flush_reports_only_what_still_fails():
    async def scenario(cluster: Cluster) -> None:
        node = await cluster.node("n1")
        await node.commit(("a", 10, 1, 0), ("b", 10, 2, 4096), ("c", 10, 3, 8192))
        state = cluster.master.cluster.nodes["n1"]
        results: list = []

        async def flush() -> None:
            results.append(await cluster.client().call(ops.FLUSH, FlushRequest(
                wait=True, timeout=60)))

        cluster.nursery.start_soon(flush)
        await _poll(lambda: cluster.master.cluster.flushes, "the flush to wait")
        assert [type(t) for t in state.tasks] == [OffloadTask]
        await node.heartbeat(NodeReport(offloaded=Offloaded(["a"], [1]), offload_failed=[
            OffloadFailed("b", OffloadFailure.NO_SPACE, "disk full"),
            OffloadFailed("c", OffloadFailure.TOO_LARGE, "too large")]))
        await _poll(lambda: results, "the flush to answer")
        assert [(f.key, f.reason) for f in results[0].failed] == [("b", "disk full"),
                                                                 ("c", "too large")]
        assert state.offload_queued == {"b"}  # the node retries b itself; c is final
        # A second flush names b again (the node then retries at once); it lands.
        cluster.nursery.start_soon(flush)
        await _poll(lambda: cluster.master.cluster.flushes, "the second flush")
        (task,) = await node.heartbeat()
        assert isinstance(task, OffloadTask) and "b" in task.keys
        await node.heartbeat(NodeReport(offloaded=Offloaded(["b"], [2])))
        await node.heartbeat(NodeReport(offload_failed=[
            OffloadFailed("c", OffloadFailure.TOO_LARGE, "too large")]))
        await _poll(lambda: len(results) == 2, "the second flush to answer")
        assert [(f.key, f.reason) for f in results[1].failed] == [("c", "too large")]
        assert state.offload_queued == set()
        cluster.master.cluster.table.check()

    run(scenario, policy={"offload": "watermark"})


# -- nodes that go ---------------------------------------------------------------------------

def test_a_leaving_node_takes_no_puts_and_an_unregistered_one_is_gone_at_once():
    async def scenario(cluster: Cluster) -> None:
        n1 = await cluster.node("n1")
        await cluster.node("n2")
        await n1.commit(("k", 10, 7, 0))
        await n1.leaving()
        client = cluster.client()
        for i in range(5):
            reply = await client.call(ops.PUT_TARGET, PutTargetRequest([f"x{i}"], [1]))
            assert reply.targets == ["n2"]
        assert await _found(cluster, "k") == [[("n1", DRAM)]]  # still served meanwhile
        assert await n1.unregister() == 1
        assert "n1" not in cluster.master.cluster.nodes
        assert await _found(cluster, "k") == [[]]
        cluster.master.cluster.table.check()

    run(scenario)


def test_a_silent_node_is_declared_dead_and_must_register_again():
    async def scenario(cluster: Cluster) -> None:
        node = await cluster.node("n1")
        await node.commit(("k", 10, 7, 0))
        cluster.housekeeping(after=11)  # past master.node_ttl
        assert not cluster.master.cluster.nodes["n1"].alive
        assert await _found(cluster, "k") == [[]]
        with pytest.raises(BadRequestError, match="declared dead; re-register"):
            await node.heartbeat()
        assert (await cluster.client().call(ops.STATUS, Empty())).nodes[0].alive is False

    run(scenario, node_ttl=10.0)


def test_a_node_declared_dead_while_it_registers_must_register_again(monkeypatch):
    """Its inventory went with it: the rest of it, and its register_done, are refused
    (not taken, leaving it alive with part of what it holds)."""
    clock = node_ops_clock(monkeypatch)

    async def scenario(cluster: Cluster) -> None:
        rpc = cluster.rpc(Role.NODE)
        await rpc.call(ops.REGISTER, cluster_register("n1", dram=64 * MiB, ssd=1 << 30,
                                                      objects=20))

        await rpc.call(ops.REGISTER_OBJECTS, inventory_chunk(0))
        clock.now += 11.0  # the next chunk comes too late: the master gave up on it
        cluster.master.cluster.housekeeping(clock.now)
        assert not cluster.master.cluster.table.objects
        for request in ((ops.REGISTER_OBJECTS, inventory_chunk(1)),
                        (ops.REGISTER_DONE, NodeRequest("n1"))):
            with pytest.raises(BadRequestError, match="declared dead while it registered"):
                await rpc.call(*request)
        assert not cluster.master.cluster.nodes["n1"].alive
        assert not cluster.master.cluster.table.objects
        # a fresh registration is taken
        await rpc.call(ops.REGISTER, cluster_register("n1", dram=64 * MiB, ssd=1 << 30,
                                                      objects=20))
        for n in range(2):
            await rpc.call(ops.REGISTER_OBJECTS, inventory_chunk(n))
        await rpc.call(ops.REGISTER_DONE, NodeRequest("n1"))
        assert cluster.master.cluster.nodes["n1"].alive
        assert len(cluster.master.cluster.table.objects) == 20
        cluster.master.cluster.table.check()

    run(scenario, node_ttl=10.0)


def test_a_registering_node_is_starting_takes_no_puts_and_is_not_declared_dead(monkeypatch):
    """A node sending a large inventory is *starting* (status says how far it got), a
    put names it instead of saying no node is registered, and sending its objects counts
    as a sign of life: a registration longer than node_ttl must not drop what it sent."""
    clock = node_ops_clock(monkeypatch)

    async def scenario(cluster: Cluster) -> None:
        rpc = cluster.rpc(Role.NODE)
        await rpc.call(ops.REGISTER, cluster_register("n1", dram=64 * MiB, ssd=1 << 30,
                                                      objects=30))
        client = cluster.client()
        for chunk in range(3):  # a chunk every 6 s: 18 s in all, and no heartbeat
            clock.now += 6.0
            cluster.master.cluster.housekeeping(clock.now)
            count = 10 if chunk < 2 else 5
            await rpc.call(ops.REGISTER_OBJECTS, inventory_chunk(chunk, count))
            (node,) = (await client.call(ops.STATUS, Empty())).nodes
            assert node.state is NodePhase.STARTING and node.alive, node
        assert node.registering == Registration(sent=25, objects=30)
        with pytest.raises(UnreachableError, match=r"node n1 is starting \(registering its "
                                                   r"objects with the master: 25 of 30\)"):
            await client.call(ops.PUT_TARGET, PutTargetRequest(["x"], [1]))
        await rpc.call(ops.REGISTER_DONE, NodeRequest("n1"))
        (node,) = (await client.call(ops.STATUS, Empty())).nodes
        assert node.state is NodePhase.READY and node.registering is None
        assert len(cluster.master.cluster.table.objects) == 25

    run(scenario, node_ttl=10.0)


# -- housekeeping -------------------------------------------------------------------------------

def test_housekeeping_survives_a_failing_pass(monkeypatch):
    async def main() -> None:
        master = Master(policy=policy(), settings=master_settings(node_ttl=10.0))
        cluster = master.cluster
        real = cluster.table.expire_pending
        calls = []

        def flaky(now: float):
            calls.append(now)
            if len(calls) <= 2:
                raise RuntimeError("injected")
            return real(now)

        monkeypatch.setattr(cluster.table, "expire_pending", flaky)
        with trio.move_on_after(30):
            await master.run_housekeeping()
        assert len(calls) > 10
        assert master.metrics.background_errors.labels(task="housekeeping")._value.get() == 2

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


# -- lookup-and-lock -------------------------------------------------------------------------

def test_eviction_passes_over_a_locked_object_and_takes_it_once_unlocked():
    async def scenario(cluster: Cluster) -> None:
        node = await _filled(cluster)
        client = cluster.client()
        lock = await client.call(ops.LOCK, LockRequest(["k0", "none"], "h1", ttl=30.0))
        assert lock.locked == [True, False] and lock.ttl == 30.0
        # A lock counts as a use; reading the others makes k0 the coldest again.
        await client.call(ops.LOOKUP, LookupRequest([f"k{i}" for i in range(1, 10)]))
        table = cluster.master.cluster.table
        assert next(iter(table.dram_lru["n1"])) == "k0"
        # Over the high watermark: the coldest unlocked ones go; k0 stays in DRAM.
        await node.heartbeat(dram_used=95 * MiB)
        assert await _found(cluster, "k0", "k1", "k2") == [
            [("n1", DRAM), ("n1", SSD)], [("n1", SSD)], [("n1", SSD)]]
        assert (await client.call(ops.UNLOCK, UnlockRequest(["k0", "k3"], "h1"))
                ).unlocked == [True, False]
        # 20 MiB of k1 and k2 are on their way out: 115 MiB is 95 MiB once they go.
        await node.heartbeat(dram_used=115 * MiB)
        assert await _found(cluster, "k0") == [[("n1", SSD)]]
        assert _count(cluster, "kvstored_locks_total", result="locked") == 1
        assert _count(cluster, "kvstored_locks_total", result="miss") == 1
        table.check()

    run(scenario, policy={"offload": "watermark", "offload_watermark": 0.99})


def test_an_expired_lock_no_longer_holds_its_object():
    async def scenario(cluster: Cluster) -> None:
        node = await _filled(cluster)
        client = cluster.client()
        await client.call(ops.LOCK, LockRequest(["k0"], "h1", ttl=0.2))
        # Each heartbeat is over the high watermark by what is not on its way out yet;
        # until the lock expires the plans pass over k0, after it k0 goes too.
        state = cluster.master.cluster.nodes["n1"]
        with trio.fail_after(10):
            while (await _found(cluster, "k0")) != [[("n1", SSD)]]:
                await node.heartbeat(dram_used=95 * MiB + state.dram_given_up())
                await trio.sleep(0.02)
        assert cluster.master.cluster.table.objects["k0"].locks is None

    run(scenario, policy={"offload": "watermark", "offload_watermark": 0.99})


def test_the_holders_read_ends_its_lock_and_a_lock_is_cut_to_max_lock_ttl():
    async def scenario(cluster: Cluster) -> None:
        node = await cluster.node("n1")
        await node.commit(("a", 10, 1, 0), ("b", 10, 2, 4096), ("c", 10, 3, 8192))
        client = cluster.client()
        lock = await client.call(ops.LOCK, LockRequest(["a", "none", "c"], "h1", ttl=600.0,
                                                       leading=True))
        assert lock.locked == [True, False, False] and lock.ttl == 2.0  # c: after a miss
        objects = cluster.master.cluster.table.objects
        assert objects["a"].locks is not None
        assert objects["c"].locks is None
        await client.call(ops.LOOKUP, LookupRequest(["a"], holder="h2"))  # not the holder
        assert objects["a"].locks is not None
        await client.call(ops.LOOKUP, LookupRequest(["a"], lease=False, holder="h1"))
        assert objects["a"].locks is not None  # a lookup without a lease reads nothing
        await client.call(ops.LOOKUP, LookupRequest(["a"], holder="h1"))
        assert objects["a"].locks is None
        with pytest.raises(BadRequestError, match="holder"):
            await client.call(ops.LOCK, LockRequest(["a"], "", ttl=1.0))

    run(scenario, max_lock_ttl=2.0)


# -- removal of a prefix, and namespaces --------------------------------------------------

def test_removing_a_prefix_cancels_puts_in_flight_and_keeps_those_that_start_later():
    async def scenario(cluster: Cluster) -> None:
        node = await cluster.node("n1")
        client = cluster.client()
        await node.commit(("p/done", 10, 1, 0), ("q/other", 10, 2, 4096))
        # A put of p/inflight has its target (so it started) but is not committed yet.
        reply = await client.call(ops.PUT_TARGET, PutTargetRequest(["p/inflight"], [10]))
        assert reply.targets == ["n1"]
        dry = await client.call(ops.REMOVE_PREFIX, RemovePrefixRequest("p/", dry_run=True))
        assert (dry.removed, dry.bytes, dry.cancelled, dry.dry_run) == (1, 10, 0, True)
        gone = await client.call(ops.REMOVE_PREFIX, RemovePrefixRequest("p/"))
        assert (gone.removed, gone.bytes, gone.cancelled) == (1, 10, 1)
        # The put that started before the removal commits after it: refused, so it does
        # not resurrect under the removed prefix.
        assert await node.commit(("p/inflight", 10, 3, 8192)) == [False]
        # One that starts after the removal lands.
        assert (await client.call(ops.PUT_TARGET, PutTargetRequest(["p/inflight"], [10]))
                ).targets == ["n1"]
        assert await node.commit(("p/inflight", 10, 3, 8192)) == [True]
        assert await _found(cluster, "p/done", "p/inflight", "q/other") == [
            [], [("n1", DRAM)], [("n1", DRAM)]]
        assert await node.heartbeat() == [DropTask(DRAM, ["p/done"], [0])]
        assert _count(cluster, "kvstored_prefix_removed_objects_total") == 1
        with pytest.raises(BadRequestError, match="prefix"):
            await client.call(ops.REMOVE_PREFIX, RemovePrefixRequest(""))
        cluster.master.cluster.table.check()

    run(scenario, policy={"offload": "watermark"})


def test_a_removal_in_chunks_leaves_what_was_put_while_it_ran(monkeypatch):
    monkeypatch.setattr(client_ops, "REMOVE_PREFIX_CHUNK", 4)
    paused, resume = trio.Event(), trio.Event()

    async def between_chunks() -> None:
        paused.set()
        await resume.wait()

    monkeypatch.setattr(client_ops, "between_chunks", between_chunks)

    async def scenario(cluster: Cluster) -> None:
        node = await cluster.node("n1")
        client = cluster.client()
        await node.commit(*[(f"p/{i:02d}", 1, 1, i * 4096) for i in range(20)])
        await client.call(ops.PUT_TARGET, PutTargetRequest(["p/00x"], [1]))
        removed: list[int] = []

        async def remove() -> None:
            removed.append((await cluster.client().call(
                ops.REMOVE_PREFIX, RemovePrefixRequest("p/"))).removed)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(remove)
            await paused.wait()  # the first chunk is gone; the removal waits here
            table = cluster.master.cluster.table
            assert len(table.keys_with_prefix("p/", None, 100)) == 16
            # Committed now, but started before the removal: refused.
            assert await node.commit(("p/00x", 1, 1, 50 * 4096)) == [False]
            # Started and committed while the removal runs: kept, though the removal
            # has yet to visit where it sorts.
            await client.call(ops.PUT_TARGET, PutTargetRequest(["p/99"], [1]))
            assert await node.commit(("p/99", 1, 1, 99 * 4096)) == [True]
            resume.set()
        assert removed == [20]
        assert cluster.master.cluster.table.keys_with_prefix("p/", None, 100) == ["p/99"]
        cluster.master.cluster.table.check()

    run(scenario)


def test_namespaces_show_their_usage_in_status_and_metrics():
    async def scenario(cluster: Cluster) -> None:
        node = await cluster.node("n1")
        client = cluster.client()
        await node.commit(("eng/a/1", 10, 1, 0), ("eng/b/1", 20, 2, 4096), ("loose", 5, 3,
                                                                             8192))
        assert (await client.call(ops.ADD_NAMESPACE, NamespaceRequest("eng/a/"))).objects == 1
        assert (await client.call(ops.ADD_NAMESPACE, NamespaceRequest("eng/b/"))).objects == 1
        await node.commit(("eng/a/2", 30, 4, 12288))
        await node.heartbeat(NodeReport(offloaded=Offloaded(["eng/a/2"], [4])))
        with pytest.raises(BadRequestError, match="ending in '/'"):
            await client.call(ops.ADD_NAMESPACE, NamespaceRequest("eng/c"))
        status = await client.call(ops.STATUS, Empty())
        view = {ns: (s.objects, s.tiers["dram"].bytes, s.tiers["ssd"].bytes)
                for ns, s in status.namespaces.items()}
        assert view == {"": (1, 5, 0), "eng/a/": (2, 40, 30), "eng/b/": (1, 20, 0)}
        cluster.housekeeping()
        assert _count(cluster, "kvstored_namespace_objects", namespace="eng/a/") == 2
        assert _count(cluster, "kvstored_namespace_tier_bytes", namespace="eng/a/",
                      tier="ssd") == 30
        assert _count(cluster, "kvstored_namespace_tier_objects", namespace="eng/b/",
                      tier="dram") == 1
        await client.call(ops.REMOVE_PREFIX, RemovePrefixRequest("eng/a/"))
        cluster.housekeeping()
        assert _count(cluster, "kvstored_namespace_objects", namespace="eng/a/") == 0

    run(scenario)


def test_a_last_copy_locked_while_its_eviction_waits_for_its_offload_stays_in_dram():
    async def scenario(cluster: Cluster) -> None:
        node = await _filled(cluster, on_ssd=False)
        # DRAM-only objects: the coldest two go to SSD first, to leave DRAM once there.
        assert await node.heartbeat(dram_used=95 * MiB) == [
            OffloadTask(["k0", "k1"], urgent=True)]
        client = cluster.client()
        assert (await client.call(ops.LOCK, LockRequest(["k0"], "h1", ttl=30.0))).locked \
            == [True]
        tasks = await node.heartbeat(NodeReport(offloaded=Offloaded(["k0", "k1"], [0, 1])),
                                     dram_used=95 * MiB)
        assert DropTask(DRAM, ["k1"], [10 * MiB]) in tasks
        assert not any(isinstance(t, DropTask) and "k0" in t.keys for t in tasks)
        assert await _found(cluster, "k0") == [[("n1", DRAM), ("n1", SSD)]]
        assert "k0" not in cluster.master.cluster.nodes["n1"].evict_after_offload
        cluster.master.cluster.table.check()

    run(scenario, policy={"offload": "watermark", "offload_watermark": 0.99})
