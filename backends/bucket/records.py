"""Moving records between memory and bucket data files through the io engine.

Every record written is one engine request, and so is every record read, except that
small neighbours on disk read together are joined (:func:`start_records`). A value of up
to :data:`SMALL_VALUE_MAX` travels with its header block as one contiguous I/O through
page-aligned scratch memory (the copy is cheap at that size). A larger one is a vectored
item (kvstored.native): its header block in scratch, its whole 4 KiB blocks straight from
or into the caller's buffer, and its last partial block, if any, through scratch. The
kernel moves the pieces as one sequential request (READV/WRITEV), so megabytes are
neither copied nor split into separate requests. Every piece starts and ends on a 4 KiB
boundary, so with O_DIRECT nothing needs a read-modify-write, and the record is bounced
only if the caller's memory is itself unaligned.

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

import collections
from collections.abc import Sequence
from typing import Any, NamedTuple

from kvstored.backends.bucket.state import Slot
from kvstored.native import IoEngine, IoError, IoFile, LentBatch, ScratchMemory, ScratchPool
from kvstored.native.engine import Item
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

#: Bytes of adjacent small records read as one request, at most (see :func:`start_records`).
JOINED_READ_MAX = 1 << 20


class RecordReads:
    """Records being read (:func:`start_records`): ``finish`` waits and verifies them;
    ``close`` waits for what is still in flight and gives the scratch back. An
    :class:`~kvstored.sdk.streams.IssuedReads`.

    ``joined`` is None when every record is a request of its own; otherwise it says,
    per record, which request brought it and where in that request it starts, and
    ``alone`` holds each record's own request, for ``engine`` to read again one by one
    the records of a joined request that failed."""

    __slots__ = ("alone", "batch", "engine", "joined", "plans", "requests", "tails")

    def __init__(self, batch: LentBatch, requests: Sequence[tuple[Slot, IoFile, memoryview]],
                 plans: list[ReadPlan], tails: list[tuple[int, memoryview, memoryview]],
                 engine: IoEngine, joined: list[tuple[int, int]] | None,
                 alone: list[Item]) -> None:
        self.batch, self.requests, self.plans, self.tails = batch, requests, plans, tails
        self.engine, self.joined, self.alone = engine, joined, alone

    def finish(self) -> tuple[list[int], dict[int, ReadOutcome]]:
        results = self.batch.wait()
        if self.joined is not None:
            results = self._per_record(results)
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

    def _per_record(self, results: list[int | IoError]) -> list[int | IoError]:
        """The joined requests' results as each record's own: the bytes of it that came
        in (a short read at the end of the file covers the records before the end).
        The records of a joined request that failed are read again one by one, so that
        one bad block costs its own record, not its neighbours'."""
        assert self.joined is not None
        per_record: list[int | IoError] = []
        for k, start in self.joined:
            got = results[k]
            per_record.append(got if isinstance(got, IoError) else got - start)
        if any(isinstance(got, IoError) for got in results):
            records_of = collections.Counter(k for k, _ in self.joined)
            again = [n for n, (k, _) in enumerate(self.joined)
                     if records_of[k] > 1 and isinstance(results[k], IoError)]
            for n, got in zip(again, self.engine.read([self.alone[n] for n in again])):
                per_record[n] = got
        return per_record

    def close(self) -> None:
        self.plans = self.tails = self.alone = []
        self.batch.close()


def start_records(engine: IoEngine, requests: Sequence[tuple[Slot, IoFile, memoryview]], *,
                  wait: bool = False) -> RecordReads:
    """Start reading each ``(slot, file, destination)`` in one engine submission,
    through scratch memory of this thread's (``wait``: read to the end at once, as
    ``batch_read`` does) or lent for the reads' life (a stream's group, in flight past
    the thread's next call).

    Each record is one request, except that small records lying back to back in one
    file, asked for in that order, are read as one request of up to
    :data:`JOINED_READ_MAX` bytes into consecutive scratch: a batch put together was
    flushed together (oldest first, so in its order) and is read back the same way.
    The kernel, which each request enters on its own (kvstored.native), no longer
    merges such neighbours: the disk saw 32 requests of 68 KiB for a node's get of 32
    objects of 64 KiB, where three of 748 KiB now read the same bytes (such gets 0.28-0.35
    -> 0.33-0.43 GB/s, docs/benchmarks.md, "Neighbouring records read as one request").

    Its ``finish`` gives per record (:func:`~kvstored.sdk.record.verified_statuses`): the
    value in ``destination[:slot.size]`` and its size as the status; or ``CORRUPT`` (with
    the reason) or ``IO_ERROR``. Destinations must be
    byte views at least ``slot.size`` long, left alone until then.
    """
    need = read_scratch_bytes([slot.size for slot, _, _ in requests])
    loan = None if wait else _stream_scratch.lend(need)
    memory = _scratch.take(need) if loan is None else loan.view
    items: list[Item] = []
    plans: list[ReadPlan] = []
    # The large values' last partial blocks: (request, where it lands, where it belongs).
    tails: list[tuple[int, memoryview, memoryview]] = []
    # Per record: (its request, where in it the record starts), and its own request.
    joined: list[tuple[int, int]] = []
    alone: list[Item] = []
    # The request the last small record went into: its file, offset and scratch start.
    run_file: IoFile | None = None
    run_offset = run_at = 0
    at = 0
    for n, (slot, file, dest) in enumerate(requests):
        size = slot.size
        if size <= SMALL_VALUE_MAX:
            need = VALUE_OFFSET + align_up(size)
            span = memory[at:at + need]
            alone.append((file, slot.offset, span))
            plans.append((span[:VALUE_OFFSET], span[VALUE_OFFSET:VALUE_OFFSET + size], need))
            if (file is run_file and run_offset + (at - run_at) == slot.offset
                    and at + need - run_at <= JOINED_READ_MAX):
                items[-1] = (file, run_offset, memory[run_at:at + need])
            else:
                run_file, run_offset, run_at = file, slot.offset, at
                items.append(alone[-1])
            joined.append((len(items) - 1, slot.offset - run_offset))
            at += need
            continue
        run_file = None  # scratch is no longer contiguous past this record
        whole = size & ~(ALIGN - 1)
        block = memory[at:at + VALUE_OFFSET + align_up(size) - whole]
        at += block.nbytes
        pieces = [block[:VALUE_OFFSET], dest[:whole]]
        if size != whole:
            tail = block[VALUE_OFFSET:]
            pieces.append(tail)
            tails.append((n, tail[:size - whole], dest[whole:size]))
        alone.append((file, slot.offset, pieces))
        items.append(alone[-1])
        plans.append((block[:VALUE_OFFSET], None, record_size(size)))
        joined.append((len(items) - 1, 0))
    # With nothing joined, the results are the records' own.
    return RecordReads(LentBatch(engine, items, _stream_scratch, loan), requests, plans,
                       tails, engine, joined if len(items) < len(requests) else None, alone)
