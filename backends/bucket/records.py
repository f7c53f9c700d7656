"""Moving records between memory and bucket data files through the io engine.

Every record moves as one engine request. A value of up to :data:`SMALL_VALUE_MAX`
travels with its header block as one contiguous I/O through page-aligned scratch memory
(the copy is cheap at that size). A larger one is a vectored item (kvstored.native): its
header block in scratch, its whole 4 KiB blocks straight from or into the caller's
buffer, and its last partial block, if any, through scratch. The kernel moves the
pieces as one sequential request (READV/WRITEV), so megabytes are neither copied nor
split into separate requests. Every piece starts and ends on a 4 KiB boundary, so with
O_DIRECT nothing needs a read-modify-write, and the record is bounced only if the
caller's memory is itself unaligned.

Writing: a bucket's records are laid out back to back, each at a 4 KiB multiple (the
record format of sdk/record.py with its value padded to 4 KiB), padding zeroed.

Reading: every record asked for in one call is read in one engine submission, and ends
in the SDK's one verification (:func:`kvstored.sdk.record.verified_reads`, a batch at a
time: what passes is checked in C, what fails says why in Python): the header and
value CRCs, and the key, size, sequence number and value CRC the index holds. A small
value is checked in scratch memory before it is copied to the caller; a record that fails
is reported CORRUPT, and the caller's bytes are zeroed rather than left holding a value
that failed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from kvstored.backends.bucket.state import Slot
from kvstored.native import IoEngine, IoError, IoFile, LentBatch, ScratchMemory, ScratchPool
from kvstored.sdk.record import (
    ALIGN,
    VALUE_OFFSET,
    ReadBack,
    ReadOutcome,
    align_up,
    encode_header,
    record_size,
    verified_statuses,
)

#: Values up to this size move with their header in one contiguous I/O (see above).
SMALL_VALUE_MAX = 64 * 1024
#: Scratch memory filled per write submission.
WRITE_CHUNK_BYTES = 16 * 1024 * 1024

#: This module's scratch memory: record headers, small values, partial blocks.
_scratch = ScratchMemory()
#: The same, lent to reads that stay in flight past their thread's next call (streams).
_stream_scratch = ScratchPool()


class NewRecord(NamedTuple):
    """A record about to be written: where, and what its header says."""

    offset: int
    key_bytes: bytes
    value: memoryview
    seq: int
    write_ns: int
    checksum: int


def write_records(engine: IoEngine, buckets: Sequence[tuple[IoFile, Sequence[NewRecord]]]
                  ) -> dict[int, IoError]:
    """Write each bucket's records into its file; returns the first error of each bucket
    that had one, by its position in ``buckets``.

    Each record is one engine request. A record whose value is at most
    :data:`SMALL_VALUE_MAX` is assembled (header, value, zero padding) in scratch memory.
    A larger one is a vectored item: its header block in scratch, the value's whole
    blocks straight from the caller's memory, and its last partial block (copied, then
    zero padded) in scratch; the kernel writes them as one sequential request, so
    megabytes are neither copied nor split into several requests. Requests go to the
    engine in submissions of at most :data:`WRITE_CHUNK_BYTES` of scratch memory, so the
    scratch stays small enough to keep and reuse.
    """
    errors: dict[int, IoError] = {}
    scratch = _scratch.take(WRITE_CHUNK_BYTES)
    items: list[tuple[IoFile, int, Any]] = []
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
            whole = size & ~(ALIGN - 1)
            need = VALUE_OFFSET + (align_up(size) if copied else align_up(size) - whole)
            if at + need > WRITE_CHUNK_BYTES:
                submit()
                at = 0
            block = scratch[at:at + need]
            at += need
            block[:VALUE_OFFSET] = encode_header(record.key_bytes, size, record.seq,
                                                 record.checksum, write_ns=record.write_ns)
            owners.append(owner)
            if copied:
                block[VALUE_OFFSET:VALUE_OFFSET + size] = record.value
                block[VALUE_OFFSET + size:] = bytes(need - VALUE_OFFSET - size)
                items.append((file, record.offset, block))
                continue
            pieces = [block[:VALUE_OFFSET], record.value[:whole]]
            if size != whole:
                tail = block[VALUE_OFFSET:]
                tail[:size - whole] = record.value[whole:]
                tail[size - whole:] = bytes(ALIGN - (size - whole))
                pieces.append(tail)
            items.append((file, record.offset, pieces))
    if items:
        submit()
    return errors


def read_scratch_bytes(sizes: Sequence[int]) -> int:
    """Scratch memory :func:`start_records` needs for records of ``sizes``."""
    need = 0
    for size in sizes:
        need += VALUE_OFFSET + (align_up(size) if size <= SMALL_VALUE_MAX
                                else align_up(size) - (size & ~(ALIGN - 1)))
    return need


#: How a record read by :func:`start_records` is checked: its header block, its value in
#: scratch (None when the value went straight into the destination), and the bytes the
#: read must bring for the record to be whole.
ReadPlan = tuple[memoryview, "memoryview | None", int]


class RecordReads:
    """Records being read (:func:`start_records`): ``finish`` waits and verifies them;
    ``close`` waits for what is still in flight and gives the scratch back. An
    :class:`~kvstored.sdk.streams.IssuedReads`."""

    __slots__ = ("batch", "plans", "requests", "tails")

    def __init__(self, batch: LentBatch, requests: Sequence[tuple[Slot, IoFile, memoryview]],
                 plans: list[ReadPlan], tails: list[tuple[int, memoryview, memoryview]]
                 ) -> None:
        self.batch, self.requests, self.plans, self.tails = batch, requests, plans, tails

    def finish(self) -> tuple[list[int], dict[int, ReadOutcome]]:
        results = self.batch.wait()
        for n, scratch, dest in self.tails:
            if not isinstance(results[n], IoError):  # the tail block came in
                dest[:] = scratch
        # One comprehension, not a loop of appends: this runs for every small object read.
        reads: list[ReadBack] = [
            (dest, head, value, slot.key, slot.size, slot.seq, slot.checksum,
             got if isinstance(got, IoError) else None,
             not isinstance(got, IoError) and got >= need)
            for (slot, _, dest), (head, value, need), got in zip(self.requests, self.plans,
                                                                  results)]
        return verified_statuses(reads)

    def close(self) -> None:
        self.plans = self.tails = []
        self.batch.close()


def start_records(engine: IoEngine, requests: Sequence[tuple[Slot, IoFile, memoryview]], *,
                  wait: bool = False) -> RecordReads:
    """Start reading each ``(slot, file, destination)`` in one engine submission, one
    request per record, through scratch memory of this thread's (``wait``: read to the
    end at once, as ``batch_read`` does) or lent for the reads' life (a stream's group,
    in flight past the thread's next call).

    Its ``finish`` gives per record (:func:`~kvstored.sdk.record.verified_statuses`): the
    value in ``destination[:slot.size]`` and its size as the status; or ``CORRUPT`` (with
    the reason) or ``IO_ERROR``. Destinations must be
    byte views at least ``slot.size`` long, left alone until then.
    """
    need = read_scratch_bytes([slot.size for slot, _, _ in requests])
    loan = None if wait else _stream_scratch.lend(need)
    memory = _scratch.take(need) if loan is None else loan.view
    items: list[tuple[IoFile, int, Any]] = []
    plans: list[ReadPlan] = []
    # The large values' last partial blocks: (request, where it lands, where it belongs).
    tails: list[tuple[int, memoryview, memoryview]] = []
    at = 0
    for n, (slot, file, dest) in enumerate(requests):
        size = slot.size
        if size <= SMALL_VALUE_MAX:
            need = VALUE_OFFSET + align_up(size)
            span = memory[at:at + need]
            at += need
            items.append((file, slot.offset, span))
            plans.append((span[:VALUE_OFFSET], span[VALUE_OFFSET:VALUE_OFFSET + size], need))
            continue
        whole = size & ~(ALIGN - 1)
        block = memory[at:at + VALUE_OFFSET + align_up(size) - whole]
        at += block.nbytes
        pieces = [block[:VALUE_OFFSET], dest[:whole]]
        if size != whole:
            tail = block[VALUE_OFFSET:]
            pieces.append(tail)
            tails.append((n, tail[:size - whole], dest[whole:size]))
        items.append((file, slot.offset, pieces))
        plans.append((block[:VALUE_OFFSET], None, record_size(size)))
    return RecordReads(LentBatch(engine, items, _stream_scratch, loan), requests, plans, tails)
