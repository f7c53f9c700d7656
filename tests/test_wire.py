"""Frames: round trips, payloads received into caller buffers, and hostile input."""

from __future__ import annotations

import socket
import struct
import threading

import msgpack
import pytest

from kvstored.wire import (
    MAGIC,
    MAX_HEADER,
    PREFIX,
    ConnectionClosed,
    FrameError,
    pack_header,
    parse_prefix,
    recv_exactly_into,
    recv_header,
    send_frame,
    unpack_header,
)


def test_frame_round_trip_with_payload_into_a_caller_buffer():
    a, b = socket.socketpair()
    with a, b:
        values = [b"x" * 100, bytearray(b"y" * 5000), memoryview(b"z" * 7)]
        send_frame(a, {"op": "put", "keys": ["k1", "k2", "k3"], "sizes": [100, 5000, 7]},
                   values)
        header, payload_len = recv_header(b)
        assert header["op"] == "put" and payload_len == 5107
        dest = bytearray(payload_len)
        recv_exactly_into(b, memoryview(dest))
        assert bytes(dest) == b"x" * 100 + b"y" * 5000 + b"z" * 7


def test_wrong_magic_is_a_frame_error():
    with pytest.raises(FrameError, match="magic"):
        parse_prefix(PREFIX.pack(b"HTTP", 10, 0), 1 << 20)


def test_oversized_lengths_are_refused_before_allocating():
    with pytest.raises(FrameError, match="header length"):
        parse_prefix(PREFIX.pack(MAGIC, MAX_HEADER + 1, 0), 1 << 20)
    with pytest.raises(FrameError, match="payload length"):
        parse_prefix(PREFIX.pack(MAGIC, 10, 2**40), 1 << 30)


@pytest.mark.parametrize("body", [
    b"\xc1",                                    # a reserved msgpack byte
    msgpack.packb([1, 2, 3]),                   # not a map
    msgpack.packb({1: "int key"}),              # strict_map_key
    b"\xdd\xff\xff\xff\xff",                    # an array claiming 4G elements
    b"\xdb\xff\xff\xff\xff" + b"a" * 10,        # a str claiming 4 GiB
])
def test_undecodable_headers_are_frame_errors(body):
    with pytest.raises(FrameError):
        unpack_header(body)


def test_a_peer_closing_mid_frame_is_reported():
    a, b = socket.socketpair()
    with b:
        a.sendall(pack_header({"op": "x"}, payload_len=0)[:10])
        a.close()
        with pytest.raises(ConnectionClosed):
            recv_header(b)


def test_bin_values_stay_bytes():
    header = unpack_header(pack_header({"blob": b"\x00\xff"})[PREFIX.size:])
    assert header["blob"] == b"\x00\xff"
    assert struct.calcsize("<4sIQ") == PREFIX.size == 16


def test_frame_reader_handles_frames_arriving_together_and_payloads_past_its_buffer():
    from kvstored.wire import READ_AHEAD, FrameReader

    a, b = socket.socketpair()
    with a, b:
        big = bytes(range(256)) * (3 * READ_AHEAD // 256)  # three read-aheads of payload
        send_frame(a, {"n": 1}, [b"tiny"])
        send_frame(a, {"n": 2, "pad": "x" * (READ_AHEAD + 10)})  # header > read-ahead
        threading.Thread(target=send_frame, args=(a, {"n": 3}, [big])).start()
        reader = FrameReader(b)
        assert reader.recv_header()["n"] == 1 and reader.payload_left == 4
        dest = bytearray(4)
        reader.recv_payload_into(memoryview(dest))
        assert dest == b"tiny"
        assert reader.recv_header()["n"] == 2
        assert reader.recv_header()["n"] == 3
        dest = bytearray(len(big))
        reader.recv_payload_into(memoryview(dest))
        assert dest == big and reader.payload_left == 0


def test_frame_reader_skips_an_unread_payload():
    from kvstored.wire import FrameReader

    a, b = socket.socketpair()
    with a, b:
        send_frame(a, {"n": 1}, [b"ignored" * 1000])
        send_frame(a, {"n": 2})
        reader = FrameReader(b)
        assert reader.recv_header()["n"] == 1
        assert reader.recv_header()["n"] == 2  # the first payload was discarded


def test_read_ahead_compacts_unread_bytes_to_the_front():
    from kvstored.wire import ReadAhead

    ahead = ReadAhead(8)
    room = ahead.room()
    room[:6] = b"abcdef"
    ahead.received(6)
    assert ahead.consume(4) == b"abcd" and ahead.buffered == 2
    room = ahead.room()  # "ef" moves to the front: the rest of the buffer is free
    assert len(room) == 6
    room[:3] = b"ghi"
    ahead.received(3)
    out = memoryview(bytearray(10))
    assert ahead.take(out) == 5 and bytes(out[:5]) == b"efghi"
    assert ahead.buffered == 0 and ahead.take(out) == 0


# -- the 16-byte prefix at its edges --------------------------------------------------------

def test_a_header_of_zero_bytes_is_refused():
    with pytest.raises(FrameError, match="empty header"):
        parse_prefix(PREFIX.pack(MAGIC, 0, 0), 1 << 20)


def test_the_header_limit_is_inclusive_and_the_receiver_sets_it():
    assert parse_prefix(PREFIX.pack(MAGIC, MAX_HEADER, 0), 0) == (MAX_HEADER, 0)
    with pytest.raises(FrameError, match=f"header length {MAX_HEADER + 1} exceeds"):
        parse_prefix(PREFIX.pack(MAGIC, MAX_HEADER + 1, 0), 0)
    assert parse_prefix(PREFIX.pack(MAGIC, 4096, 0), 0, max_header=4096) == (4096, 0)
    with pytest.raises(FrameError, match="header length 4097 exceeds 4096"):
        parse_prefix(PREFIX.pack(MAGIC, 4097, 0), 0, max_header=4096)
    # The largest values the prefix can carry.
    with pytest.raises(FrameError, match="header length"):
        parse_prefix(PREFIX.pack(MAGIC, 2**32 - 1, 2**64 - 1), 2**64 - 1)
    assert parse_prefix(PREFIX.pack(MAGIC, 1, 2**64 - 1), 2**64 - 1) == (1, 2**64 - 1)
    with pytest.raises(FrameError, match="payload length 1 exceeds the limit 0"):
        parse_prefix(PREFIX.pack(MAGIC, 1, 1), 0)


@pytest.mark.parametrize("length", range(PREFIX.size))
def test_a_prefix_truncated_anywhere_is_a_closed_connection(length):
    from kvstored.wire import FrameReader

    a, b = socket.socketpair()
    with b:
        a.sendall(pack_header({"op": "x"})[:length])
        a.close()
        with pytest.raises(ConnectionClosed):
            FrameReader(b).recv_header()


def test_a_header_larger_than_the_read_ahead_arrives_whole():
    from kvstored.wire import READ_AHEAD, FrameReader

    a, b = socket.socketpair()
    with a, b:
        header = {"pad": "y" * (2 * READ_AHEAD)}
        threading.Thread(target=send_frame, args=(a, header)).start()
        assert FrameReader(b).recv_header() == header


def test_read_ahead_grows_without_losing_what_it_holds():
    from kvstored.wire import ReadAhead

    ahead = ReadAhead(8)
    ahead.room()[:8] = b"01234567"
    ahead.received(8)
    assert ahead.consume(3) == b"012"
    ahead.grow(64)
    assert ahead.size == 64 and ahead.buffered == 5 and len(ahead.room()) == 59
    assert ahead.consume(5) == b"34567"
    ahead.grow(16)  # never shrinks
    assert ahead.size == 64
