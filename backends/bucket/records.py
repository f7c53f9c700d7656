"""Moving records between memory and bucket data files through the io engine.

Small and large values are moved differently. A value of up to :data:`SMALL_VALUE_MAX`
travels with its header block as one contiguous I/O through page-aligned scratch memory
(one request per record; the copy is cheap at that size). A larger one is split into its
header block, its whole 4 KiB blocks straight from or into the caller's buffer, and its
last partial block through scratch memory: adjacent requests in the same submission,
which saves copying megabytes for the price of a second request. Every item handed to
the engine starts and ends on a 4 KiB boundary, so with O_DIRECT nothing needs a
read-modify-write, and the caller's memory is bounced only if it is itself unaligned.

Writing: a bucket's records are laid out back to back, each at a 4 KiB multiple (the
record format of backends/record.py with its value padded to 4 KiB), padding zeroed.

Reading: every record asked for in one call is read in one engine submission. A small
value is checked in scratch memory before it is copied to the caller. Either way the header
CRC (header and key) and the value CRC are both checked, and the header must name the
key, size and sequence number the index holds. A record that fails is reported CORRUPT,
and the caller's bytes are zeroed rather than left holding a value that failed.
"""

from __future__ import annotations

import mmap
import threading
from collections.abc import Sequence
from typing import NamedTuple

from crc32c import crc32c
from kvstored.backends.bucket.state import Slot
from kvstored.backends.record import ALIGN, VALUE_OFFSET, align_up, decode_header, encode_header
from kvstored.native import IoEngine, IoError, IoFile
from kvstored.sdk.errors import CorruptionError
from kvstored.sdk.types import ReadStatus

#: Values up to this size move with their header in one contiguous I/O (see above).
SMALL_VALUE_MAX = 64 * 1024
#: Scratch memory filled per write submission.
WRITE_CHUNK_BYTES = 16 * 1024 * 1024

# Scratch memory up to this size is kept by its thread for the next call: touching
# fresh pages is slow (DESIGN.md), and a thread's batches tend to look alike.
_KEEP_SCRATCH_BYTES = 64 << 20


class _Scratch(threading.local):
    """Each thread's page-aligned scratch memory, grown on demand and reused."""

    def __init__(self) -> None:
        self.memory: mmap.mmap | None = None

    def take(self, size: int) -> memoryview:
        if self.memory is not None and len(self.memory) >= size:
            return memoryview(self.memory)[:size]
        fresh = mmap.mmap(-1, max(1 << max(size - 1, 0).bit_length(), 1 << 20))
        if len(fresh) <= _KEEP_SCRATCH_BYTES:
            self.memory = fresh
        return memoryview(fresh)[:size]


_scratch = _Scratch()


class NewRecord(NamedTuple):
    """A record about to be written: where, and what its header says."""

    offset: int
    key_bytes: bytes
    value: memoryview
    seq: int
    write_ns: int
    crc: int


def write_records(engine: IoEngine, buckets: Sequence[tuple[IoFile, Sequence[NewRecord]]]
                  ) -> dict[int, IoError]:
    """Write each bucket's records into its file; returns the first error of each bucket
    that had one, by its position in ``buckets``.

    A record whose value is at most :data:`SMALL_VALUE_MAX` is assembled (header, value,
    zero padding) in scratch memory and written as one request. A larger value is
    written from the caller's memory, between its header block and its padded last
    block: copying it would make one sequential request of the record (the disk alone
    takes that 1.3 to 2x faster at 128 KiB with O_DIRECT), but on these 2-vCPU machines
    the copy cost more than it saved (measured end to end, 128 KiB and 1 MiB values).
    Requests go to the engine in submissions of at most :data:`WRITE_CHUNK_BYTES` of
    scratch memory, so the scratch stays small enough to keep and reuse.
    """
    errors: dict[int, IoError] = {}
    scratch = _scratch.take(WRITE_CHUNK_BYTES)
    items: list[tuple[IoFile, int, memoryview]] = []
    owners: list[int] = []
    at = 0

    def submit() -> None:
        for owner, outcome in zip(owners, engine.write(items)):
            if isinstance(outcome, IoError):
                errors.setdefault(owner, outcome)
        items.clear()
        owners.clear()

    for owner, (file, records) in enumerate(buckets):
        for record in records:
            size = record.value.nbytes
            copied = size <= SMALL_VALUE_MAX
            need = VALUE_OFFSET + (align_up(size) if copied else ALIGN)
            if at + need > WRITE_CHUNK_BYTES:
                submit()
                at = 0
            block = scratch[at:at + (VALUE_OFFSET + align_up(size) if copied
                                     else VALUE_OFFSET)]
            at += block.nbytes
            block[:VALUE_OFFSET] = encode_header(record.key_bytes, size, record.seq,
                                                 record.crc, write_ns=record.write_ns)
            if copied:
                block[VALUE_OFFSET:VALUE_OFFSET + size] = record.value
                block[VALUE_OFFSET + size:] = bytes(block.nbytes - VALUE_OFFSET - size)
                items.append((file, record.offset, block))
                owners.append(owner)
                continue
            whole = size & ~(ALIGN - 1)
            items.append((file, record.offset, block))
            items.append((file, record.offset + VALUE_OFFSET, record.value[:whole]))
            owners += [owner, owner]
            if size != whole:
                tail = scratch[at:at + ALIGN]
                at += ALIGN
                tail[:size - whole] = record.value[whole:]
                tail[size - whole:] = bytes(ALIGN - (size - whole))
                items.append((file, record.offset + VALUE_OFFSET + whole, tail))
                owners.append(owner)
    if items:
        submit()
    return errors


class ReadOutcome(NamedTuple):
    """The value's length, or a negative ReadStatus and why."""

    status: int
    reason: str | None = None


def read_records(engine: IoEngine,
                 requests: Sequence[tuple[Slot, IoFile, memoryview]]) -> list[ReadOutcome]:
    """Read and verify each ``(slot, file, destination)`` in one engine submission.

    On success the value is in ``destination[:slot.size]`` and the outcome is its size;
    otherwise ``CORRUPT`` (with the reason) or ``IO_ERROR``. Destinations must be byte
    views at least ``slot.size`` long.
    """
    need = 0
    for slot, _, _ in requests:
        need += (VALUE_OFFSET + align_up(slot.size) if slot.size <= SMALL_VALUE_MAX
                 else VALUE_OFFSET + (ALIGN if slot.size % ALIGN else 0))
    scratch = _scratch.take(need)
    items: list[tuple[IoFile, int, memoryview]] = []
    # Per request: (first item, item count, header view, contiguous view or None,
    # tail view or None).
    plans = []
    at = 0
    for slot, file, dest in requests:
        first = len(items)
        if slot.size <= SMALL_VALUE_MAX:
            span = scratch[at:at + VALUE_OFFSET + align_up(slot.size)]
            at += span.nbytes
            items.append((file, slot.offset, span))
            plans.append((first, 1, span[:VALUE_OFFSET], span, None))
            continue
        head = scratch[at:at + VALUE_OFFSET]
        at += VALUE_OFFSET
        items.append((file, slot.offset, head))
        whole = slot.size & ~(ALIGN - 1)
        items.append((file, slot.offset + VALUE_OFFSET, dest[:whole]))
        tail = None
        if slot.size != whole:
            tail = scratch[at:at + ALIGN]
            at += ALIGN
            items.append((file, slot.offset + VALUE_OFFSET + whole, tail))
        plans.append((first, len(items) - first, head, None, tail))
    results = engine.read(items)
    outcomes = []
    for (slot, _, dest), (first, count, head, span, tail) in zip(requests, plans):
        got = results[first:first + count]
        outcome = _verify(slot, dest, got, [item[2].nbytes for item in items[first:first + count]],
                          head, span, tail)
        if outcome.status < 0 and span is None:
            dest[:slot.size] = bytes(slot.size)  # never leave failed bytes in the buffer
        outcomes.append(outcome)
    return outcomes


def _verify(slot: Slot, dest: memoryview, got: list[int | IoError], wanted: list[int],
            head: memoryview, span: memoryview | None,
            tail: memoryview | None) -> ReadOutcome:
    for result in got:
        if isinstance(result, IoError):
            return ReadOutcome(ReadStatus.IO_ERROR, str(result))
    if any(result < want for result, want in zip(got, wanted)):
        return ReadOutcome(ReadStatus.CORRUPT, "the record is cut short (the data file is "
                                               "shorter than the index says)")
    try:
        header = decode_header(head, offset=slot.offset)
    except CorruptionError as exc:
        return ReadOutcome(ReadStatus.CORRUPT, exc.message)
    if (header.key != slot.key or header.seq != slot.seq or header.value_len != slot.size
            or header.value_crc != slot.crc or header.tombstone):
        return ReadOutcome(ReadStatus.CORRUPT, "the record header does not match the index "
                                               f"(key {header.key!r}, seq {header.seq})")
    if span is not None:
        value = span[VALUE_OFFSET:VALUE_OFFSET + slot.size]
        if crc32c(value) != slot.crc:
            return ReadOutcome(ReadStatus.CORRUPT, "the value fails its checksum")
        dest[:slot.size] = value
        return ReadOutcome(slot.size)
    whole = slot.size & ~(ALIGN - 1)
    if tail is not None:
        dest[whole:slot.size] = tail[:slot.size - whole]
    if crc32c(dest[:slot.size]) != slot.crc:
        return ReadOutcome(ReadStatus.CORRUPT, "the value fails its checksum")
    return ReadOutcome(slot.size)
