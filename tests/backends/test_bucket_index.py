"""The bucket index file format (backends/bucket/index.py, docs/format.md "bucket")."""

from __future__ import annotations

import struct

import pytest
from crc32c import crc32c
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvstored.backends.bucket import index
from kvstored.backends.bucket.index import (
    FLAG_DELETED,
    FLAG_QUARANTINED,
    INDEX_VERSION,
    IndexEntry,
    decode_entries,
    decode_index_header,
    encode_index,
    read_index,
    write_indexes,
)
from kvstored.backends.bucket.layout import list_buckets
from kvstored.sdk.errors import CorruptionError
from kvstored.sdk.record import record_size


@pytest.fixture(autouse=True, params=["python", "numpy"])
def checker(request, monkeypatch):
    """Every decoding test runs on both ways of checking entries (few and many)."""
    monkeypatch.setattr(index, "_SMALL_INDEX", 10**9 if request.param == "python" else -1)
    return request.param


def _entries(sizes: list[int], keys: list[str] | None = None) -> list[IndexEntry]:
    out, offset = [], 0
    for n, size in enumerate(sizes):
        key = keys[n] if keys else f"key/{n}"
        out.append(IndexEntry(key, offset, size, 100 + n, 1_700_000_000_000_000_000 + n,
                              0xDEADBEEF ^ n, FLAG_DELETED if n == 1 else 0))
        offset += record_size(size)
    return out


def _data_len(entries: list[IndexEntry]) -> int:
    return sum(record_size(e.value_len) for e in entries)


def _decode(data: bytes) -> list[IndexEntry]:
    header = decode_index_header(data, path="test.idx")
    return list(decode_entries(data, header, path="test.idx"))


def test_layout_matches_the_documented_bytes():
    """The bytes are exactly the table in docs/format.md, read here with plain struct."""
    entries = _entries([5, 0], keys=["ab", "é"])
    data = encode_index(7, _data_len(entries), 42, entries)
    assert data[:4] == b"KVSI"
    version, entry_size, bucket_id, data_len, count, keys_len, created = struct.unpack_from(
        "<HHQQIIQ", data, 4)
    assert (version, entry_size, bucket_id, count, created) == (1, 40, 7, 2, 42)
    assert data_len == record_size(5) + record_size(0) == 3 * 4096
    assert keys_len == 2 + 2
    first = struct.unpack_from("<QQQQIHH", data, 40)
    assert first == (0, 5, 100, entries[0].write_ns, entries[0].value_crc, 2, 0)
    second = struct.unpack_from("<QQQQIHH", data, 80)
    assert second[0] == record_size(5) and second[5:] == (2, FLAG_DELETED)
    assert data[120:124] == b"ab" + "é".encode()
    assert len(data) == 124 + 4
    assert struct.unpack_from("<I", data, 124)[0] == crc32c(data[:124])


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(0, 3 * 4096 + 1),
                          st.text(min_size=1, max_size=40),
                          st.sampled_from([0, FLAG_DELETED, FLAG_QUARANTINED])),
                min_size=0, max_size=30, unique_by=lambda t: t[1]))
def test_roundtrip(rows):
    entries, offset = [], 0
    for n, (size, key, flags) in enumerate(rows):
        entries.append(IndexEntry(key, offset, size, n, n * 7, n * 13 & 0xFFFFFFFF, flags))
        offset += record_size(size)
    data = encode_index(3, offset + 8192, 99, entries)
    header = decode_index_header(data, path="x")
    assert (header.bucket_id, header.count, header.created_ns) == (3, len(entries), 99)
    assert list(decode_entries(data, header, path="x")) == entries


def test_every_flipped_byte_is_refused():
    data = encode_index(1, _data_len(_entries([10, 20000, 3])), 5, _entries([10, 20000, 3]))
    for position in range(len(data)):
        damaged = bytearray(data)
        damaged[position] ^= 0x01
        with pytest.raises(CorruptionError):
            _decode(bytes(damaged))


def test_truncated_and_extended_files_are_refused():
    data = encode_index(1, 4096, 5, _entries([0]))
    for cut in (0, 10, 43, len(data) - 1):
        with pytest.raises(CorruptionError, match=r"truncated|header says"):
            _decode(data[:cut])
    with pytest.raises(CorruptionError, match="header says"):
        _decode(data + b"\0")


def test_unknown_version_names_itself():
    data = bytearray(encode_index(1, 4096, 5, _entries([0])))
    struct.pack_into("<H", data, 4, INDEX_VERSION + 1)
    struct.pack_into("<I", data, len(data) - 4, crc32c(bytes(data[:-4])))
    with pytest.raises(CorruptionError, match=f"version {INDEX_VERSION + 1}.*upgrade"):
        _decode(bytes(data))


@pytest.mark.parametrize("bad", ["overlap", "misaligned", "past_end", "wraps"])
def test_impossible_entries_are_refused_despite_a_good_crc(bad):
    """A writer bug must not make the backend read outside the records."""
    entries = _entries([5000, 10])
    data_len = _data_len(entries)
    if bad == "overlap":
        entries[1] = entries[1]._replace(record_offset=4096)
    elif bad == "misaligned":
        entries[1] = entries[1]._replace(record_offset=entries[1].record_offset + 8)
    elif bad == "past_end":
        data_len -= 4096
    else:  # offset + record length overflows 64 bits back into range
        entries[1] = entries[1]._replace(record_offset=2**64 - 4096)
    with pytest.raises(CorruptionError, match="does not fit"):
        _decode(encode_index(1, data_len, 0, entries))


def test_write_indexes_is_atomic_and_leaves_no_temporary(tmp_path):
    first = encode_index(1, 4096, 1, _entries([0]))
    write_indexes(str(tmp_path), [(".0000000000000001.idx.tmp", "0000000000000001.idx",
                                   first)])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["0000000000000001.idx"]
    header, entries = read_index(str(tmp_path / "0000000000000001.idx"))
    assert header.bucket_id == 1 and entries == _entries([0])


def test_listing_sorts_files_by_kind(tmp_path):
    for name in ["0000000000000001.data", "0000000000000001.idx", ".0000000000000002.idx.tmp",
                 "000000000000000a.data", "notes.txt", "0000000000000003.idx.tmp",
                 ".0000000000000004.data.tmp", "00000000000000zz.idx"]:
        (tmp_path / name).write_bytes(b"")
    listing = list_buckets(str(tmp_path))
    assert sorted(listing.data) == [1, 10]
    assert sorted(listing.index) == [1]
    assert [i for i, _ in listing.tmp] == [2]
    assert sorted(e.name for e in listing.unknown) == [
        ".0000000000000004.data.tmp", "0000000000000003.idx.tmp", "00000000000000zz.idx",
        "notes.txt"]
    assert listing.highest_id == 10
