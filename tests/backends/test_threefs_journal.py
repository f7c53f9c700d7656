"""The ``3fs`` journal format and the index replayed from it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstored.backends.threefs.index import NodeIndex
from kvstored.backends.threefs.journal import (
    ENTRY_SIZE,
    HEADER_SIZE,
    Entry,
    Header,
    JournalFormatError,
    JournalWriter,
    Kind,
    decode_header,
    entry_size,
    parse,
    read_file,
)
from kvstored.backends.threefs.layout import check_name, shard_name, shard_number
from kvstored.sdk.errors import InvalidRequestError

keys = st.text(min_size=1, max_size=40).filter(lambda k: len(k.encode()) <= 1024)
puts = st.builds(lambda k, s, o, n: Entry(Kind.PUT, k, s, 0, o, n, 123, 456),
                 keys, st.integers(1, 99), st.integers(0, 2**40), st.integers(0, 2**30))
deletes = st.builds(lambda k: Entry(Kind.DELETE, k), keys)
shards = st.builds(lambda kind, s: Entry(kind, shard=s),
                   st.sampled_from([Kind.SHARD_OPEN, Kind.SHARD_DROP]), st.integers(1, 99))
entries = st.lists(st.one_of(puts, deletes, shards), max_size=30)


def _numbered(items: list[Entry]) -> list[Entry]:
    return [Entry(e.kind, e.key, e.shard, n + 1, e.offset, e.value_len, e.write_ns,
                  e.value_crc) for n, e in enumerate(items)]


@settings(max_examples=200, deadline=None)
@given(entries)
def test_entries_round_trip(items):
    items = _numbered(items)
    data = b"".join(e.encode() for e in items)
    parsed = parse(data)
    assert parsed.entries == items
    assert parsed.end == HEADER_SIZE + len(data) and not parsed.damaged
    assert [len(e.encode()) for e in items] == [entry_size(e.key) for e in items]


@settings(max_examples=100, deadline=None)
@given(entries, st.data())
def test_a_cut_anywhere_leaves_a_prefix(items, data):
    """A journal cut at any byte (a torn append) parses to whole entries, a prefix."""
    items = _numbered(items)
    encoded = [e.encode() for e in items]
    blob = b"".join(encoded)
    cut = data.draw(st.integers(0, len(blob)))
    parsed = parse(blob[:cut])
    assert parsed.entries == items[:len(parsed.entries)]
    assert parsed.end - HEADER_SIZE == sum(len(x) for x in encoded[:len(parsed.entries)])
    assert not parsed.damaged


def test_damage_is_skipped_and_reported():
    items = _numbered([Entry(Kind.PUT, f"k{n}", 1, 0, n * 4096, 10, 1, 2) for n in range(5)])
    encoded = [e.encode() for e in items]
    blob = bytearray(b"".join(encoded))
    start = len(encoded[0]) + len(encoded[1])
    blob[start + 20] ^= 0xFF  # inside entry 2
    parsed = parse(bytes(blob))
    assert [e.key for e in parsed.entries] == ["k0", "k1", "k3", "k4"]
    assert parsed.damaged == [(HEADER_SIZE + start, HEADER_SIZE + start + len(encoded[2]))]
    assert parsed.end == HEADER_SIZE + len(blob)


def test_header_checks():
    header = Header(generation=7, seq_floor=100, shard_floor=3)
    assert decode_header(header.encode()) == header
    raw = bytearray(header.encode())
    raw[10] ^= 1
    with pytest.raises(JournalFormatError, match="checksum"):
        decode_header(bytes(raw))
    with pytest.raises(JournalFormatError, match="magic"):
        decode_header(b"XXXX" + header.encode()[4:])
    with pytest.raises(JournalFormatError, match="truncated"):
        decode_header(header.encode()[:10])


def test_a_newer_version_is_refused_by_name():
    import struct

    from crc32c import crc32c

    body = struct.pack("<4sHHQQI", b"KV3J", 2, 0, 1, 0, 0)
    with pytest.raises(JournalFormatError, match=r"version 2.*upgrade kvstored"):
        decode_header(body + struct.pack("<I", crc32c(body)))


def test_writer_appends_rewrites_and_reads_back(tmp_path):
    path = tmp_path / "journal.kvj"
    writer = JournalWriter.create(path, Header(1, 0, 0))
    first = [Entry(Kind.SHARD_OPEN, shard=1, seq=1), Entry(Kind.PUT, "k", 1, 2, 0, 5, 9, 9)]
    writer.append(first)
    assert writer.size == HEADER_SIZE + 2 * ENTRY_SIZE + 1
    header, base, data = read_file(path)
    assert header.generation == 1 and parse(data, base).entries == first
    writer.rewrite(Header(2, 2, 1), first[1:])
    header, base, data = read_file(path)
    assert header == Header(2, 2, 1) and parse(data, base).entries == first[1:]
    writer.append([Entry(Kind.DELETE, "k", seq=3)])
    _, base, data = read_file(path, HEADER_SIZE + ENTRY_SIZE + 1)
    assert parse(data, base).entries == [Entry(Kind.DELETE, "k", seq=3)]
    writer.close()


def test_index_replay_semantics(tmp_path):
    index = NodeIndex(tmp_path)
    index.apply(Entry(Kind.SHARD_OPEN, shard=1, seq=1))
    index.apply(Entry(Kind.PUT, "a", 1, 2, 0, 10, 0, 0))
    index.apply(Entry(Kind.PUT, "b", 1, 3, 8192, 20, 0, 0))
    index.apply(Entry(Kind.DELETE, "a", seq=4))
    assert set(index.objects) == {"b"} and index.objects.logical_bytes == 20
    index.apply(Entry(Kind.PUT, "a", 1, 5, 16384, 30, 0, 0))  # re-put after the delete
    index.apply(Entry(Kind.DELETE, "a", seq=1))  # an older delete does not undo it
    assert index.objects["a"].size == 30
    assert index.key_meta == entry_size("a") + entry_size("b")
    index.apply(Entry(Kind.SHARD_OPEN, shard=2, seq=6))
    index.apply(Entry(Kind.PUT, "c", 2, 7, 0, 1, 0, 0))
    dropped = index.apply(Entry(Kind.SHARD_DROP, shard=1, seq=8))
    assert dropped == ["a", "b"] and set(index.objects) == {"c"}
    index.apply(Entry(Kind.PUT, "late", 1, 9, 0, 1, 0, 0))  # a put into a dropped shard
    assert "late" not in index.objects
    replayed = NodeIndex(tmp_path)
    for entry in index.live_entries():
        replayed.apply(entry)
    assert replayed.objects.items() == index.objects.items()
    assert set(replayed.shards) == set(index.shards)


def test_names():
    assert shard_number(shard_name(42)) == 42
    assert shard_number("shard-x.dat") is None and shard_number("journal.kvj") is None
    assert check_name("node_id", "gpu-node-07.dc1") == "gpu-node-07.dc1"
    for bad in ("", ".", "..", "a/b", "-x", "ü"):
        with pytest.raises(InvalidRequestError):
            check_name("node_id", bad)
