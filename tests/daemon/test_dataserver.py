"""The node's data server ops over a real socket, sent directly (not through the client's
put planning), as a buggy or hostile client could."""

from __future__ import annotations

import json

from crc32c import crc32c

import kvstored
from tests.daemon.harness import kvstore_ok, wait_for


def test_a_node_put_of_an_existing_key_leaves_the_committed_object_intact(embedded):
    up = embedded("--offload", "watermark")  # the object stays DRAM-only until the flush
    original = b"committed " * 10_000
    with kvstored.connect(up.addr, transport="tcp") as c:
        assert c.put("k", original)
        node = next(iter(c._nodes))
        other = b"other bytes" * 5_000
        reply = c._node_conn(node).request(
            {"op": "put", "keys": ["k"], "sizes": [len(other)], "checksums": [crc32c(other)]},
            [other])
        assert reply["results"] == ["exists"]
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
        node = next(iter(c._nodes))
        assert c._node_conn(node).request({"op": "seal", "keys": ["k"]})["results"] == \
            ["missing"]
        c._node_conn(node).request({"op": "abort", "keys": ["k"]})
        assert c.get("k") == b"v" * 5000
