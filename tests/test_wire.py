"""Frames: the sans-IO codec fed by hand (any split of the byte stream), the blocking
shell over real socket pairs, payloads received into caller buffers, and hostile input."""

from __future__ import annotations

import random
import socket
import struct
import threading

import msgpack
import pytest

from kvstored.wire import (
    MAGIC,
    MAX_HEADER,
    MAX_PIECES,
    PREFIX,
    READ_AHEAD,
    ConnectionClosed,
    FrameDecoder,
    FrameError,
    FrameReader,
    Outgoing,
    pack_header,
    parse_prefix,
    send_frame,
    unpack_header,
)


def _feed(decoder: FrameDecoder, stream: bytearray, rng: random.Random) -> None:
    """Run the decoder's current read from ``stream``, in chunks of random sizes (what a
    socket may hand over), consuming what it takes."""
    while (room := decoder.room()) is not None:
        n = min(len(room), len(stream), rng.randint(1, 9000))
        assert n, "the decoder wants more than the stream holds"
        room[:n] = stream[:n]
        del stream[:n]
        decoder.received(n)


@pytest.mark.parametrize("seed", range(5))
def test_the_decoder_reads_the_same_frames_however_the_stream_is_cut(seed):
    rng = random.Random(seed)
    print("seed", seed)
    frames = [({"n": 1}, b""), ({"n": 2, "pad": "x" * (READ_AHEAD + 10)}, b"tail"),
              ({"n": 3}, bytes(range(256)) * 700), ({"n": 4}, b"skipped" * 3000),
              ({"n": 5}, b"")]
    stream = bytearray()
    for header, payload in frames:
        stream += pack_header(header, len(payload)) + payload
    decoder = FrameDecoder(read_ahead=4096)
    for header, payload in frames:
        decoder.read_header()
        _feed(decoder, stream, rng)
        assert decoder.header() == header and decoder.payload_left == len(payload)
        if header["n"] == 4:
            decoder.skip_payload()
            _feed(decoder, stream, rng)
        elif payload:
            first = memoryview(bytearray(len(payload) // 3))
            rest = memoryview(bytearray(len(payload) - len(first)))
            for view in (first, rest):
                decoder.read_payload(view)
                _feed(decoder, stream, rng)
            assert bytes(first) + bytes(rest) == payload
        assert decoder.payload_left == 0
    assert not stream


def test_the_decoder_tells_a_close_between_frames_from_one_inside_a_frame():
    decoder = FrameDecoder()
    decoder.read_header()
    assert decoder.room() is not None
    with pytest.raises(ConnectionClosed, match="between frames"):
        decoder.received(0)
    decoder = FrameDecoder()
    decoder.read_header()
    frame = pack_header({"op": "x"})
    room = decoder.room()
    assert room is not None
    room[:5] = frame[:5]
    decoder.received(5)
    assert decoder.room() is not None
    with pytest.raises(ConnectionClosed, match="mid-frame"):
        decoder.received(0)


def test_a_payload_read_larger_than_what_is_left_is_refused_and_the_next_header_waits():
    decoder = FrameDecoder()
    decoder.read_header()
    frame = pack_header({"op": "x"}, 3) + b"abc"
    room = decoder.room()
    assert room is not None
    room[:len(frame)] = frame
    decoder.received(len(frame))
    assert decoder.room() is None and decoder.payload_left == 3
    with pytest.raises(FrameError, match="payload is 3 bytes, 4 wanted"):
        decoder.read_payload(memoryview(bytearray(4)))
    with pytest.raises(FrameError, match="unread"):
        decoder.read_header()


def test_outgoing_plans_partial_sends_and_never_more_than_max_pieces_at_once():
    payload = [bytes([i % 256]) * (i % 7 + 1) for i in range(2 * MAX_PIECES)]
    out = Outgoing({"op": "put"}, payload)
    sent = bytearray()
    rng = random.Random(3)
    while pieces := out.pieces():
        assert len(pieces) <= MAX_PIECES
        n = min(rng.randint(1, 5000), sum(p.nbytes for p in pieces))
        joined = b"".join(bytes(p) for p in pieces)
        sent += joined[:n]
        out.sent(n)
    expected = pack_header({"op": "put"}, sum(map(len, payload))) + b"".join(payload)
    assert bytes(sent) == expected


# -- the blocking shell ------------------------------------------------------------------------

def test_frame_round_trip_with_payload_into_a_caller_buffer():
    a, b = socket.socketpair()
    with a, b:
        values = [b"x" * 100, bytearray(b"y" * 5000), memoryview(b"z" * 7)]
        send_frame(a, {"op": "put", "keys": ["k1", "k2", "k3"], "sizes": [100, 5000, 7]},
                   values)
        reader = FrameReader(b)
        header = reader.recv_header()
        assert header["op"] == "put" and reader.payload_left == 5107
        dest = bytearray(5107)
        reader.recv_payload_into(memoryview(dest))
        assert bytes(dest) == b"x" * 100 + b"y" * 5000 + b"z" * 7


def test_frame_reader_handles_frames_arriving_together_and_payloads_past_its_buffer():
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
    a, b = socket.socketpair()
    with a, b:
        send_frame(a, {"n": 1}, [b"ignored" * 1000])
        send_frame(a, {"n": 2})
        reader = FrameReader(b)
        assert reader.recv_header()["n"] == 1
        assert reader.recv_header()["n"] == 2  # the first payload was discarded


def test_a_spinning_reader_takes_a_header_that_lands_during_or_after_its_spin():
    """``spin`` polls without blocking for a while, then blocks as before; either way
    the frame is read whole and the socket keeps its timeout."""
    a, b = socket.socketpair()
    with a, b:
        b.settimeout(7.0)
        reader = FrameReader(b, spin=60.0)  # longer than the sender below ever takes
        sender = threading.Thread(target=send_frame, args=(a, {"n": 1}, [b"v" * 3000]))
        sender.start()
        assert reader.recv_header()["n"] == 1  # landed while it spun
        sender.join()
        dest = bytearray(3000)
        reader.recv_payload_into(memoryview(dest))
        assert dest == b"v" * 3000 and b.gettimeout() == 7.0
        reader.spin = 1e-6  # over before the frame is sent: the reader blocks for it
        late = threading.Timer(0.05, send_frame, args=(a, {"n": 2}))
        late.start()
        assert reader.recv_header()["n"] == 2 and b.gettimeout() == 7.0
        late.join()
        a.sendall(pack_header({"n": 3})[:5])  # a header cut short, then the peer leaves
        a.shutdown(socket.SHUT_WR)
        with pytest.raises(ConnectionClosed):
            reader.recv_header()
        assert b.gettimeout() == 7.0


def test_a_peer_closing_mid_frame_is_reported():
    a, b = socket.socketpair()
    with b:
        a.sendall(pack_header({"op": "x"}, payload_len=0)[:10])
        a.close()
        with pytest.raises(ConnectionClosed):
            FrameReader(b).recv_header()


@pytest.mark.parametrize("length", range(PREFIX.size))
def test_a_prefix_truncated_anywhere_is_a_closed_connection(length):
    a, b = socket.socketpair()
    with b:
        a.sendall(pack_header({"op": "x"})[:length])
        a.close()
        with pytest.raises(ConnectionClosed):
            FrameReader(b).recv_header()


def test_a_header_larger_than_the_read_ahead_arrives_whole():
    a, b = socket.socketpair()
    with a, b:
        header = {"pad": "y" * (2 * READ_AHEAD)}
        threading.Thread(target=send_frame, args=(a, header)).start()
        assert FrameReader(b).recv_header() == header


def test_read_ahead_grows_without_losing_what_it_holds():
    decoder = FrameDecoder(read_ahead=8)
    decoder.read_header()
    frame = pack_header({"a": 1})
    room = decoder.room()
    assert room is not None and len(room) == 8
    room[:8] = frame[:8]
    decoder.received(8)
    decoder.grow(64)
    assert decoder.read_ahead == 64 and decoder.buffered == 8
    room = decoder.room()
    assert room is not None and len(room) == 56
    room[:len(frame) - 8] = frame[8:]
    decoder.received(len(frame) - 8)
    assert decoder.room() is None and decoder.header() == {"a": 1}
    decoder.grow(16)  # never shrinks
    assert decoder.read_ahead == 64


# -- the 16-byte prefix and the header, at their edges ---------------------------------------

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


def test_bin_values_stay_bytes():
    header = unpack_header(pack_header({"blob": b"\x00\xff"})[PREFIX.size:])
    assert header["blob"] == b"\x00\xff"
    assert struct.calcsize("<4sIQ") == PREFIX.size == 16


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
