"""Open-time recovery of an offset-layout volume: the last checkpoint, then the journal.

The state at any moment is *the newest valid checkpoint* plus *every live journal entry*
(uuid matches, ``seq`` above the checkpoint's) applied in sequence order:

1. Read both checkpoint slots; take the valid one (header CRC, payload CRC) with the
   highest generation. A torn checkpoint write leaves the other slot, and the journal
   has not been restarted yet in that case, so nothing is lost.
2. Read the whole journal region and keep the live entries. A block that is not the
   start of a live entry is stepped over 4 KiB at a time, so entries written out of
   order by concurrent batches are all found.
3. Read every journalled record whole (adjacent records in one request). It counts
   only if its header CRC equals the one the journal recorded (so a stale record
   of an earlier write, or of an earlier format of the device, in the same place is
   never taken for it), it decodes, its seq is above the checkpoint's, and its value
   matches its value CRC. A record that fails was never acknowledged (the batch died
   before its fdatasync) or was damaged since.
4. Apply puts and tombstones in seq order on top of the checkpoint: a tombstone removes
   the key if its entry is older.
5. Drop entries that leave the data area or the end of a truncated file, and resolve
   overlapping extents in favour of the newer record (a defence: the write path never
   produces overlaps).

The cost is bounded by the index size plus what was written since the last checkpoint,
never by the volume size.

When the volume's own metadata is lost (repair mode only; a normal open refuses), two
more tools rebuild it: :func:`find_geometry` recognises a volume whose superblock is
damaged from its checkpoint slots (nothing is lost then), and :func:`salvage_records`
scans the data area record by record, without any index, for every record that checks
(objects deleted before the damage may reappear then: only the lost index knew).
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import os
from dataclasses import dataclass, field

from crc32c import crc32c

from kvstored.backends.offset.layout import (
    CKPT_ENTRY,
    JOURNAL_MAGIC,
    SLOT_HEADER_SIZE,
    Geometry,
    JournalEntry,
    decode_journal_entry,
    decode_slot_header,
    header_crc_of,
    pack_entry,
    peek_slot,
)
from kvstored.native import IoEngine, IoFile, ScratchMemory
from kvstored.sdk.errors import BackendIOError, CorruptionError, InvalidRequestError
from kvstored.sdk.record import (
    ALIGN,
    VALUE_OFFSET,
    RecordHeader,
    align_up,
    decode_header,
    scan_records,
)
from kvstored.sdk.types import MAX_KEY_BYTES

log = logging.getLogger(__name__)

#: Records read per engine submission, and the most bytes read per submission.
HEADER_BATCH = 1024
VALUE_BATCH_BYTES = 64 << 20

_scratch = ScratchMemory()


class Entry:
    """One visible object: where its record is and what it must contain.

    ``packed`` is the object's checkpoint entry, kept ready so that a checkpoint of a
    large index is one ``b"".join``.
    """

    __slots__ = ("checksum", "footprint", "offset", "packed", "seq", "size", "write_ns")

    def __init__(self, offset: int, size: int, seq: int, write_ns: int, checksum: int,
                 packed: bytes) -> None:
        self.offset = offset
        self.size = size
        self.seq = seq
        self.write_ns = write_ns
        #: CRC-32C of the value.
        self.checksum = checksum
        self.packed = packed
        #: Bytes of the data area the record occupies (header block + padded value).
        self.footprint = VALUE_OFFSET + (size + ALIGN - 1) // ALIGN * ALIGN

    @classmethod
    def build(cls, key_bytes: bytes, offset: int, size: int, seq: int, write_ns: int,
              checksum: int) -> Entry:
        return cls(offset, size, seq, write_ns, checksum,
                   pack_entry(offset, size, seq, write_ns, checksum, key_bytes))


@dataclass
class Recovered:
    """What recovery found: the index in eviction order, and the counters to resume."""

    generation: int
    checkpoint_seq: int
    last_seq: int
    entries: dict[str, Entry]
    #: Live journal entries that were replayed (0 after a clean close).
    replayed: int = 0
    #: Human-readable findings worth a warning (dropped records and why).
    notes: list[str] = field(default_factory=list)
    #: The entries' extents as (offset, footprint), sorted by offset (for the allocator).
    extents: list[tuple[int, int]] = field(default_factory=list)
    #: Journalled records that checked and were replayed.
    records: int = 0


def read_exact(engine: IoEngine, file: IoFile, offset: int, length: int) -> bytes:
    """``length`` bytes at ``offset`` of the volume, through the engine."""
    view = _scratch.take(length)
    [got] = engine.read([(file, offset, view)])
    if isinstance(got, BaseException):
        raise BackendIOError(f"reading {length} bytes at offset {offset} failed",
                             errno=got.errno or errno.EIO, path=file.path)
    if got != length:
        raise CorruptionError(f"the volume ends at {offset + got}, inside metadata that "
                              f"should span {offset}..{offset + length}", path=file.path)
    return bytes(view)


def recover(engine: IoEngine, file: IoFile, geometry: Geometry, *,
            valid_end: int | None = None) -> Recovered:
    """Rebuild the index of the volume open as ``file`` (see the module docstring).

    ``valid_end`` is where the volume's bytes really end when a regular file was found
    truncated: records past it are dropped. Raises CorruptionError when neither
    checkpoint slot is readable.
    """
    path = file.path
    notes: list[str] = []
    generation, cp_seq, entries = _load_checkpoint(engine, file, geometry, notes)
    journal = _read_journal(engine, file, geometry, cp_seq)
    last_seq = max([cp_seq, *(e.seq for e in journal)])
    puts = [put for entry in journal for put in entry.puts]
    found = _verify_records(engine, file, geometry, puts, cp_seq, notes)
    events: list[tuple[int, str, Entry | None]] = [(e.seq, k, e) for k, e in found]
    events += [(t.seq, t.key, None) for entry in journal for t in entry.tombstones]
    events.sort(key=lambda event: event[0])
    for seq, key, entry in events:
        if entry is not None:
            entries.pop(key, None)
            entries[key] = entry  # appended: newest last, as the eviction order wants
        else:
            current = entries.get(key)
            if current is not None and current.seq < seq:
                del entries[key]
    end = geometry.volume_size if valid_end is None else min(valid_end, geometry.volume_size)
    for key, entry in list(entries.items()):
        if entry.offset + entry.footprint > end:
            del entries[key]
            notes.append(f"dropped {key!r}: its record at {entry.offset} lies past the end "
                         f"of the volume's data ({end} bytes); the file was truncated")
    extents = _drop_overlaps(entries, notes)
    for note in notes:
        log.warning("%s: %s", path, note)
    return Recovered(generation, cp_seq, last_seq, entries, len(journal), notes, extents,
                     len(found))


def _load_checkpoint(engine: IoEngine, file: IoFile, geometry: Geometry,
                     notes: list[str]) -> tuple[int, int, dict[str, Entry]]:
    slots = geometry.slot_offsets
    heads = _scratch.take(2 * ALIGN)
    results = engine.read([(file, slots[0], heads[:ALIGN]), (file, slots[1], heads[ALIGN:])])
    candidates = []
    for i, (offset, got) in enumerate(zip(slots, results)):
        if isinstance(got, BaseException):
            raise BackendIOError("reading a checkpoint slot failed",
                                 errno=got.errno or errno.EIO, path=file.path)
        header = decode_slot_header(heads[i * ALIGN:(i + 1) * ALIGN], geometry)
        if header is not None:
            candidates.append((header.generation, offset, header))
    candidates.sort(key=lambda c: c[0], reverse=True)
    for rank, (generation, offset, header) in enumerate(candidates):
        raw = read_exact(engine, file, offset, align_up(SLOT_HEADER_SIZE + header.payload_len))
        payload = raw[SLOT_HEADER_SIZE:SLOT_HEADER_SIZE + header.payload_len]
        if crc32c(payload) != header.payload_crc:
            notes.append(f"checkpoint generation {generation} at {offset} fails its checksum "
                         "(a torn checkpoint write); using the previous one")
            continue
        try:
            entries = _parse_entries(payload, header.entries, geometry)
        except CorruptionError as exc:
            notes.append(f"checkpoint generation {generation} at {offset}: {exc.message}")
            continue
        if rank:
            log.warning("%s: fell back to checkpoint generation %d", file.path, generation)
        return generation, header.seq, entries
    raise CorruptionError(
        "neither checkpoint slot holds a valid checkpoint of this volume; the index is "
        "lost. Copy the volume aside for analysis before formatting it again",
        path=file.path)


def _parse_entries(payload: bytes, count: int, geometry: Geometry) -> dict[str, Entry]:
    """The checkpoint's entries, in order. This loop is most of a clean reopen's time:
    the bounds check is inlined on purpose."""
    entries: dict[str, Entry] = {}
    unpack, fixed = CKPT_ENTRY.unpack_from, CKPT_ENTRY.size
    low, high, length = geometry.data_offset, geometry.volume_size, len(payload)
    pos = 0
    for _ in range(count):
        if pos + fixed > length:
            raise CorruptionError("the checkpoint's entries are shorter than its count")
        offset, size, seq, write_ns, crc, key_len = unpack(payload, pos)
        end = pos + fixed + key_len
        entry = Entry(offset, size, seq, write_ns, crc, payload[pos:end])
        if (end > length or offset % ALIGN or offset < low
                or offset + entry.footprint > high or not 0 < key_len <= MAX_KEY_BYTES):
            raise CorruptionError(f"checkpoint entry at byte {pos} is out of bounds")
        try:
            key = payload[pos + fixed:end].decode("utf-8")
        except UnicodeDecodeError:
            raise CorruptionError(f"checkpoint entry at byte {pos} has a non-UTF-8 key") from None
        entries[key] = entry
        pos = end
    if len(entries) != count:
        raise CorruptionError("the checkpoint lists a key twice")
    if pos != length:
        raise CorruptionError("the checkpoint has bytes after its last entry")
    return entries


def _read_journal(engine: IoEngine, file: IoFile, geometry: Geometry,
                  after_seq: int) -> list[JournalEntry]:
    raw = read_exact(engine, file, geometry.journal_offset, geometry.journal_size)
    live, pos = [], 0
    while pos < len(raw):
        entry = decode_journal_entry(raw, pos, geometry)
        if entry is not None and entry.seq > after_seq:
            live.append(entry)
            pos += entry.nblocks * ALIGN
        else:
            pos += ALIGN
    return live


def _verify_records(engine: IoEngine, file: IoFile, geometry: Geometry,
                    puts: list[tuple[int, int, int]], after_seq: int,
                    notes: list[str]) -> list[tuple[str, Entry]]:
    """The journalled records that check completely, as (key, entry).

    A batch's records are usually adjacent on the volume, so runs of adjacent records
    are read with one request each (padding included), many requests per submission.
    """
    found: list[tuple[str, Entry]] = []
    candidates = sorted((offset, size, crc) for offset, size, crc in puts
                        if offset % ALIGN == 0 and offset >= geometry.data_offset
                        and offset + _footprint(size) <= geometry.volume_size)
    index = 0
    while index < len(candidates):
        # One submission: runs of adjacent records, up to VALUE_BATCH_BYTES in all.
        runs: list[list[tuple[int, int, int]]] = []
        total = 0
        while index < len(candidates):
            offset, size, _ = candidates[index]
            length = _footprint(size)
            if runs and total + length > VALUE_BATCH_BYTES:
                break
            last = runs[-1][-1] if runs else None
            if (last is None or last[0] + _footprint(last[1]) != offset
                    or len(runs[-1]) >= HEADER_BATCH):
                runs.append([])
            runs[-1].append(candidates[index])
            total += length
            index += 1
        view = _scratch.take(total)
        items, position = [], 0
        for run in runs:
            span = sum(_footprint(size) for _, size, _ in run)
            items.append((file, run[0][0], view[position:position + span]))
            position += span
        for run, (_, _, buf), got in zip(runs, items, engine.read(items)):
            at = 0
            for offset, size, crc in run:
                length = VALUE_OFFSET + size
                complete = not isinstance(got, BaseException) and got >= at + length
                entry = _check_record(buf[at:at + length], length if complete else -1,
                                      offset, size, crc, after_seq, notes, file.path)
                if entry is not None:
                    found.append(entry)
                at += _footprint(size)
    return found


def _footprint(size: int) -> int:
    return VALUE_OFFSET + (size + ALIGN - 1) // ALIGN * ALIGN


def _check_record(record: memoryview, got, offset: int, size: int, crc: int,
                  after_seq: int, notes: list[str], path: str) -> tuple[str, Entry] | None:
    """One journalled record read back, or None when it is not the record the journal
    describes (overwritten since, never completely written, or damaged)."""
    if got != VALUE_OFFSET + size or header_crc_of(record) != crc:
        return None  # overwritten since, or never written: not this record
    try:
        header = decode_header(record[:VALUE_OFFSET], path=path, offset=offset)
    except CorruptionError:
        return None
    if header.tombstone or header.seq <= after_seq or header.value_len != size:
        return None
    if crc32c(record[VALUE_OFFSET:]) != header.value_crc:
        notes.append(f"left out {header.key!r} (seq {header.seq}) at {offset}: its value "
                     "fails its checksum (a write that was never acknowledged, or damage)")
        return None
    return header.key, Entry.build(header.key.encode(), offset, size, header.seq,
                                   header.write_ns, header.value_crc)


def _drop_overlaps(entries: dict[str, Entry], notes: list[str]) -> list[tuple[int, int]]:
    """Keep the newer of any two records whose extents overlap; return the kept extents
    as (offset, footprint) in offset order."""
    by_offset = sorted([(entry.offset, key) for key, entry in entries.items()])
    kept: list[tuple[int, int]] = []
    kept_key, kept_end = None, -1
    for _, key in by_offset:
        entry = entries[key]
        if entry.offset < kept_end and kept_key is not None:
            loser = key if entries[kept_key].seq > entry.seq else kept_key
            winner = kept_key if loser == key else key
            notes.append(f"dropped {loser!r}: its record overlaps the newer one of "
                         f"{winner!r}")
            del entries[loser]
            if loser == key:
                continue
            kept.pop()
        kept_key, kept_end = key, entry.offset + entry.footprint
        kept.append((entry.offset, entry.footprint))
    return kept


# -- rebuilding lost metadata (repair mode) ------------------------------------------------


def find_geometry(engine: IoEngine, file: IoFile, volume_size: int,
                  index_bytes: int | None) -> Geometry | None:
    """The geometry of a volume whose superblock is lost, recognised from its checkpoint
    slots, or None when they do not identify it.

    The geometry is a function of the volume size and ``index_bytes`` (the default, or the
    option given); the uuid is in every checkpoint header. A candidate is taken when its
    slot B holds a valid checkpoint header, or when slot A (always at 4096) does and the
    candidate's slot B and journal start hold nothing of another volume: enough that the
    journal and data area are where the candidate says.
    """
    candidates = []
    for option in dict.fromkeys([index_bytes, None]):
        try:
            candidates.append(Geometry.plan(volume_size, option))
        except InvalidRequestError:
            continue
    for geometry in candidates:
        slot_a, slot_b = geometry.slot_offsets
        try:
            head_a = read_exact(engine, file, slot_a, ALIGN)
            head_b = read_exact(engine, file, slot_b, ALIGN)
            journal = read_exact(engine, file, geometry.journal_offset, ALIGN)
        except (CorruptionError, BackendIOError):
            continue
        found_a, found_b = peek_slot(head_a), peek_slot(head_b)
        if found_b is not None and (found_a is None or found_a[0] == found_b[0]):
            return dataclasses.replace(geometry, uuid=found_b[0])
        if found_a is None or any(head_b):
            continue
        uuid = found_a[0]
        if any(journal) and (journal[:4] != JOURNAL_MAGIC or journal[8:24] != uuid):
            continue
        return dataclasses.replace(geometry, uuid=uuid)
    return None


@dataclass
class Salvaged:
    """What a scan of the data area found: the newest record of each key."""

    #: key -> (record offset, header), newest seq of each key.
    records: dict[str, tuple[int, RecordHeader]] = field(default_factory=dict)
    #: Records that lie inside ``below`` (the metadata of the geometry being rebuilt).
    shadowed: list[tuple[int, RecordHeader]] = field(default_factory=list)
    scanned_bytes: int = 0


def salvage_records(path: str, start: int, end: int, *, below: int = 0) -> Salvaged:
    """Scan ``path`` (a volume file or device) from ``start`` to ``end`` for every record
    that checks (:func:`kvstored.sdk.record.scan_records`); keep the newest of each
    key. Records starting before ``below`` are returned apart (the new metadata will
    overwrite them: the caller copies them out first)."""
    found = Salvaged(scanned_bytes=max(0, end - start))
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        for offset, header in scan_records(lambda n, at: os.pread(fd, n, at), start, end):
            if offset < below:
                found.shadowed.append((offset, header))
                continue
            known = found.records.get(header.key)
            if known is None or known[1].seq < header.seq:
                found.records[header.key] = (offset, header)
    finally:
        os.close(fd)
    return found
