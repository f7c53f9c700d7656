"""The offset layout's on-disk structures: byte positions as docs/format.md gives them,
round trips, and refusal of anything damaged or foreign."""

from __future__ import annotations

import dataclasses
import struct

import pytest
from crc32c import crc32c
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstored.backends.offset.layout import (
    JOURNAL_HEADER_SIZE,
    MAX_JOURNAL_ENTRY,
    SLOT_HEADER_SIZE,
    Geometry,
    decode_journal_entry,
    decode_slot_header,
    encode_checkpoint,
    encode_journal,
    journal_blocks,
    pack_entry,
    tombstone_bytes,
)
from kvstored.backends.offset.recovery import _parse_entries
from kvstored.sdk.errors import CorruptionError, InvalidRequestError
from kvstored.sdk.record import ALIGN, FLAG_TOMBSTONE

GiB, MiB = 1 << 30, 1 << 20


def test_geometry_defaults_scale_with_the_volume():
    small = Geometry.plan(4 * MiB)
    assert (small.slot_size, small.journal_size) == (64 << 10, 64 << 10)
    big = Geometry.plan(16 * GiB)
    assert (big.slot_size, big.journal_size) == (64 * MiB, 16 * MiB)
    assert big.data_offset == 4096 + 2 * big.slot_size + big.journal_size
    assert big.data_size == 16 * GiB - big.data_offset
    assert Geometry.plan(1 * GiB, index_bytes=10_000).slot_size == 12288


def test_geometry_refuses_tiny_volumes():
    with pytest.raises(InvalidRequestError, match="too small"):
        Geometry.plan(512 << 10)


def test_superblock_fields_sit_where_the_docs_say():
    geometry = Geometry.plan(64 * MiB)
    block = geometry.encode()
    assert len(block) == ALIGN and block[0:8] == b"KVSOFFVL"
    (version, flags, volume_size, slot_size, slot_a, slot_b, journal_offset, journal_size,
     data_offset) = struct.unpack_from("<IIQQQQQQQ", block, 8)
    assert (version, flags) == (1, 0)
    assert (volume_size, slot_size, journal_size) == (64 * MiB, geometry.slot_size,
                                                      geometry.journal_size)
    assert (slot_a, slot_b) == geometry.slot_offsets == (4096, 4096 + geometry.slot_size)
    assert (journal_offset, data_offset) == (geometry.journal_offset, geometry.data_offset)
    assert block[72:88] == geometry.uuid
    assert struct.unpack_from("<Q", block, 88)[0] == geometry.created_ns
    assert struct.unpack_from("<I", block, 96)[0] == crc32c(bytes(block[:96]))
    assert not any(block[100:])
    assert Geometry.decode(block, path="v") == geometry


@pytest.mark.parametrize("offset", [0, 9, 30, 72, 97])
def test_superblock_damage_is_detected(offset):
    block = Geometry.plan(64 * MiB).encode()
    block[offset] ^= 0x40
    with pytest.raises(CorruptionError):
        Geometry.decode(block, path="v")


def test_checkpoint_round_trip_and_byte_positions():
    geometry = Geometry.plan(64 * MiB)
    entries = [pack_entry(geometry.data_offset + i * 8192, 100 + i, 7 + i, 123, 0xABC, k)
               for i, k in enumerate([b"a", "ключ".encode(), b"x" * 1024])]
    image = encode_checkpoint(geometry, 5, 42, entries)
    assert len(image) % ALIGN == 0
    assert image[:4] == b"KVSC"
    header = decode_slot_header(image, geometry)
    assert (header.generation, header.seq, header.entries) == (5, 42, 3)
    payload = image[SLOT_HEADER_SIZE:SLOT_HEADER_SIZE + header.payload_len]
    assert payload == b"".join(entries)
    assert struct.unpack_from("<QQQQIH", payload, 0) == (geometry.data_offset, 100, 7, 123,
                                                         0xABC, 1)
    parsed = _parse_entries(payload, 3, geometry)
    assert list(parsed) == ["a", "ключ", "x" * 1024]
    assert parsed["ключ"].offset == geometry.data_offset + 8192


def test_checkpoint_of_another_volume_or_damaged_is_ignored():
    geometry = Geometry.plan(64 * MiB)
    image = bytearray(encode_checkpoint(geometry, 1, 0, []))
    other = dataclasses.replace(geometry, uuid=bytes(16))
    assert decode_slot_header(image, other) is None
    image[30] ^= 1
    assert decode_slot_header(image, geometry) is None


def test_checkpoint_larger_than_its_slot_is_refused():
    geometry = Geometry.plan(4 * MiB)
    entries = [pack_entry(geometry.data_offset, 0, 1, 0, 0, b"k" * 1000)] * 80
    with pytest.raises(InvalidRequestError, match="does not fit"):
        encode_checkpoint(geometry, 1, 1, entries)


def test_out_of_bounds_checkpoint_entry_is_corrupt():
    geometry = Geometry.plan(64 * MiB)
    bad = pack_entry(geometry.volume_size, 1, 1, 0, 0, b"k")
    with pytest.raises(CorruptionError):
        _parse_entries(bad, 1, geometry)


@settings(max_examples=60, deadline=None)
@given(puts=st.lists(st.tuples(st.integers(0, 2**48).map(lambda n: n * ALIGN),
                               st.integers(0, 2**40), st.integers(0, 2**32 - 1)),
                     max_size=8_000),
       keys=st.lists(st.integers(1, 1020), max_size=150))
def test_journal_round_trip_and_block_count(puts, keys):
    geometry = Geometry.plan(64 * MiB)
    tombs = [tombstone_bytes(b"t" * n + str(i).encode(), 1000 + i) for i, n in enumerate(keys)]
    entries = encode_journal(geometry, 99, puts, tombs)
    assert sum(len(e) for e in entries) == journal_blocks(len(puts), [len(t) for t in tombs]) \
        * ALIGN
    buf = b"".join(entries)
    got_puts, got_tombs, pos = [], [], 0
    for entry in entries:
        assert len(entry) % ALIGN == 0 and len(entry) <= MAX_JOURNAL_ENTRY
        decoded = decode_journal_entry(buf, pos, geometry)
        assert decoded is not None and decoded.seq == 99
        assert decoded.nblocks * ALIGN == len(entry)
        got_puts += decoded.puts
        got_tombs += decoded.tombstones
        pos += len(entry)
    assert got_puts == puts
    assert [t.seq for t in got_tombs] == [1000 + i for i in range(len(keys))]
    assert all(t.flags == FLAG_TOMBSTONE and t.value_len == 0 for t in got_tombs)


def test_journal_entry_layout_and_rejections():
    geometry = Geometry.plan(64 * MiB)
    [entry] = encode_journal(geometry, 7, [(geometry.data_offset, 5000, 0x1234)],
                             [tombstone_bytes(b"gone", 8)])
    assert entry[:4] == b"KVSJ"
    (version, nblocks) = struct.unpack_from("<HH", entry, 4)
    assert (version, nblocks) == (1, 1) and entry[8:24] == geometry.uuid
    seq, puts, tombs, payload_len = struct.unpack_from("<QIII", entry, 24)
    assert (seq, puts, tombs, payload_len) == (7, 1, 1, 20 + 44 + 4)
    assert struct.unpack_from("<QQI", entry, JOURNAL_HEADER_SIZE) == (geometry.data_offset,
                                                                      5000, 0x1234)
    assert entry[JOURNAL_HEADER_SIZE + 20:JOURNAL_HEADER_SIZE + 24] == b"KVSR"
    buf = bytes(entry)
    assert decode_journal_entry(buf, 0, geometry).tombstones[0].key == "gone"
    other = dataclasses.replace(geometry, uuid=b"\x01" * 16)
    assert decode_journal_entry(buf, 0, other) is None  # an earlier format of the device
    damaged = bytearray(buf)
    damaged[JOURNAL_HEADER_SIZE + 3] ^= 1
    assert decode_journal_entry(bytes(damaged), 0, geometry) is None  # torn
    assert decode_journal_entry(bytes(ALIGN), 0, geometry) is None  # never written
