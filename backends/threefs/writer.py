"""Writing a batch of records to ``3fs`` shard files: laid out in staging memory, written
in few, large, aligned pieces, with the layout of one piece overlapping the write of the
previous ones.

Why stage rather than hand the caller's buffers to the engine: a record is a 4 KiB header
block, the value, and zero padding. Written as separate requests, the small header writes
between the values cost the file system a block allocation each and halve the request
size at 128 KiB; and on O_DIRECT files the engine would bounce unaligned values anyway,
through a read-modify-write that is not safe against another batch appending to the
same shard. Consecutive records of a batch are consecutive in their shard, so staging
them makes one aligned write of up to :data:`PIECE_BYTES` out of many records. The copy
runs at memory speed and, for big batches, on this thread while the I/O threads write
the previous pieces.
"""

from __future__ import annotations

import mmap
import time
from concurrent.futures import Executor, Future, wait
from dataclasses import dataclass

import cffi

from kvstored.native import IoEngine, IoError, IoFile, ScratchMemory
from kvstored.sdk.record import VALUE_OFFSET, encode_header, record_size, value_checksum

#: Records are gathered into writes of at most this many bytes.
PIECE_BYTES = 4 << 20
#: Staging slots: pieces in flight on the I/O threads, plus the one being filled.
SLOTS = 6
_ZEROS = mmap.mmap(-1, VALUE_OFFSET)
#: Staging memory of the writes: pieces of records, big records' headers and tails.
_scratch = ScratchMemory()
_ffi = cffi.FFI()


@dataclass(slots=True)
class Placed:
    """A record to write: its key and value, and where it goes."""

    key_bytes: bytes
    value: memoryview
    file: IoFile
    offset: int
    seq: int
    #: Filled in by :func:`write_records`: the value's CRC-32C and the write time.
    checksum: int = 0
    write_ns: int = 0


def write_records(engine: IoEngine, records: list[Placed],
                  executor: Executor | None) -> list[IoError | None]:
    """Write every record (not fsync'd); return per record None or the error.

    A batch of at most two pieces, or without an executor, goes in one engine
    submission; a bigger one piece by piece on the executor, while this thread lays out
    the next piece in a free staging slot.
    """
    sizes = [record_size(r.value.nbytes) for r in records]
    big = [r for r, size in zip(records, sizes) if size > PIECE_BYTES]
    pipelined = executor is not None and sum(sizes) > 2 * PIECE_BYTES
    staging = SLOTS * PIECE_BYTES if pipelined else sum(s for s in sizes if s <= PIECE_BYTES)
    arena = _scratch.take(staging + sum(_big_scratch(r) for r in big))
    spare = arena[staging:]
    submissions: list[tuple[list, list]] = []  # (items, [(record, start or None, length)])
    futures: list[Future] = []
    slot_of: list[int] = []  # pipelined: the slot each submission's piece uses (-1: none)
    piece: _Piece | None = None
    packed = 0  # not pipelined: where the next piece starts in the arena

    def submit(items: list, carried: list, slot: int = -1) -> None:
        submissions.append((items, carried))
        slot_of.append(slot)
        if pipelined and executor is not None:  # pipelined implies an executor
            futures.append(executor.submit(engine.write, items))

    def close_piece() -> None:
        nonlocal piece, packed
        if piece is not None and piece.fill:
            submit([(piece.file, piece.start, piece.memory[:piece.fill])], piece.records,
                   piece.slot)
            packed += piece.fill
        piece = None

    def new_piece(record: Placed) -> _Piece:
        if not pipelined:
            return _Piece(-1, arena[packed:staging], record.file, record.offset)
        slot = sum(1 for s in slot_of if s >= 0) % SLOTS
        for n in range(len(slot_of) - 1, -1, -1):  # wait for the slot's last writer
            if slot_of[n] == slot:
                futures[n].result()
                break
        return _Piece(slot, arena[slot * PIECE_BYTES:(slot + 1) * PIECE_BYTES], record.file,
                      record.offset)

    try:
        for n, (record, length) in enumerate(zip(records, sizes)):
            value = record.value
            record.checksum = value_checksum(value)
            record.write_ns = time.time_ns()
            header = encode_header(record.key_bytes, value.nbytes, record.seq,
                                   record.checksum, write_ns=record.write_ns)
            if length > PIECE_BYTES:
                close_piece()
                items, spare = _big_items(record, header, spare)
                submit(items, [(n, None, length)])
                continue
            if (piece is None or piece.file is not record.file
                    or piece.start + piece.fill != record.offset
                    or piece.fill + length > PIECE_BYTES):
                close_piece()
                piece = new_piece(record)
            piece.add(n, header, value, length)
        close_piece()
        if pipelined:
            outcomes = [future.result() for future in futures]
        else:
            flat = engine.write([item for items, _ in submissions for item in items])
            outcomes, at = [], 0
            for items, _ in submissions:
                outcomes.append(flat[at:at + len(items)])
                at += len(items)
    finally:
        wait(futures)  # the staging memory must outlive every write into the file
    errors: list[IoError | None] = [None] * len(records)
    for (_items, carried), results in zip(submissions, outcomes):
        failure = next((r for r in results if isinstance(r, IoError)), None)
        if failure is None:
            continue
        for n, start, length in carried:
            # A piece that failed part way wrote its first ``done`` bytes: the records
            # wholly inside them are fine.
            if start is None or start + length > failure.done:
                errors[n] = failure
    return errors


class _Piece:
    """Consecutive records of one shard, laid out in staging memory for one write."""

    __slots__ = ("file", "fill", "memory", "records", "slot", "start")

    def __init__(self, slot: int, memory: memoryview, file: IoFile, start: int) -> None:
        self.slot, self.memory, self.file, self.start = slot, memory, file, start
        self.fill = 0
        self.records: list[tuple[int, int, int]] = []

    def add(self, n: int, header: bytearray, value: memoryview, length: int) -> None:
        at, memory = self.fill, self.memory
        memory[at:at + VALUE_OFFSET] = header
        end = at + VALUE_OFFSET + value.nbytes
        memory[at + VALUE_OFFSET:end] = value
        memory[end:at + length] = _ZEROS[:at + length - end]
        self.records.append((n, at, length))
        self.fill += length


def _big_scratch(record: Placed) -> int:
    """Scratch a record too big for a piece needs: its header block, its last partial
    block, and a copy of the value when that is not page-aligned memory."""
    return 2 * VALUE_OFFSET + (0 if _page_aligned(record.value) else record.value.nbytes)


def _big_items(record: Placed, header: bytearray, spare: memoryview) -> tuple[list, memoryview]:
    """A big record as aligned items straight from the caller's memory (copied into
    aligned scratch only if it is not aligned), and the scratch left over."""
    value, file, offset = record.value, record.file, record.offset
    block, spare = spare[:VALUE_OFFSET], spare[VALUE_OFFSET:]
    block[:] = header
    items = [(file, offset, block)]
    whole = value.nbytes - value.nbytes % VALUE_OFFSET
    body = value[:whole]
    if not _page_aligned(value):
        body, spare = spare[:whole], spare[value.nbytes:]
        body[:] = value[:whole]
    items.append((file, offset + VALUE_OFFSET, body))
    if whole < value.nbytes:
        tail, spare = spare[:VALUE_OFFSET], spare[VALUE_OFFSET:]
        rest = value.nbytes - whole
        tail[:rest] = value[whole:]
        tail[rest:] = _ZEROS[:VALUE_OFFSET - rest]
        items.append((file, offset + VALUE_OFFSET + whole, tail))
    return items, spare


def _page_aligned(view: memoryview) -> bool:
    return not view.nbytes or int(_ffi.cast("uintptr_t", _ffi.from_buffer(view))) % 4096 == 0
