"""The node's data server ops over a real socket, sent directly (not through the client's
put planning), as a buggy or hostile client could."""

from __future__ import annotations

import json

from crc32c import crc32c

import kvstored
from kvstored.client.connection import Connection
from kvstored.protocol import PutStatus, ops
from kvstored.protocol.master_api import KeysRequest
from kvstored.protocol.node_api import PutRequest
from kvstored.security import find_client_token
from tests.daemon.harness import kvstore_ok, wait_for


def _node_connection(client) -> Connection:
    endpoint = next(iter(client.nodes.values())).endpoint
    return Connection((endpoint.host, endpoint.port), find_client_token(), timeout=30,
                      connect_timeout=30)


def test_a_node_put_of_an_existing_key_leaves_the_committed_object_intact(embedded):
    up = embedded("--offload", "watermark")  # the object stays DRAM-only until the flush
    original = b"committed " * 10_000
    with kvstored.connect(up.addr, transport="tcp") as c:
        assert c.put("k", original)
        other = b"other bytes" * 5_000
        reply = _node_connection(c).call(
            ops.PUT, PutRequest(["k"], [len(other)], [crc32c(other)]), [other])
        assert reply.results == [PutStatus.EXISTS]
        assert c.get("k") == original  # over TCP, from the node's DRAM
        report = json.loads(kvstore_ok("flush", "--wait", "--json", master=up.addr))
        assert report["done"] and report["failed"] == [], report
        kvstore_ok("evict", "--tier", "dram", "--key", "k", master=up.addr)
        wait_for(lambda: [r.tier for r in c.stat("k").replicas] == ["ssd"], timeout=15,
                 what="the DRAM copy to go")
        assert c.get("k") == original  # and from SSD


def test_a_seal_without_a_write_in_flight_is_missing_and_changes_nothing(embedded):
    up = embedded()
    with kvstored.connect(up.addr, transport="tcp") as c:
        assert c.put("k", b"v" * 5000)
        node = _node_connection(c)
        assert node.call(ops.SEAL, KeysRequest(["k"])).results == [PutStatus.MISSING]
        node.call(ops.ABORT, KeysRequest(["k"]))
        assert c.get("k") == b"v" * 5000
