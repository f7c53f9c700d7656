"""The offset layout on a volume: superblock, checkpoint slots, journal, data area.

A *volume* is one preallocated file (the ``offset`` backend) or a block device (the
``nvmeof`` backend). Both use this layout, byte for byte; docs/format.md has the tables::

    0                superblock (4 KiB): geometry, volume uuid, CRC-32C
    slot_a           checkpoint slot A  (slot_size bytes)
    slot_b           checkpoint slot B  (slot_size bytes)
    journal_offset   allocation journal (journal_size bytes)
    data_offset      data area: records (sdk/record.py), 4 KiB aligned, up to
                     volume_size

- The **superblock** is written once, when the volume is formatted, and last: a volume
  whose first block holds no superblock never acknowledged anything.
- A **checkpoint** is the whole index (key -> record offset, sizes, seq, CRC) as of a
  sequence number ``seq``. Checkpoints alternate between the two slots, so a torn one
  leaves the previous intact; the valid slot with the highest generation wins.
- The **journal** lists, for every write since the last checkpoint, the offset and header
  CRC of each record, and a tombstone (a record header with FLAG_TOMBSTONE) for each
  delete. An entry is live when its uuid matches and its ``seq`` exceeds the
  checkpoint's; it restarts at its first block after every checkpoint.

This module only encodes and decodes; :mod:`kvstored.backends.offset.volume` does the I/O.
Every structure carries the volume uuid, so stale structures of an earlier format of the
same device are never taken for current ones.
"""

from __future__ import annotations

import os
import struct
import time
from dataclasses import dataclass

from crc32c import crc32c

from kvstored.sdk.errors import CorruptionError, InvalidRequestError
from kvstored.sdk.record import (
    ALIGN,
    FLAG_TOMBSTONE,
    HEADER_CORE,
    HEADER_SIZE,
    RecordHeader,
    align_up,
    decode_header,
    encode_header,
)

LAYOUT_VERSION = 1
KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30

#: A volume smaller than this is refused: the metadata alone takes a few hundred KiB.
MIN_VOLUME_SIZE = 1 * MiB

SUPER_MAGIC = b"KVSOFFVL"
#: magic, version, flags, volume_size, slot_size, slot_a, slot_b, journal_offset,
#: journal_size, data_offset, uuid, created_ns; then the CRC-32C of these 96 bytes.
SUPER = struct.Struct("<8sIIQQQQQQQ16sQ")
SUPER_CRC = struct.Struct("<I")

SLOT_MAGIC = b"KVSC"
#: magic, version, reserved, uuid, generation, seq, entries, payload_len, payload_crc;
#: then the CRC-32C of these 60 bytes. The payload (the entries) follows at 64.
SLOT_HEADER = struct.Struct("<4sHH16sQQQQI")
SLOT_HEADER_SIZE = 64
#: One index entry: record offset, value_len, seq, write_ns, value_crc, key_len; key.
CKPT_ENTRY = struct.Struct("<QQQQIH")

JOURNAL_MAGIC = b"KVSJ"
#: magic, version, nblocks, uuid, seq, puts, tombstones, payload_len; then the CRC-32C of
#: these 44 bytes continued over the payload. The payload follows at 48.
JOURNAL_HEADER = struct.Struct("<4sHH16sQIII")
JOURNAL_HEADER_SIZE = 48
#: One journalled record: its offset, its value length, and its header CRC (record bytes
#: 40..43). The length lets recovery read each record in one request.
JOURNAL_PUT = struct.Struct("<QQI")
#: The longest journal entry: a batch with more to journal is split into several entries.
MAX_JOURNAL_ENTRY = 16 * ALIGN
MAX_ENTRY_PAYLOAD = MAX_JOURNAL_ENTRY - JOURNAL_HEADER_SIZE

_RECORD_HEADER_CRC = struct.Struct("<I")


def entry_size(key_bytes: bytes) -> int:
    """Bytes one object takes in a checkpoint."""
    return CKPT_ENTRY.size + len(key_bytes)


def pack_entry(offset: int, value_len: int, seq: int, write_ns: int, value_crc: int,
               key_bytes: bytes) -> bytes:
    return CKPT_ENTRY.pack(offset, value_len, seq, write_ns, value_crc,
                           len(key_bytes)) + key_bytes


def header_crc_of(header_block) -> int:
    """The header CRC stored in a record's header block (what the journal records)."""
    return _RECORD_HEADER_CRC.unpack_from(header_block, HEADER_CORE.size)[0]


# -- geometry and the superblock ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Geometry:
    """Where everything sits on a volume. All offsets and sizes are 4 KiB multiples."""

    volume_size: int
    slot_size: int
    journal_size: int
    uuid: bytes
    created_ns: int

    @property
    def slot_offsets(self) -> tuple[int, int]:
        return ALIGN, ALIGN + self.slot_size

    @property
    def journal_offset(self) -> int:
        return ALIGN + 2 * self.slot_size

    @property
    def data_offset(self) -> int:
        return self.journal_offset + self.journal_size

    @property
    def data_size(self) -> int:
        return self.volume_size - self.data_offset

    @property
    def index_capacity(self) -> int:
        """Bytes of index entries one checkpoint slot holds."""
        return self.slot_size - SLOT_HEADER_SIZE

    @property
    def journal_blocks(self) -> int:
        return self.journal_size // ALIGN

    @classmethod
    def plan(cls, volume_size: int, index_bytes: int | None = None, *,
             uuid: bytes | None = None) -> Geometry:
        """The geometry of a new volume of ``volume_size`` bytes.

        Each checkpoint slot gets ``index_bytes`` (default 1/256 of the volume, from
        64 KiB to 1 GiB: about 40 k objects per GiB at 100-byte keys; raise it for
        small-value workloads). The journal gets 1/1024 of the volume, 64 KiB to 64 MiB.
        """
        volume_size -= volume_size % ALIGN
        if volume_size < MIN_VOLUME_SIZE:
            raise InvalidRequestError(
                f"a volume of {volume_size} bytes is too small; give at least "
                f"{MIN_VOLUME_SIZE} bytes of capacity")
        if index_bytes is None:
            slot = min(max(align_up(volume_size // 256), 64 * KiB), 1 * GiB)
        else:
            if index_bytes < 4 * KiB:
                raise InvalidRequestError(f"index_bytes must be at least 4096, not {index_bytes}")
            slot = align_up(index_bytes + SLOT_HEADER_SIZE)
        journal = min(max(align_up(volume_size // 1024), 64 * KiB), 64 * MiB)
        geometry = cls(volume_size, slot, journal, uuid or os.urandom(16), time.time_ns())
        if geometry.data_size < 16 * ALIGN:
            raise InvalidRequestError(
                f"a volume of {volume_size} bytes leaves no room for data after "
                f"{geometry.data_offset} bytes of metadata; raise the capacity or lower "
                "index_bytes")
        return geometry

    def encode(self) -> bytearray:
        """The superblock: one 4 KiB block."""
        block = bytearray(ALIGN)
        a, b = self.slot_offsets
        SUPER.pack_into(block, 0, SUPER_MAGIC, LAYOUT_VERSION, 0, self.volume_size,
                        self.slot_size, a, b, self.journal_offset, self.journal_size,
                        self.data_offset, self.uuid, self.created_ns)
        SUPER_CRC.pack_into(block, SUPER.size, crc32c(memoryview(block)[:SUPER.size]))
        return block

    @classmethod
    def decode(cls, block, *, path: str) -> Geometry:
        """Parse and check a superblock; CorruptionError or InvalidRequestError if bad."""
        (magic, version, _flags, volume_size, slot_size, slot_a, slot_b, journal_offset,
         journal_size, data_offset, uuid, created_ns) = SUPER.unpack_from(block, 0)
        if magic != SUPER_MAGIC:
            raise CorruptionError("no offset-layout superblock at offset 0", path=path)
        (stored,) = SUPER_CRC.unpack_from(block, SUPER.size)
        if stored != crc32c(memoryview(block)[:SUPER.size]):
            raise CorruptionError(
                "the superblock fails its checksum; the volume cannot be opened safely. "
                "Copy it aside for analysis and format a new one", path=path)
        if version != LAYOUT_VERSION:
            raise InvalidRequestError(
                f"the volume has offset layout version {version}; this kvstored reads "
                f"version {LAYOUT_VERSION}: upgrade kvstored to open it", path=path)
        geometry = cls(volume_size, slot_size, journal_size, uuid, created_ns)
        if ((slot_a, slot_b, journal_offset, data_offset)
                != (*geometry.slot_offsets, geometry.journal_offset, geometry.data_offset)
                or any(v % ALIGN for v in (volume_size, slot_size, journal_size))
                or data_offset >= volume_size):
            raise CorruptionError("the superblock describes an impossible geometry",
                                  path=path)
        return geometry


# -- checkpoints --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SlotHeader:
    generation: int
    seq: int
    entries: int
    payload_len: int
    payload_crc: int


def encode_checkpoint(geometry: Geometry, generation: int, seq: int,
                      entries: list[bytes]) -> bytes:
    """A checkpoint ready to write at its slot: header, entries, zero padding to 4 KiB."""
    payload = b"".join(entries)
    if len(payload) > geometry.index_capacity:
        raise InvalidRequestError(
            f"the index ({len(payload)} bytes) does not fit a checkpoint slot of "
            f"{geometry.index_capacity} bytes")
    header = bytearray(SLOT_HEADER_SIZE)
    SLOT_HEADER.pack_into(header, 0, SLOT_MAGIC, LAYOUT_VERSION, 0, geometry.uuid,
                          generation, seq, len(entries), len(payload), crc32c(payload))
    struct.pack_into("<I", header, SLOT_HEADER.size, crc32c(memoryview(header)[:SLOT_HEADER.size]))
    total = SLOT_HEADER_SIZE + len(payload)
    return b"".join((header, payload, bytes(align_up(total) - total)))


def decode_slot_header(block, geometry: Geometry) -> SlotHeader | None:
    """The slot's header, or None when the slot holds no checkpoint of this volume."""
    (magic, version, _reserved, uuid, generation, seq, entries, payload_len,
     payload_crc) = SLOT_HEADER.unpack_from(block, 0)
    if magic != SLOT_MAGIC or uuid != geometry.uuid or version != LAYOUT_VERSION:
        return None
    (stored,) = struct.unpack_from("<I", block, SLOT_HEADER.size)
    if stored != crc32c(memoryview(block)[:SLOT_HEADER.size]):
        return None
    if payload_len > geometry.index_capacity:
        return None
    return SlotHeader(generation, seq, entries, payload_len, payload_crc)


def peek_slot(block) -> tuple[bytes, int] | None:
    """``(volume uuid, generation)`` of the checkpoint header at the start of ``block``,
    or None: how a volume whose superblock is lost is recognised (the header is checked by
    its own CRC; the geometry is not needed)."""
    if len(block) < SLOT_HEADER_SIZE:
        return None
    (magic, version, _reserved, uuid, generation, _seq, _entries, _payload_len,
     _payload_crc) = SLOT_HEADER.unpack_from(block, 0)
    if magic != SLOT_MAGIC or version != LAYOUT_VERSION:
        return None
    (stored,) = struct.unpack_from("<I", block, SLOT_HEADER.size)
    if stored != crc32c(memoryview(block)[:SLOT_HEADER.size]):
        return None
    return bytes(uuid), generation


# -- the journal --------------------------------------------------------------------------


@dataclass(slots=True)
class JournalEntry:
    """One decoded journal entry: what a batch wrote or deleted."""

    seq: int
    nblocks: int
    #: (record offset, value length, record header CRC) for each record written.
    puts: list[tuple[int, int, int]]
    tombstones: list[RecordHeader]


def tombstone_bytes(key_bytes: bytes, seq: int) -> bytes:
    """A tombstone as the journal stores it: a record header with FLAG_TOMBSTONE and its
    key, without the padding to 4 KiB."""
    block = encode_header(key_bytes, 0, seq, 0, flags=FLAG_TOMBSTONE)
    return bytes(block[:HEADER_SIZE + len(key_bytes)])


def _split(nputs: int, tomb_lengths: list[int]) -> list[tuple[int, int, int]]:
    """How one operation's journal payload is cut into entries: ``(puts, tombstones,
    payload_len)`` per entry, each fitting :data:`MAX_JOURNAL_ENTRY`."""
    per_entry = MAX_ENTRY_PAYLOAD // JOURNAL_PUT.size
    out: list[tuple[int, int, int]] = []
    t = 0
    while nputs or t < len(tomb_lengths) or not out:
        puts = min(nputs, per_entry)
        nputs -= puts
        payload = puts * JOURNAL_PUT.size
        tombs = 0
        while t < len(tomb_lengths) and payload + tomb_lengths[t] <= MAX_ENTRY_PAYLOAD:
            payload += tomb_lengths[t]
            tombs += 1
            t += 1
        out.append((puts, tombs, payload))
    return out


def journal_blocks(nputs: int, tomb_lengths: list[int]) -> int:
    """The 4 KiB blocks :func:`encode_journal` uses for these puts and tombstones."""
    return sum(align_up(JOURNAL_HEADER_SIZE + payload) // ALIGN
               for _, _, payload in _split(nputs, tomb_lengths))


def encode_journal(geometry: Geometry, seq: int, puts: list[tuple[int, int, int]],
                   tombstones: list[bytes]) -> list[bytes]:
    """Journal entries (each whole 4 KiB blocks) for one operation.

    ``puts`` are ``(offset, value_len, header_crc)``, ``tombstones`` from
    :func:`tombstone_bytes`.
    More than fits :data:`MAX_JOURNAL_ENTRY` is split over several entries; all carry
    ``seq``, the highest sequence number the operation used.
    """
    out: list[bytes] = []
    p = t = 0
    for nputs, ntombs, payload_len in _split(len(puts), [len(x) for x in tombstones]):
        payload = b"".join([JOURNAL_PUT.pack(*put) for put in puts[p:p + nputs]]
                           + tombstones[t:t + ntombs])
        p, t = p + nputs, t + ntombs
        total = JOURNAL_HEADER_SIZE + payload_len
        nblocks = align_up(total) // ALIGN
        header = bytearray(JOURNAL_HEADER_SIZE)
        JOURNAL_HEADER.pack_into(header, 0, JOURNAL_MAGIC, LAYOUT_VERSION, nblocks,
                                 geometry.uuid, seq, nputs, ntombs, payload_len)
        crc = crc32c(payload, crc32c(memoryview(header)[:JOURNAL_HEADER.size]))
        struct.pack_into("<I", header, JOURNAL_HEADER.size, crc)
        out.append(b"".join((header, payload, bytes(nblocks * ALIGN - total))))
    return out


def decode_journal_entry(buf: bytes, pos: int, geometry: Geometry) -> JournalEntry | None:
    """The entry starting at ``buf[pos]``, or None if there is none of this volume
    (a stale entry of another format, a torn entry, or unused space)."""
    if buf[pos:pos + 4] != JOURNAL_MAGIC or len(buf) - pos < JOURNAL_HEADER_SIZE:
        return None
    (_magic, version, nblocks, uuid, seq, nputs, ntombs,
     payload_len) = JOURNAL_HEADER.unpack_from(buf, pos)
    if uuid != geometry.uuid or version != LAYOUT_VERSION:
        return None
    start = pos + JOURNAL_HEADER_SIZE
    end = start + payload_len
    if nblocks < 1 or end > min(len(buf), pos + nblocks * ALIGN):
        return None
    (stored,) = struct.unpack_from("<I", buf, pos + JOURNAL_HEADER.size)
    if stored != crc32c(buf[start:end], crc32c(buf[pos:pos + JOURNAL_HEADER.size])):
        return None
    puts = [JOURNAL_PUT.unpack_from(buf, start + i * JOURNAL_PUT.size) for i in range(nputs)]
    cursor = start + nputs * JOURNAL_PUT.size
    tombstones = []
    for _ in range(ntombs):
        try:
            header = decode_header(buf[cursor:end], offset=cursor)
        except CorruptionError:
            return None  # cannot happen with a matching CRC unless the writer was broken
        if not header.tombstone:
            return None
        tombstones.append(header)
        cursor += HEADER_SIZE + len(header.key.encode("utf-8"))
    return JournalEntry(seq, nblocks, puts, tombstones)
