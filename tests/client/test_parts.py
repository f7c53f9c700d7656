"""Scatter/gather objects against one real store, in both shells: an object put from a
list of pieces is the pieces concatenated, and a get lands it in a list of pieces with
other boundaries, over TCP and through the node's shared-memory segment; pieces that
cannot hold the object, or are not writable buffers, are refused before any byte lands;
and a copy that fails the checksum is a miss, never a hit with bad bytes."""

from __future__ import annotations

import os

import numpy as np
import pytest
import trio

import kvstored
import kvstored.aio
from kvstored.client import core, read
from kvstored.client.parts import checksum
from kvstored.errors import BadRequestError
from kvstored.wire import Parts
from tests.daemon.conftest import embedded, spawn  # noqa: F401 - fixtures

KiB = 1 << 10
#: A page in three pieces of sizes that cross no natural boundary.
SIZES = [3 * KiB + 7, 1, 200 * KiB + 13]


def _pieces(data: bytes, sizes: list[int]) -> list[np.ndarray]:
    """``data`` cut into numpy arrays of ``sizes`` (engine memory stands in here)."""
    out, at = [], 0
    for size in sizes:
        out.append(np.frombuffer(bytearray(data[at:at + size]), dtype=np.uint8))
        at += size
    assert at == len(data)
    return out


def _empty(sizes: list[int]) -> list[np.ndarray]:
    return [np.zeros(size, dtype=np.uint8) for size in sizes]


def _joined(pieces: list[np.ndarray]) -> bytes:
    return b"".join(p.tobytes() for p in pieces)


def test_parts_carry_a_bare_byte_range_per_piece():
    parts = Parts([memoryview(bytearray(3)), memoryview(bytearray(0)),
                   memoryview(bytearray(5))])
    assert len(parts) == 8
    assert [v.nbytes for v in parts.head(5)] == [3, 2]  # the empty piece is left out
    assert [v.nbytes for v in parts.head(8)] == [3, 5]
    assert parts.head(0) == []


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_pieces_round_trip_in_both_shells(embedded, transport):  # noqa: F811
    up = embedded()
    data = os.urandom(sum(SIZES))
    other = os.urandom(5000)
    with kvstored.connect(up.addr, transport=transport) as c:
        assert c.batch_put_parts(["sync/a", "sync/empty", "sync/b"],
                                 [_pieces(data, SIZES), [], [memoryview(other)]]) \
            == [True, True, True]
        assert c.put_parts("sync/a", _pieces(data, SIZES)) is False  # written once
        assert c.get("sync/a") == data  # the object is its pieces, in order
        assert c.get("sync/empty") == b""
        into = _empty([10, 0, len(data) - 10])  # other boundaries than the put's
        tiers: list = []
        assert c.batch_get_into_parts(["sync/a", "sync/none", "sync/b"],
                                      [into, _empty([4]), _empty([4000, 1000])],
                                      tiers=tiers) == [len(data), -1, len(other)]
        assert _joined(into) == data
        assert tiers[1] is None and tiers[0] is not None
        roomy = _empty([7, 6000])  # more room than the object: its start is filled
        assert c.get_into_parts("sync/b", roomy) == len(other)
        assert _joined(roomy)[:len(other)] == other
        assert bytes(roomy[1][len(other) - 7:]) == bytes(6000 - len(other) + 7)
        c.put("sync/plain", data)  # a plain object reads into pieces, and back
        assert c.get_into_parts("sync/plain", into) == len(data) and _joined(into) == data
        assert c.stats.checksum_failures == 0
        if transport == "shm":
            assert c.segments.mapping(*next(iter(c.nodes.items()))) is not None

    async def trio_side() -> tuple[list[bool], bytes | None, int, bytes]:
        async with kvstored.aio.connect(up.addr, transport=transport) as c:
            stored = await c.batch_put_parts(["trio/a"], [_pieces(data, SIZES)])
            plain = await c.get("trio/a")
            into = _empty([len(data) - 1, 1])
            n = await c.get_into_parts("sync/a", into)
            return stored, plain, n, _joined(into)

    assert trio.run(trio_side) == ([True], data, len(data), data)


def test_pieces_that_cannot_take_the_object_are_refused_before_any_byte(embedded):  # noqa: F811
    up = embedded()
    data = os.urandom(9000)
    with kvstored.connect(up.addr) as c:
        c.put_parts("k", _pieces(data, [4000, 5000]))
        short = _empty([4000, 4999])
        with pytest.raises(BadRequestError, match="pieces hold 8999 bytes but the object is "
                                                  "9000") as caught:
            c.batch_get_into_parts(["k"], [short])
        assert caught.value.key == "k"
        assert not any(p.any() for p in short)  # refused before a byte landed
        with pytest.raises(BadRequestError, match="2 keys but 1 lists of pieces"):
            c.batch_put_parts(["x", "y"], [[b"x"]])
        with pytest.raises(BadRequestError, match="1 keys but 2 lists of pieces"):
            c.batch_get_into_parts(["k"], [[bytearray(1)], [bytearray(1)]])
        with pytest.raises(BadRequestError, match="piece 1 is a int, not a buffer"):
            c.put_parts("x", [b"a", 3])
        with pytest.raises(BadRequestError, match="not one buffer"):
            c.put_parts("x", b"abc")
        with pytest.raises(BadRequestError, match="piece 0 is read-only"):
            c.get_into_parts("k", [bytes(9000)])
        with pytest.raises(BadRequestError, match="piece 1 is not contiguous"):
            c.get_into_parts("k", [bytearray(10), np.zeros(20000, dtype=np.uint8)[::2]])
        assert c.get("x") is None  # nothing of a refused put was stored


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_a_copy_that_fails_the_checksum_is_a_miss_in_the_pieces(embedded, transport):  # noqa: F811
    """The node's only DRAM copy is damaged in place (through this host's mapping of its
    segment); a read of it into pieces reports a miss, whichever way it comes."""
    up = embedded()
    data = os.urandom(64 * KiB)
    with kvstored.connect(up.addr, transport="auto") as c:
        c.put_parts("bad", _pieces(data, [KiB, 63 * KiB]))
        (node, where), = c.locate("bad").items()
        mapping = c.segments.mapping(node, c.nodes[node])
        assert mapping is not None
        dram = where["dram"]
        copy = mapping.view(dram["offset"], dram["size"])
        copy[100:104] = bytes(b ^ 0xFF for b in copy[100:104])  # never the bytes it held
    with kvstored.connect(up.addr, transport=transport) as c:
        into = _empty([KiB, 63 * KiB])
        assert c.get_into_parts("bad", into) == -1
        assert c.stats.checksum_failures == 1


def test_tcp_reads_are_checked_with_the_crc_the_shell_took_as_they_landed(
        embedded, monkeypatch):  # noqa: F811
    """Over TCP the shells (blocking and trio) take each object's CRC-32C as it lands, in
    pieces too, and the core checks that: it computes none itself, on the lookup path and
    on the one-trip path alike, and the bytes are right."""
    up = embedded()
    data = os.urandom(300_000)
    computed = []

    def counted(value, size=None):
        computed.append(size)
        return checksum(value, size)

    with kvstored.connect(up.addr, transport="tcp") as c:
        assert c.put("crc/a", data)
        with kvstored.connect(up.addr, transport="tcp") as stranger:  # no held location
            monkeypatch.setattr(core, "checksum", counted)
            monkeypatch.setattr(read, "checksum", counted)
            assert stranger.get("crc/a") == data  # lookup, then get
            assert stranger.get("crc/a") == data  # get_held
            into = _empty([1000, len(data) - 1000])
            assert stranger.get_into_parts("crc/a", into) == len(data)
            assert _joined(into) == data

    async def trio_side() -> bytes | None:
        async with kvstored.aio.connect(up.addr, transport="tcp") as t:
            return await t.get("crc/a")

    assert trio.run(trio_side) == data
    assert computed == []
