"""The clients' read core (BatchRead) without sockets: replicas tried in turn, every copy
checked against the object's CRC-32C, and a node that cannot serve makes a miss, not an
error."""

from __future__ import annotations

import os
import uuid

import pytest
from crc32c import crc32c

from kvstored.client.read import MISSING, BatchRead, NodeHealth, ReadStats, split_by_bytes
from kvstored.client.segments import Segments
from kvstored.errors import BadRequestError
from kvstored.hostid import host_id
from kvstored.protocol import Tier
from kvstored.protocol.master_api import Endpoint, LookupReply, NodeContact, Replicas
from kvstored.shm import DramSegment
from kvstored.wire import Parts

VALUE = os.urandom(5000)
#: VALUE with its first six bytes inverted: always other bytes (a constant written over
#: random ones is the same bytes one run in 2**48).
FORGED = bytes(b ^ 0xFF for b in VALUE[:6]) + VALUE[6:]
NODES = {n: NodeContact(Endpoint("127.0.0.1", 1), "elsewhere", "s", "00")
         for n in ("n1", "n2")}


def _reply(*objects, nodes=NODES) -> LookupReply:
    """A lookup's reply; each object is None (not found) or ``[size, checksum,
    [[node, tier, offset], ...]]``."""
    replicas = Replicas()
    for i, found in enumerate(objects):
        for node, tier, offset in found[2] if found else ():
            replicas.of.append(i)
            replicas.nodes.append(node)
            replicas.tiers.append(Tier(tier))
            replicas.offsets.append(offset)
    return LookupReply([o[0] if o else None for o in objects],
                       [o[1] if o else None for o in objects], replicas, 5.0, nodes)


def _read(reply, keys, *, transport="tcp", health=None, segments=None):
    buffers = [memoryview(bytearray(len(VALUE))) for _ in keys]
    return BatchRead(keys, reply, buffers, segments or Segments(transport),
                     health or NodeHealth(), ReadStats())


def _deliver(read: BatchRead, node: str, data: bytes = VALUE) -> None:
    for i in read.tcp_requests()[node]:
        read.buffers[i][:len(data)] = data
        read.received(i, len(data))


def test_an_unreachable_node_falls_back_to_the_next_replica_then_misses():
    found = [len(VALUE), crc32c(VALUE), [["n1", "dram", 0], ["n1", "ssd", -1], ["n2", "ssd", -1]]]
    only_n1 = [len(VALUE), crc32c(VALUE), [["n1", "dram", 0]]]
    read = _read(_reply(found, None, only_n1), ["a", "missing", "b"])
    assert read.tcp_requests() == {"n1": [0, 2]}  # one request per node, DRAM copies first
    read.failed("n1", [0, 2])
    assert read.tcp_requests() == {"n2": [0]}
    _deliver(read, "n2")
    assert not read.pending
    assert read.results == [len(VALUE), MISSING, MISSING]
    assert bytes(read.buffers[0]) == VALUE
    assert read.stats.node_failures == 2


def test_a_node_that_just_failed_is_not_asked_again_for_a_while():
    health = NodeHealth(holdoff=60)
    health.down("n1")
    found = [len(VALUE), crc32c(VALUE), [["n1", "ssd", -1], ["n2", "ssd", -1]]]
    read = _read(_reply(found, [len(VALUE), crc32c(VALUE), [["n1", "ssd", -1]]]),
                 ["a", "b"], health=health)
    assert read.tcp_requests() == {"n2": [0]}
    assert read.results[1] == MISSING and 1 not in read._open
    assert not NodeHealth(holdoff=0).is_down("n1")


def test_bad_bytes_are_never_a_result_and_are_reported_to_their_node():
    found = [len(VALUE), crc32c(VALUE), [["n1", "dram", 0], ["n2", "ssd", -1]]]
    read = _read(_reply(found), ["a"])
    _deliver(read, "n1", bytes([VALUE[0] ^ 0xFF]) + VALUE[1:])  # always a different byte
    assert read.pending and read.results == [MISSING]
    assert read.take_corrupt() == {"n1": (["a"], [crc32c(VALUE)])}
    assert read.take_corrupt() == {}
    _deliver(read, "n2")
    assert read.results == [len(VALUE)] and read.stats.checksum_failures == 1


def test_a_node_that_no_longer_has_it_moves_on_and_a_short_copy_fails_the_check():
    found = [len(VALUE), crc32c(VALUE), [["n1", "ssd", -1], ["n2", "ssd", -1]]]
    read = _read(_reply(found), ["a"])
    read.received(read.tcp_requests()["n1"][0], MISSING)
    read.received(read.tcp_requests()["n2"][0], 10)
    assert not read.pending and read.results == [MISSING]


def test_buffer_and_transport_errors_are_raised_before_any_io():
    found = [len(VALUE), crc32c(VALUE), [["n1", "ssd", -1]]]
    with pytest.raises(BadRequestError, match="at least 5000"):
        BatchRead(["a"], _reply(found), [memoryview(bytearray(10))], Segments("tcp"),
                  NodeHealth(), ReadStats())
    with pytest.raises(BadRequestError, match="transport='shm'"):
        _read(_reply(found), ["a"], transport="shm")


@pytest.fixture
def segment():
    seg = DramSegment.create(f"kvstored-test-{os.getpid()}-{uuid.uuid4().hex[:10]}", 1 << 20,
                             populate=False)
    yield seg
    seg.close()


def test_a_same_host_copy_is_checked_and_a_bad_one_is_read_again_over_tcp(segment):
    nodes = {"n1": NodeContact(Endpoint("127.0.0.1", 1), host_id(), segment.name,
                               segment.token.hex())}
    segment.view(0, len(VALUE))[:] = VALUE
    segment.view(8192, len(VALUE))[:] = FORGED
    segments = Segments("auto")
    try:
        read = _read(_reply([len(VALUE), crc32c(VALUE), [["n1", "dram", 0]]],
                            [len(VALUE), crc32c(VALUE), [["n1", "dram", 8192]]], nodes=nodes),
                     ["good", "forged"], segments=segments, transport="auto")
        copies = read.shm_copies()
        assert [(c.index, c.node, c.offset) for c in copies] == [(0, "n1", 0), (1, "n1", 8192)]
        read.copy_from_segments(0.0, lambda: 0.0)
        assert read.results == [len(VALUE), MISSING]
        assert read.take_corrupt() == {"n1": (["forged"], [crc32c(VALUE)])}
        assert read.tcp_requests() == {"n1": [1]}  # the node dropped its bad copy: ask it
        _deliver(read, "n1")
        assert read.results == [len(VALUE), len(VALUE)]
    finally:
        segments.close()


def test_pieces_are_filled_and_checked_as_one_object_and_bad_bytes_are_a_miss(segment):
    """A read into Parts: the segment's copy is scattered over the pieces, the checksum is
    the one of the concatenation, and a forged copy over TCP too leaves a miss."""
    nodes = {"n1": NodeContact(Endpoint("127.0.0.1", 1), host_id(), segment.name,
                               segment.token.hex())}
    segment.view(0, len(VALUE))[:] = VALUE
    segment.view(8192, len(VALUE))[:] = FORGED
    pieces = [Parts([memoryview(bytearray(n)) for n in sizes])
              for sizes in ([1, 4000, 999], [2500, 2500])]
    segments = Segments("auto")
    try:
        read = BatchRead(["good", "forged"], _reply(
            [len(VALUE), crc32c(VALUE), [["n1", "dram", 0]]],
            [len(VALUE), crc32c(VALUE), [["n1", "dram", 8192]]], nodes=nodes),
            list(pieces), segments, NodeHealth(), ReadStats())
        read.copy_from_segments(0.0, lambda: 0.0)
        assert read.results == [len(VALUE), MISSING]
        assert b"".join(bytes(v) for v in pieces[0].views) == VALUE
        assert read.tcp_requests() == {"n1": [1]}
        for view, at in zip(pieces[1].views, (0, 2500)):
            view[:] = FORGED[at:at + view.nbytes]
        assert read.received(1, len(VALUE)) is False
        assert not read.pending and read.results == [len(VALUE), MISSING]
        assert read.stats.checksum_failures == 2
    finally:
        segments.close()


def test_gets_are_split_below_the_budget_in_order():
    assert split_by_bytes([3, 3, 3], None) == [[0, 1, 2]]
    assert split_by_bytes([3, 3, 3], 9) == [[0, 1, 2]]
    assert split_by_bytes([3, 3, 3], 6) == [[0, 1], [2]]
    assert split_by_bytes([10, 1, 1], 5) == [[0], [1, 2]]  # too big alone: alone
    assert split_by_bytes([0, 0, 7], 5) == [[0, 1], [2]]
    assert split_by_bytes([], 5) == [[]]
