"""The master's side of reads in one trip (kvstored/master/revoke.py), in-process: the
permit nodes are told, a remove that cannot reach a node's data server, a new master's
first puts, and the reads nodes served without it."""

from __future__ import annotations

import time

from kvstored.protocol import Role, ops
from kvstored.protocol.master_api import (
    HeartbeatRequest,
    KeysRequest,
    NodeReport,
    PutTargetRequest,
    RemovePrefixRequest,
    RevokeTask,
    StatRequest,
)
from tests.master.harness import Cluster, run
from tests.master.test_service import cluster_register

PERMIT = 0.5


def test_a_node_is_told_its_permit_when_it_registers():
    async def scenario(cluster: Cluster) -> None:
        reply = await cluster.rpc(Role.NODE).call(ops.REGISTER, cluster_register("n1"))
        assert reply.direct_permit == PERMIT

    run(scenario, direct_permit=PERMIT)


def test_a_remove_that_cannot_reach_the_node_goes_by_heartbeat_and_waits_out_the_permit():
    async def scenario(cluster: Cluster) -> None:
        node = await cluster.node("n1")  # its data server address (port 1) answers nothing
        await node.commit(("k", 10, 1, 0), ("j", 10, 2, 4096))
        await node.heartbeat()
        answered = time.monotonic()
        client = cluster.client()
        assert (await client.call(ops.REMOVE, KeysRequest(["k"]))).removed == [True]
        # Not before the node's permit from its last heartbeat has run out...
        assert time.monotonic() >= answered + PERMIT - 0.05
        # ...and its next heartbeat carries the revoke, which it applies before renewing.
        assert RevokeTask(["k"]) in await node.heartbeat()
        removed = await client.call(ops.REMOVE_PREFIX, RemovePrefixRequest("j"))
        assert removed.removed == 1
        assert RevokeTask(["j"]) in await node.heartbeat()
        # Nothing held anywhere: nothing to revoke, no wait.
        started = time.monotonic()
        assert (await client.call(ops.REMOVE, KeysRequest(["k"]))).removed == [False]
        assert time.monotonic() - started < PERMIT

    run(scenario, direct_permit=PERMIT)


def test_a_new_master_takes_its_first_puts_once_no_earlier_permit_can_run():
    async def scenario(cluster: Cluster) -> None:
        await cluster.node("n1")
        started = cluster.master.revoker.started
        reply = await cluster.client().call(ops.PUT_TARGET, PutTargetRequest(["k"], [10]))
        assert reply.targets == ["n1"]
        assert time.monotonic() >= started + PERMIT

    run(scenario, direct_permit=PERMIT)


def test_reads_a_node_served_without_a_lookup_count_as_reads():
    async def scenario(cluster: Cluster) -> None:
        node = await cluster.node("n1")
        await node.commit(("k", 10, 1, 0))
        await node.rpc.call(ops.HEARTBEAT, HeartbeatRequest(
            "n1", None, NodeReport(), held_reads=["k", "gone"]))
        stat = (await cluster.client().call(ops.STAT, StatRequest("k"))).object
        assert stat.reads == 1

    run(scenario)
