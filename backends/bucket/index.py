"""The bucket index file: what one bucket's data file holds, in a form quick to load.

A bucket's index lists every record its data file holds, in file order, including the
records that were later deleted or quarantined (flagged, so that ``check`` still knows
the extent of every record). It is small, written whole and atomically (temporary file,
fsync, rename, directory fsync), and loaded whole at open. All integers are
little-endian::

    header (40 bytes)
    0   4  magic        b"KVSI"
    4   2  version      INDEX_VERSION (1)
    6   2  entry_size   ENTRY.size (40): lets a reader refuse a layout it does not know
    8   8  bucket_id    must match the file name
    16  8  data_len     bytes of the data file this index covers
    24  4  count        number of entries
    28  4  keys_len     bytes of the key blob
    32  8  created_ns   time.time_ns() when the bucket was written

    count entries (40 bytes each), in record order
    0   8  record_offset  where the record starts in the data file (a 4 KiB multiple)
    8   8  value_len
    16  8  seq            the record's sequence number (as in its header)
    24  8  write_ns
    32  4  value_crc      CRC-32C of the value (as in its header)
    36  2  key_len
    38  2  flags          bit 0 DELETED, bit 1 QUARANTINED

    keys_len bytes       the keys' UTF-8 bytes, concatenated in entry order
    4 bytes              CRC-32C of everything before it

One CRC covers the whole file: an index is read whole, so there is nothing to gain from
checking parts of it separately, and a torn or damaged index is refused as a unit.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Sequence
from itertools import accumulate, pairwise
from typing import NamedTuple

import numpy as np
from crc32c import crc32c

from kvstored.sdk.errors import CorruptionError
from kvstored.sdk.files import fsync_dir, write_atomically
from kvstored.sdk.record import ALIGN, VALUE_OFFSET
from kvstored.sdk.types import MAX_KEY_BYTES

MAGIC = b"KVSI"
INDEX_VERSION = 1
HEADER = struct.Struct("<4sHHQQIIQ")
ENTRY = struct.Struct("<QQQQIHH")
TRAILER = struct.Struct("<I")

#: The key was deleted; its record stays in the data file until the bucket goes.
FLAG_DELETED = 0x1
#: check(repair=True) copied the record to quarantine/ and dropped the key.
FLAG_QUARANTINED = 0x2
#: Either flag: the entry names no visible object.
FLAGS_GONE = FLAG_DELETED | FLAG_QUARANTINED


class IndexEntry(NamedTuple):
    key: str
    record_offset: int
    value_len: int
    seq: int
    write_ns: int
    value_crc: int
    flags: int


class IndexHeader(NamedTuple):
    bucket_id: int
    data_len: int
    count: int
    created_ns: int


def index_size(count: int, keys_len: int) -> int:
    """Bytes of an index of ``count`` entries whose keys total ``keys_len`` bytes."""
    return HEADER.size + count * ENTRY.size + keys_len + TRAILER.size


def encode_index(bucket_id: int, data_len: int, created_ns: int,
                 entries: Sequence[IndexEntry]) -> bytes:
    """The bytes of an index file for ``entries`` (in record order)."""
    keys = [entry.key.encode("utf-8") for entry in entries]
    keys_len = sum(map(len, keys))
    out = bytearray(index_size(len(entries), keys_len))
    HEADER.pack_into(out, 0, MAGIC, INDEX_VERSION, ENTRY.size, bucket_id, data_len,
                     len(entries), keys_len, created_ns)
    position = HEADER.size
    pack = ENTRY.pack_into
    for entry, key in zip(entries, keys):
        pack(out, position, entry.record_offset, entry.value_len, entry.seq, entry.write_ns,
             entry.value_crc, len(key), entry.flags)
        position += ENTRY.size
    out[position:position + keys_len] = b"".join(keys)
    position += keys_len
    TRAILER.pack_into(out, position, crc32c(memoryview(out)[:position]))
    return bytes(out)


def decode_index_header(data: bytes | memoryview, *, path: str) -> IndexHeader:
    """Check the whole file's CRC, magic, version and size; return its header."""
    if len(data) < HEADER.size + TRAILER.size:
        raise CorruptionError(f"index is truncated ({len(data)} bytes)", path=path)
    (magic, version, entry_size, bucket_id, data_len, count, keys_len,
     created_ns) = HEADER.unpack_from(data, 0)
    if magic != MAGIC:
        raise CorruptionError(f"index has bad magic {bytes(magic)!r}", path=path)
    if version != INDEX_VERSION or entry_size != ENTRY.size:
        raise CorruptionError(
            f"index has format version {version} (entry size {entry_size}); this kvstored "
            f"reads version {INDEX_VERSION}: upgrade kvstored to read it", path=path)
    if len(data) != index_size(count, keys_len):
        raise CorruptionError(f"index is {len(data)} bytes, its header says "
                              f"{index_size(count, keys_len)}", path=path)
    (stored,) = TRAILER.unpack_from(data, len(data) - TRAILER.size)
    if crc32c(memoryview(data)[:len(data) - TRAILER.size]) != stored:
        raise CorruptionError("index fails its checksum", path=path)
    return IndexHeader(bucket_id, data_len, count, created_ns)


#: Indexes of up to this many entries are checked without numpy (see decode_rows).
_SMALL_INDEX = 48
#: The entries as a numpy structured type, to check them all at once.
_ENTRY_DTYPE = np.dtype([("record_offset", "<u8"), ("value_len", "<u8"), ("seq", "<u8"),
                         ("write_ns", "<u8"), ("value_crc", "<u4"), ("key_len", "<u2"),
                         ("flags", "<u2")])
assert _ENTRY_DTYPE.itemsize == ENTRY.size


def decode_entries(data: bytes | memoryview, header: IndexHeader, *,
                   path: str) -> list[IndexEntry]:
    """The entries of an index whose header :func:`decode_index_header` accepted."""
    return list(map(IndexEntry._make, decode_rows(data, header, path=path)))


def decode_rows(data: bytes | memoryview, header: IndexHeader, *,
                path: str) -> list[tuple[str, int, int, int, int, int, int]]:
    """The entries as plain tuples in :class:`IndexEntry` order: what opening a store
    uses, since it builds its own objects from them.

    Raises :class:`CorruptionError` on an entry that cannot be right even though the
    CRC matched (a writer bug, or a file crafted by hand): a misaligned or overlapping
    record, a record past ``data_len``, an impossible key.

    Opening a store decodes every entry of every index. A large index is checked
    vectorised (numpy: about 0.5 µs an entry, but some 40 µs a call); a small one, as
    a trickle of writes makes them, entry by entry in Python.
    """
    view = memoryview(data)
    entries_end = HEADER.size + header.count * ENTRY.size
    if header.count <= _SMALL_INDEX:
        return _small_rows(view, header, entries_end, path)
    table = np.frombuffer(view, _ENTRY_DTYPE, header.count, HEADER.size)
    offsets, lengths = table["record_offset"], table["key_len"]
    ends = offsets + VALUE_OFFSET + ((table["value_len"] + (ALIGN - 1)) & ~np.uint64(ALIGN - 1))
    # Offsets and lengths past data_len are refused first, so that the sums above
    # cannot have wrapped around without being caught.
    misfit = ((offsets % ALIGN != 0) | (ends > header.data_len)
              | (offsets > header.data_len) | (table["value_len"] > header.data_len))
    misfit[1:] |= offsets[1:] < ends[:-1]
    if misfit.any():
        n = int(misfit.argmax())
        raise CorruptionError(f"index entry at record offset {int(offsets[n])} (value of "
                              f"{int(table['value_len'][n])} bytes) does not fit the data "
                              f"file's {header.data_len} bytes in order", path=path)
    bad_key = (lengths == 0) | (lengths > MAX_KEY_BYTES)
    if bad_key.any():
        n = int(bad_key.argmax())
        raise CorruptionError(f"index entry at record offset {int(offsets[n])} has an "
                              f"impossible key length {int(lengths[n])}", path=path)
    if entries_end + int(lengths.sum()) != len(data) - TRAILER.size:
        raise CorruptionError("index key lengths do not add up to its key blob", path=path)
    blob = bytes(view[entries_end:len(data) - TRAILER.size])
    bounds = list(accumulate(lengths.tolist(), initial=0))
    try:
        text = blob.decode()
    except UnicodeDecodeError:
        text = ""
    if len(text) == len(blob):  # all ASCII: byte bounds are str bounds, slice one str
        keys = [text[a:b] for a, b in pairwise(bounds)]
    else:
        keys = [_decode_key(blob[a:b], offset, path)
                for (a, b), offset in zip(pairwise(bounds), offsets.tolist())]
    return list(zip(keys, offsets.tolist(), table["value_len"].tolist(),
                    table["seq"].tolist(), table["write_ns"].tolist(),
                    table["value_crc"].tolist(), table["flags"].tolist()))


def _small_rows(view: memoryview, header: IndexHeader, entries_end: int,
                path: str) -> list[tuple[str, int, int, int, int, int, int]]:
    """:func:`decode_rows` for a few entries: the same checks, one entry at a time."""
    rows = []
    blob = bytes(view[entries_end:len(view) - TRAILER.size])
    keys_end = len(blob)
    at, next_free = 0, 0
    for offset, value_len, seq, write_ns, value_crc, key_len, flags in ENTRY.iter_unpack(
            view[HEADER.size:entries_end]):
        end = offset + VALUE_OFFSET + ((value_len + ALIGN - 1) & ~(ALIGN - 1))
        if offset % ALIGN or offset < next_free or end > header.data_len:
            raise CorruptionError(f"index entry at record offset {offset} (value of "
                                  f"{value_len} bytes) does not fit the data file's "
                                  f"{header.data_len} bytes in order", path=path)
        if not 0 < key_len <= MAX_KEY_BYTES:
            raise CorruptionError(f"index entry at record offset {offset} has an "
                                  f"impossible key length {key_len}", path=path)
        if at + key_len > keys_end:
            break
        rows.append((_decode_key(blob[at:at + key_len], offset, path), offset,
                     value_len, seq, write_ns, value_crc, flags))
        at += key_len
        next_free = end
    if at != keys_end or len(rows) != header.count:
        raise CorruptionError("index key lengths do not add up to its key blob", path=path)
    return rows


def _decode_key(raw: bytes, offset: int, path: str) -> str:
    try:
        return raw.decode()
    except UnicodeDecodeError:
        raise CorruptionError(f"index entry at record offset {offset} has a key that is "
                              "not UTF-8", path=path) from None


def read_index(path: str, *, rows: bool = False) -> tuple[IndexHeader, list]:
    """Load and verify the index at ``path``: its header and its entries (as
    :class:`IndexEntry`, or plain tuples with ``rows=True``). OSError if unreadable."""
    with open(path, "rb", buffering=0) as f:
        data = f.read()
    header = decode_index_header(data, path=path)
    decode = decode_rows if rows else decode_entries
    return header, decode(data, header, path=path)


def write_indexes(directory: str, files: Sequence[tuple[str, str, bytes]]) -> None:
    """Make each ``(temporary name, final name, bytes)`` durable under ``directory``:
    each is written to its temporary name, fsync'd and renamed over its final name
    (:func:`kvstored.sdk.files.write_atomically`), then the directory is fsync'd once for
    all of them.

    A crash leaves each final name with its old content or its new one, never a mix;
    leftover temporary files are removed at the next open. Raises OSError.
    """
    if not files:
        return
    for tmp_name, final_name, data in files:
        write_atomically(os.path.join(directory, final_name), data, sync_dir=False,
                         tmp=os.path.join(directory, tmp_name))
    fsync_dir(directory)
