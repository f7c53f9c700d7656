"""A node in-process with a master in-process (tests/master/harness.py), over loopback
sockets in one trio run: registration and its inventory after a restart (a copy the
cluster holds in another version is dropped), puts over TCP and through the segment,
gets from DRAM and SSD that never serve another version, tasks from heartbeats (offload,
drop), bad copies reported by clients, roles on the data server, leaving, and the reaper
under its supervisor."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from crc32c import crc32c

from kvstored.errors import UnauthorizedError, UnreachableError
from kvstored.node.service import Node, NodeConfig, open_node
from kvstored.protocol import PutStatus, Role, Tier, ops
from kvstored.protocol.master_api import EvictRequest, KeysRequest
from kvstored.protocol.node_api import (
    GetRequest,
    HeldGetRequest,
    PutRequest,
    ReportCorruptRequest,
)
from kvstored.rpc import RpcClient
from kvstored.sdk import ReadStatus
from kvstored.security import Credentials
from tests.daemon.harness import closed_port
from tests.master.harness import CLIENT_TOKEN, NODE_TOKEN, Cluster, running_master

MiB = 1 << 20


def _config(tmp_path: Path, master: tuple[str, int], **changes: Any) -> NodeConfig:
    return replace(NodeConfig(data_dir=tmp_path / "node", dram=16 * MiB, ssd=64 * MiB,
                              backend="file-per-key", master=master, name="n1",
                              populate=False, shutdown_flush_timeout=10), **changes)


@asynccontextmanager
async def running_node(config: NodeConfig) -> AsyncIterator[Node]:
    """``config``'s node, serving until the block ends."""
    async with open_node(config, credentials=Credentials(True, node=NODE_TOKEN)) as node, \
            trio.open_nursery() as nursery:
        await nursery.start(node.run)
        try:
            yield node
        finally:
            nursery.cancel_scope.cancel()


def _run(tmp_path: Path, scenario: Callable[[Cluster, Node, RpcClient], Awaitable[None]],
         *, policy: dict[str, Any] | None = None, direct_permit: float = 0.0,
         **changes: Any) -> None:
    """``scenario(cluster, node, client)`` with a registered node and a client of it;
    ``direct_permit`` (off by default) lets the node serve get_held."""
    async def main() -> None:
        with trio.fail_after(60):
            async with running_master(policy=policy or {}, heartbeat_interval=0.05,
                                      lease_ttl=0.0, direct_permit=direct_permit) as cluster, \
                    running_node(_config(tmp_path, cluster.address, **changes)) as node:
                await node.registered.wait()
                client = _data_client(node)
                try:
                    await scenario(cluster, node, client)
                finally:
                    client.close()

    trio.run(main)


def _data_client(node: Node, token: str = CLIENT_TOKEN) -> RpcClient:
    assert node.address is not None
    return RpcClient(node.address, token=token, timeout=30)


async def _put(client: RpcClient, **values: bytes) -> list[PutStatus]:
    keys = list(values)
    reply = await client.call(ops.PUT, PutRequest(
        keys, [len(v) for v in values.values()], [crc32c(v) for v in values.values()]),
        list(values.values()))
    return reply.results


async def _get(client: RpcClient, key: str, size: int, checksum: int | None) -> bytes | None:
    buffer = memoryview(bytearray(size))
    reply = await client.call(ops.GET, GetRequest([key], [checksum]), into=[buffer])
    return bytes(buffer[:reply.sizes[0]]) if reply.sizes[0] >= 0 else None


async def _poll(condition: Callable[[], bool], what: str) -> None:
    with trio.fail_after(20):
        while not condition():
            await trio.sleep(0.01)


def _tiers(cluster: Cluster, key: str) -> set[Tier]:
    meta = cluster.master.cluster.table.objects.get(key)
    return {r.tier for r in meta.readable()} if meta else set()


def _flip_ssd_byte(node: Node, key: str, at: int) -> None:
    """Invert one byte of ``key``'s value in its SSD record, ``at`` bytes in."""
    where = node.backend.locate(key)
    assert where is not None
    with open(where.path, "r+b") as f:
        f.seek(where.offset + at)
        byte = f.read(1)
        f.seek(where.offset + at)
        f.write(bytes([byte[0] ^ 0xFF]))


# -- registration -----------------------------------------------------------------------------

def test_a_restarted_node_registers_what_its_ssd_holds(tmp_path):
    value = os.urandom(100_000)

    async def main() -> None:
        with trio.fail_after(60):
            async with running_master(heartbeat_interval=0.05) as cluster:
                config = _config(tmp_path, cluster.address)
                async with running_node(config) as node:
                    await node.registered.wait()
                    client = _data_client(node)
                    assert await _put(client, k=value) == [PutStatus.OK]
                    client.close()
                    await _poll(lambda: _tiers(cluster, "k") == {Tier.DRAM, Tier.SSD},
                                "the eager offload")
                await _poll(lambda: cluster.master.cluster.nodes["n1"].session is None,
                            "the master to see the node go")
                async with running_node(config) as node:
                    await node.registered.wait()
                    assert _tiers(cluster, "k") == {Tier.SSD}  # DRAM is gone, SSD is not
                    client = _data_client(node)
                    assert await _get(client, "k", len(value), crc32c(value)) == value
                    client.close()

    trio.run(main)


def test_a_restarted_node_drops_its_copy_of_a_key_the_cluster_holds_in_another_version(
        tmp_path):
    """The master refuses the copy (another node registered another version meanwhile):
    the node drops its own, and the cluster keeps one version."""
    value = os.urandom(100_000)

    async def main() -> None:
        with trio.fail_after(60):
            async with running_master(heartbeat_interval=0.05) as cluster, \
                    running_node(_config(tmp_path, cluster.address)) as node:
                await node.registered.wait()
                client = _data_client(node)
                assert await _put(client, k=value) == [PutStatus.OK]
                client.close()
                await _poll(lambda: Tier.SSD in _tiers(cluster, "k"), "the eager offload")
            async with running_master(heartbeat_interval=0.05) as cluster:
                await cluster.node("n2", inventory=[("k", len(value), 99, Tier.SSD, -1)])
                async with running_node(_config(tmp_path, cluster.address)) as node:
                    await node.registered.wait()
                    assert node.backend.stat("k") is None
                    replicas = cluster.master.cluster.table.objects["k"].readable()
                    assert [(r.node, r.tier) for r in replicas] == [("n2", Tier.SSD)]

    trio.run(main)


# -- puts and gets --------------------------------------------------------------------------------

def test_gets_come_from_dram_then_ssd_and_never_give_another_version(tmp_path):
    value = os.urandom(70_000)

    async def scenario(cluster: Cluster, node: Node, client: RpcClient) -> None:
        assert await _put(client, k=value, e=b"") == [PutStatus.OK, PutStatus.OK]
        assert await _put(client, k=b"other") == [PutStatus.EXISTS]  # written once
        assert await _get(client, "k", len(value), crc32c(value)) == value
        assert await _get(client, "k", len(value), crc32c(value) ^ 1) is None
        assert await _get(client, "e", 0, crc32c(b"")) == b""
        await cluster.client().call(ops.FLUSH, ops.FlushRequest(wait=True, timeout=30))
        await cluster.client().call(ops.EVICT, EvictRequest(Tier.DRAM, keys=["k"]))
        await _poll(lambda: node.dram.get("k") is None, "the drop of the DRAM copy")
        assert _tiers(cluster, "k") == {Tier.SSD}
        assert await _get(client, "k", len(value), crc32c(value)) == value  # from SSD
        assert await _get(client, "k", len(value), crc32c(value) ^ 1) is None

    _run(tmp_path, scenario, policy={"offload": "watermark"})


@pytest.mark.parametrize("backend", ["file-per-key", "bucket"])
def test_a_corrupt_ssd_record_in_a_batched_get_is_a_miss_for_that_key_only(tmp_path, backend):
    """The get streams its SSD items as they are read (the header goes first): the bad
    record's item travels as zeros and is a miss in the trailer; every other item of the
    batch, from SSD or DRAM, arrives whole, and a key asked for twice comes twice."""
    values = {f"k{i}": os.urandom(90_000 + i) for i in range(5)}

    async def scenario(cluster: Cluster, node: Node, client: RpcClient) -> None:
        assert await _put(client, **values) == [PutStatus.OK] * 5
        await cluster.client().call(ops.FLUSH, ops.FlushRequest(wait=True, timeout=30))
        ssd_only = ["k0", "k1", "k2", "k3"]
        await cluster.client().call(ops.EVICT, EvictRequest(Tier.DRAM, keys=ssd_only))
        await _poll(lambda: all(node.dram.get(k) is None for k in ssd_only),
                    "the drop of the DRAM copies")
        _flip_ssd_byte(node, "k2", 1000)  # bit rot in k2's value
        keys = ["k0", "k4", "k2", "k1", "k3", "k0"]
        buffers = [memoryview(bytearray(b"\xee" * 100_000)) for _ in keys]
        reply = await client.call(ops.GET, GetRequest(
            keys, [crc32c(values[k]) for k in keys]), into=buffers)
        assert reply.sizes == [len(values[k]) if k != "k2" else ReadStatus.CORRUPT
                               for k in keys]
        assert sorted(reply.from_ssd) == [0, 2, 3, 4, 5]
        for key, buffer, size in zip(keys, buffers, reply.sizes):
            if key != "k2":
                assert bytes(buffer[:size]) == values[key], key
        # Not the stored bytes, rotten or not: zeros.
        assert bytes(buffers[2][:len(values["k2"])]) == bytes(len(values["k2"]))
        assert node.integrity.corrupt_reads == 1
        # The connection is still in step: the next get on it is served.
        assert await _get(client, "k3", len(values["k3"]), crc32c(values["k3"])) \
            == values["k3"]

    _run(tmp_path, scenario, policy={"offload": "watermark"}, backend=backend)


def test_get_held_serves_the_ssd_copy_of_a_held_version_until_it_is_revoked(tmp_path):
    """A key a client put is read in one trip after it moved to SSD: get_held streams
    the SSD copy of that version (a bad record is a miss in the trailer, as in a get),
    and serves none of it once the key is revoked, though the record is still there."""
    values = {f"k{i}": os.urandom(80_000 + i) for i in range(3)}
    sums = {k: crc32c(v) for k, v in values.items()}

    async def scenario(cluster: Cluster, node: Node, client: RpcClient) -> None:
        assert await _put(client, **values) == [PutStatus.OK] * 3
        await cluster.client().call(ops.FLUSH, ops.FlushRequest(wait=True, timeout=30))
        await cluster.client().call(ops.EVICT, EvictRequest(Tier.DRAM, keys=["k0", "k1"]))
        await _poll(lambda: node.dram.get("k0") is None and node.dram.get("k1") is None,
                    "the drop of the DRAM copies")
        _flip_ssd_byte(node, "k1", 100)  # bit rot in k1's value

        async def get_held(keys: list[str], checksums: list[int]):
            buffers = [memoryview(bytearray(100_000)) for _ in keys]
            reply = await client.call(ops.GET_HELD, HeldGetRequest(keys, checksums),
                                      into=buffers)
            return reply, buffers

        keys = ["k0", "k2", "k1", "k0"]
        reply, buffers = await get_held(keys, [sums[k] for k in keys])
        assert reply.sizes == [len(values["k0"]), len(values["k2"]), ReadStatus.CORRUPT,
                               len(values["k0"])]
        assert sorted(reply.from_ssd) == [0, 2, 3]
        for i in (0, 1, 3):
            assert bytes(buffers[i][:reply.sizes[i]]) == values[keys[i]]
        assert bytes(buffers[2][:len(values["k1"])]) == bytes(len(values["k1"]))
        reply, _ = await get_held(["k0"], [sums["k0"] ^ 1])  # another version: never
        assert reply.sizes == [ReadStatus.MISSING]
        node.dram.revoke(["k0"])
        assert node.backend.stat("k0") is not None
        reply, _ = await get_held(["k0", "k2"], [sums["k0"], sums["k2"]])
        assert reply.sizes == [ReadStatus.MISSING, len(values["k2"])]

    _run(tmp_path, scenario, policy={"offload": "watermark"}, backend="bucket",
         direct_permit=30.0)


def test_a_same_host_put_is_allocated_copied_through_the_segment_and_sealed(tmp_path):
    value = os.urandom(5000)

    async def scenario(cluster: Cluster, node: Node, client: RpcClient) -> None:
        request = PutRequest(["s"], [len(value)], [crc32c(value)])
        (offset,) = (await client.call(ops.ALLOC, request)).offsets
        assert offset is not None
        node.segment.view(offset, len(value))[:] = value  # as a mapping client would
        assert (await client.call(ops.SEAL, KeysRequest(["s"]))).results == [PutStatus.OK]
        assert _tiers(cluster, "s") == {Tier.DRAM}
        (offset,) = (await client.call(ops.ALLOC, PutRequest(["t"], [10], [1]))).offsets
        assert (await client.call(ops.SEAL, KeysRequest(["t"]))).results == \
            [PutStatus.CORRUPT]  # nothing copied: the bytes fail the checksum
        assert (await client.call(ops.SEAL, KeysRequest(["t"]))).results == \
            [PutStatus.MISSING]
        assert "t" not in cluster.master.cluster.table.objects

    _run(tmp_path, scenario)


def test_a_bad_dram_copy_a_client_reports_is_checked_dropped_and_counted(tmp_path):
    value = os.urandom(8000)

    async def scenario(cluster: Cluster, node: Node, client: RpcClient) -> None:
        assert await _put(client, good=value, bad=value) == [PutStatus.OK] * 2
        checksum = crc32c(value)
        bad = node.dram.get("bad")
        assert bad is not None
        copy = node.dram.view(bad)  # a same-host writer, after its seal:
        copy[:4] = bytes(b ^ 0xFF for b in copy[:4])  # never the bytes it held
        reply = await client.call(ops.REPORT_CORRUPT, ReportCorruptRequest(
            ["good", "bad"], [checksum, checksum]))
        assert reply.corrupt == [False, True]  # the node checks; a good copy stays
        assert node.dram.get("bad") is None and node.integrity.corrupt_reads == 1
        await _poll(lambda: "bad" not in cluster.master.cluster.table.objects,
                    "the master to drop the bad copy")
        assert await _get(client, "good", len(value), checksum) == value

    _run(tmp_path, scenario, policy={"offload": "watermark"})


def test_a_removed_object_is_dropped_by_its_node_at_the_next_heartbeat(tmp_path):
    async def scenario(cluster: Cluster, node: Node, client: RpcClient) -> None:
        assert await _put(client, k=b"x" * 5000) == [PutStatus.OK]
        used = node.dram.used
        assert used > 0
        await cluster.client().call(ops.REMOVE, KeysRequest(["k"]))
        await _poll(lambda: node.dram.used == 0, "the drop task")

    _run(tmp_path, scenario, policy={"offload": "watermark"})


def test_a_promotion_that_finds_no_dram_room_is_reported_and_counted(tmp_path):
    value = os.urandom(100_000)

    async def scenario(cluster: Cluster, node: Node, client: RpcClient) -> None:
        def no_room() -> float | None:
            return cluster.master.metrics.registry.get_sample_value(
                "kvstored_promotions_skipped_total", {"reason": "no_room"})

        assert await _put(client, s=value) == [PutStatus.OK]
        await cluster.client().call(ops.FLUSH, ops.FlushRequest(wait=True, timeout=30))
        await cluster.client().call(ops.EVICT, EvictRequest(Tier.DRAM, keys=["s"]))
        await _poll(lambda: _tiers(cluster, "s") == {Tier.SSD}, "s to be on SSD only")
        # Everything left in DRAM taken by a write in flight: no room to promote into.
        await _poll(lambda: node.dram.get("s") is None, "the DRAM copy to be freed")
        size = node.dram.allocator.largest_free()
        offset = node.dram.allocate("filler", size, 0, 60)
        assert offset is not None and node.dram.allocator.largest_free() < len(value)
        assert no_room() == 0
        await node.tasks.promote(["s"])
        await _poll(lambda: no_room() == 1, "the master to count the promotion it lost")
        assert _tiers(cluster, "s") == {Tier.SSD}
        node.dram.free("filler", offset)

    _run(tmp_path, scenario)


# -- roles -------------------------------------------------------------------------------------

def test_the_data_server_checks_the_cluster_client_token(tmp_path):
    async def scenario(cluster: Cluster, node: Node, client: RpcClient) -> None:
        with pytest.raises(UnauthorizedError, match="wrong token"):
            await _data_client(node, token="not-it").connect()
        assert (await client.hello()).max_read_staging == node.staging.budget
        # The node token is good for the data server too (a node may call client ops).
        peer = RpcClient(node.address or ("", 0), token=NODE_TOKEN, role=Role.NODE)
        assert (await peer.hello()).role is Role.NODE
        peer.close()

    _run(tmp_path, scenario)


def test_a_node_that_has_no_master_yet_turns_clients_away(tmp_path):
    async def main() -> None:
        with trio.fail_after(30):
            unreachable = ("127.0.0.1", closed_port())
            async with running_node(_config(tmp_path, unreachable)) as node:
                with pytest.raises(UnreachableError, match="not registered"):
                    await _data_client(node).connect()

    trio.run(main)


# -- leaving -----------------------------------------------------------------------------------

def test_a_leaving_node_writes_its_dram_only_objects_to_ssd_and_unregisters(tmp_path):
    async def scenario(cluster: Cluster, node: Node, client: RpcClient) -> None:
        assert await _put(client, a=b"a" * 4000, b=b"b" * 4000) == [PutStatus.OK] * 2
        assert sorted(await trio.to_thread.run_sync(node.offloader.not_on_ssd)) == ["a", "b"]
        await node.leave()
        assert "n1" not in cluster.master.cluster.nodes
        assert {r.key for r in node.backend.scan()} == {"a", "b"}
        assert await _put(client, c=b"c") == [PutStatus.NO_SPACE]  # no puts while leaving

    _run(tmp_path, scenario, policy={"offload": "watermark"})


# -- background ---------------------------------------------------------------------------------

def test_the_reaper_survives_failures_and_keeps_reclaiming(tmp_path):
    calls = []

    async def main() -> None:
        config = _config(tmp_path, ("127.0.0.1", 1))
        async with open_node(config) as node:
            node.dram.allocate("abandoned", 4096, 1, timeout=0)  # expires at once
            real = node.dram.expire_uncommitted

            def flaky(now: float) -> list[str]:
                calls.append(now)
                if len(calls) <= 2:
                    raise OSError("injected")
                return real(now)

            node.dram.expire_uncommitted = flaky  # type: ignore[method-assign]
            with trio.move_on_after(20):
                await node.supervisor.forever("reaper", node.reap)
            assert node.metrics.background_errors.labels(task="reaper")._value.get() == 2
            assert node.dram.being_written("abandoned") is None and node.dram.used == 0

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert len(calls) > 5
