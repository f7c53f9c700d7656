"""Reads in one trip (``get_held``) against real processes: a location a client cached
never yields a removed value, a node cut off from its master stops serving them, and an
eviction never frees the memory a direct reader is still receiving."""

from __future__ import annotations

import json
import os
import signal

import pytest
from crc32c import crc32c

import kvstored
from kvstored.client.connection import Connection, default_reply_spin
from kvstored.errors import NoSpaceError
from kvstored.protocol import Tier, ops
from kvstored.protocol.node_api import HeldGetRequest
from kvstored.security import find_client_token
from kvstored.wire import send_frame
from tests.daemon.harness import kvstore_ok, wait_for

MiB = 1 << 20


def _node_connection(client, node: str) -> Connection:
    endpoint = client.nodes[node].endpoint
    return Connection((endpoint.host, endpoint.port), find_client_token(), timeout=30,
                      connect_timeout=30)


def _holder(client, key: str) -> str:
    info = client.stat(key)
    assert info is not None
    return info.replicas[0].node


def _dram_used(master: str, node: str) -> int:
    nodes = json.loads(kvstore_ok("status", "--json", master=master))["nodes"]
    return next(n["dram"]["used"] for n in nodes if n["node"] == node)


def _two_nodes(spawn, tmp_path, drams=("32MiB", "32MiB"), **env: str):
    master = spawn("master", "--listen", "127.0.0.1:0", env=env)
    for name, dram in zip(("n1", "n2"), drams):
        spawn("node", "--master", master.addr, "--listen", "127.0.0.1:0", "--name", name,
              "--data", str(tmp_path / name), "--dram", dram, "--ssd", "1GiB",
              "--backend", "file-per-key")
    wait_for(lambda: len(json.loads(kvstore_ok("status", "--json", master=master.addr))
                         ["nodes"]) == 2, what="two nodes")
    return master


def _old_value_leased_on_n1(master: str, writer, reader, other) -> tuple[bytes, bytes]:
    """``writer`` puts an old value of "k" on n1 and ``reader`` reads it; the old value
    and a new one for it, larger than n1's whole DRAM (it can only land on n2). A filler
    makes n2 the fuller node, so the old value goes to n1; the reader's lookup leases it,
    so n1 still holds it (as its current version of "k") for a while after it is gone
    from the cluster."""
    assert other.put("filler", os.urandom(10 * MiB))
    assert _holder(other, "filler") == "n2"
    wait_for(lambda: _dram_used(master, "n2") >= 10 * MiB, what="n2's heartbeat")
    old, new = os.urandom(2 * MiB), os.urandom(13 * MiB)
    assert writer.put("k", old)
    assert _holder(other, "k") == "n1"
    assert reader.get("k") == old
    assert other.remove("filler")
    return old, new


def test_a_location_cached_before_a_remove_and_a_new_put_never_returns_the_old_bytes(
        spawn, tmp_path):
    master = _two_nodes(spawn, tmp_path, drams=("12MiB", "16MiB"))
    writer = kvstored.connect(master.addr, transport="tcp")
    reader = kvstored.connect(master.addr, transport="tcp")
    other = kvstored.connect(master.addr, transport="tcp")  # removes and puts again
    try:
        old, new = _old_value_leased_on_n1(master.addr, writer, reader, other)
        assert writer.core.held.get("k") is not None  # both know where "k" is, and
        assert reader.core.held.get("k") is not None  # its version
        assert other.remove("k")
        assert other.put("k", new)
        assert _holder(other, "k") == "n2"
        assert writer.get("k") == new and reader.get("k") == new
        assert other.remove("k")
        assert writer.get("k") is None and reader.get("k") is None
        # Again and again on whichever node: a new version beside the old one.
        for round_ in range(4):
            old, new = os.urandom(300_000 + round_), os.urandom(200_000 + round_)
            assert writer.put(f"j{round_}", old)
            assert reader.get(f"j{round_}") == old
            assert other.remove(f"j{round_}")
            assert writer.get(f"j{round_}") is None and reader.get(f"j{round_}") is None
            assert other.put(f"j{round_}", new)
            assert writer.get(f"j{round_}") == new and reader.get(f"j{round_}") == new
    finally:
        for client in (writer, reader, other):
            client.close()


def test_a_last_copy_an_admin_drops_is_never_served_from_a_cached_location(spawn, tmp_path):
    """``kvstore evict --drop`` of a last copy removes the object as a remove does: a
    client that cached where it was must not read the dropped bytes from that node (still
    there while the reader's lease runs) once the key holds another value."""
    # No offload below the watermark: the DRAM copy stays the last copy.
    master = _two_nodes(spawn, tmp_path, drams=("12MiB", "16MiB"),
                        KVSTORED_POLICY_OFFLOAD="watermark")
    writer = kvstored.connect(master.addr, transport="tcp")
    reader = kvstored.connect(master.addr, transport="tcp")
    other = kvstored.connect(master.addr, transport="tcp")
    try:
        _, new = _old_value_leased_on_n1(master.addr, writer, reader, other)
        assert writer.core.held.get("k") is not None
        # (Named twice: the second finds the object gone already.)
        report = json.loads(kvstore_ok("evict", "--tier", "dram", "--key", "k", "--key", "k",
                                       "--drop", "--json", master=master.addr))
        assert "k" in report["evicted"], report
        assert other.get("k") is None
        assert other.put("k", new)
        assert _holder(other, "k") == "n2"
        assert writer.get("k") == new and reader.get("k") == new
    finally:
        for client in (writer, reader, other):
            client.close()


def test_a_node_serves_held_keys_without_its_master_only_within_its_permit(
        spawn, tmp_path):
    master = _two_nodes(spawn, tmp_path, KVSTORED_MASTER_DIRECT_PERMIT="3s")
    value = os.urandom(100_000)
    with kvstored.connect(master.addr, transport="tcp") as c:
        assert c.put("k", value)
        node = _holder(c, "k")
        conn = _node_connection(c, node)
        request = HeldGetRequest(["k"], [crc32c(value)])
        buf = memoryview(bytearray(len(value)))
        assert conn.call(ops.GET_HELD, request, (), [buf]).sizes == [len(value)]
        master.proc.send_signal(signal.SIGSTOP)
        try:
            # Served without the master (a lookup would hang now)...
            assert conn.call(ops.GET_HELD, request, (), [buf]).sizes == [len(value)]
            assert bytes(buf) == value
            # ...until the permit of its last answered heartbeat runs out.
            wait_for(lambda: conn.call(ops.GET_HELD, request, (), [buf]).sizes == [-1],
                     timeout=30, what="the node to stop serving without its master")
        finally:
            master.proc.send_signal(signal.SIGCONT)
        wait_for(lambda: conn.call(ops.GET_HELD, request, (), [buf]).sizes == [len(value)],
                 timeout=30, what="the permit to be renewed")
        conn.close()


def test_a_key_a_client_put_is_read_in_one_trip_after_it_moved_to_ssd(spawn, tmp_path):
    """The node serves the SSD copy of a version the client put (get_held): no master
    lookup, so the read works with the master stopped, within the node's permit."""
    # A new master's first put waits out the permit (Revoker.settle): not a long one.
    master = _two_nodes(spawn, tmp_path, KVSTORED_MASTER_DIRECT_PERMIT="5s",
                        KVSTORED_POLICY_OFFLOAD="watermark")
    values = {f"k{i}": os.urandom(300_000 + i) for i in range(4)}
    with kvstored.connect(master.addr, transport="tcp") as c:
        assert all(c.batch_put(list(values), list(values.values())))
        kvstore_ok("flush", "--wait", master=master.addr)
        kvstore_ok("evict", "--tier", "dram", "--all", master=master.addr)
        wait_for(lambda: all([r.tier for r in c.stat(k).replicas] == ["ssd"]
                             for k in values), timeout=15, what="the DRAM copies to go")
        master.proc.send_signal(signal.SIGSTOP)
        try:
            tiers: list = []
            buffers = [bytearray(len(v)) for v in values.values()]
            assert c.batch_get_into(list(values), buffers, tiers=tiers) == [
                len(v) for v in values.values()]
            assert buffers == list(values.values())
            assert tiers == [Tier.SSD] * len(values)
            assert c.get("k0") == values["k0"]  # the one-key path too
        finally:
            master.proc.send_signal(signal.SIGCONT)
        # The node reports those reads (held_reads): they count toward promotion as
        # reads after a lookup do (policy.promote_reads), and the promoted copy is the
        # held version again.
        wait_for(lambda: c.get("k1") == values["k1"]
                 and "dram" in [r.tier for r in c.stat("k1").replicas],
                 timeout=30, what="k1 to be promoted by its reads")


def test_eviction_never_frees_the_memory_a_direct_reader_is_still_receiving(embedded):
    up = embedded("--offload", "watermark", dram="64MiB")
    value = os.urandom(40 * MiB)
    with kvstored.connect(up.addr, transport="tcp") as c:
        assert c.put("big", value)
        [node] = c.nodes
        conn = _node_connection(c, node)
        # A reader that asks, then takes its time: the node is left sending from the
        # object's memory, the socket buffers full.
        send_frame(conn.sock, ops.GET_HELD.request_header(
            HeldGetRequest(["big"], [crc32c(value)])))
        reply = ops.GET_HELD.decode_reply(conn.reader.recv_header())
        assert reply.sizes == [len(value)]
        got = memoryview(bytearray(len(value)))
        conn.reader.recv_payload_into(got[:MiB])
        report = json.loads(kvstore_ok("flush", "--wait", "--json", master=up.addr))
        assert report["done"] and report["failed"] == [], report
        kvstore_ok("evict", "--tier", "dram", "--key", "big", master=up.addr)
        wait_for(lambda: [r.tier.value for r in c.stat("big").replicas] == ["ssd"],
                 timeout=30, what="the node to drop its DRAM copy")
        # Dropped, but still being sent: its memory is not free for another object.
        with pytest.raises(NoSpaceError):
            c.put("filler", os.urandom(40 * MiB))
        conn.reader.recv_payload_into(got[MiB:])
        assert crc32c(got) == crc32c(value)
        # The read is over: the memory goes back.
        filler = os.urandom(40 * MiB)
        wait_for(lambda: _put_or_full(c, "filler", filler), timeout=30,
                 what="the memory to be freed once the reader is done")
        assert c.get("big") == value  # from SSD
        assert c.get("filler") == filler
        conn.close()


def _put_or_full(client, key: str, value: bytes) -> bool:
    try:
        return client.put(key, value)
    except NoSpaceError:
        return False


@pytest.mark.parametrize("spin", [0.0, 0.05, None])
def test_gets_polling_for_their_reply_or_blocking_read_the_same_bytes(embedded, spin):
    """``reply_spin``: a call polls for its reply that long before it blocks (None: what
    this machine calls for); a reply slower than the spin (an SSD read after a flush
    and evict) is still received whole, and every connection of the client spins."""
    up = embedded(backend="bucket")
    values = {f"spin{i}": os.urandom(65536 + i) for i in range(8)}
    with kvstored.connect(up.addr, transport="tcp", reply_spin=spin) as c:
        assert c.batch_put(list(values), list(values.values())) == [True] * 8
        assert [c.get(k) for k in values] == list(values.values())
        kvstore_ok("flush", "--wait", master=up.addr)
        kvstore_ok("evict", "--tier", "dram", "--all", master=up.addr)
        assert [c.get(k) for k in values] == list(values.values())
        expected = default_reply_spin() if spin is None else spin
        assert c._all and all(conn.reader.spin == expected for conn in c._all)
