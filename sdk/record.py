"""The self-describing record that every built-in backend writes, and the one way a
record read back is verified before its value is handed out.

On-disk layout of one record (all integers little-endian)::

    offset  size  field
    0       4     magic       b"KVSR"
    4       2     version     RECORD_VERSION (1)
    6       2     flags       bit 0: TOMBSTONE (a delete marker; value_len is 0)
    8       2     key_len     1..1024
    10      2     reserved    0
    12      8     value_len   bytes of value
    20      8     seq         the backend's write sequence number
    28      8     write_ns    time.time_ns() when written
    36      4     value_crc   CRC-32C of the value
    40      4     header_crc  CRC-32C of bytes 0..39 followed by the key
    44      k     key         UTF-8, key_len bytes
    ...           zero padding up to VALUE_OFFSET (4096)
    4096    n     value       value_len bytes
    ...           zero padding to a multiple of 4096 (aligned layouts only)

The header and key are checked apart from the value, so a scan can trust a record's
extent (and skip over it) without reading the value, and a value can be verified
without the header. Because a key is at most 1024 bytes, header and key always fit in
the first 4 KiB: values start on a 4 KiB boundary whenever the record does, which is
what lets O_DIRECT read them without a bounce buffer.

A reader that meets a version it does not know refuses the record (CorruptionError
names the version); a format change bumps RECORD_VERSION. docs/format.md repeats this.

Reading a record back
    A backend's index says what each record must hold: its key, value length, sequence
    number and value CRC-32C. :func:`verified_read` is the single check every read path
    ends in (a read, a scan with ``verify``, ``check``): the record was read whole, its
    header decodes and passes its own CRC, it is not a tombstone, it names the key,
    length, sequence number and value CRC the *index* holds (a record that is valid in
    itself but is not the one indexed, such as a stale record at a reused offset, fails),
    and the value's CRC-32C is the index's checksum. A failed read never leaves bytes of
    the record in the caller's buffer: it is zeroed.

This module is part of the SDK: a third-party backend may write these records too.
"""

from __future__ import annotations

import importlib
import struct
import time
from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple

from crc32c import crc32c

from kvstored.sdk.errors import CorruptionError
from kvstored.sdk.types import MAX_KEY_BYTES, Buffer, ReadStatus

try:  # by name: the module exists only once built (setup.py, optional)
    _record_check = importlib.import_module("kvstored.sdk._record_check")
except ImportError:  # verified_reads checks each record in Python instead
    _record_check = None

MAGIC = b"KVSR"
RECORD_VERSION = 1
FLAG_TOMBSTONE = 0x1
#: magic, version, flags, key_len, reserved, value_len, seq, write_ns, value_crc
HEADER_CORE = struct.Struct("<4sHHHHQQQI")
HEADER_CRC = struct.Struct("<I")
HEADER_SIZE = HEADER_CORE.size + HEADER_CRC.size  # 44
ALIGN = 4096
VALUE_OFFSET = ALIGN
assert HEADER_SIZE + MAX_KEY_BYTES <= VALUE_OFFSET


def align_up(n: int, alignment: int = ALIGN) -> int:
    return (n + alignment - 1) // alignment * alignment


def record_size(value_len: int, *, aligned_tail: bool = True) -> int:
    """Bytes a record of ``value_len`` occupies (padded to ALIGN when ``aligned_tail``)."""
    return VALUE_OFFSET + (align_up(value_len) if aligned_tail else value_len)


def value_checksum(value) -> int:
    return crc32c(value)


class RecordHeader(NamedTuple):
    key: str
    value_len: int
    seq: int
    write_ns: int
    value_crc: int
    flags: int

    @property
    def tombstone(self) -> bool:
        return bool(self.flags & FLAG_TOMBSTONE)

    @property
    def write_time(self) -> float:
        return self.write_ns / 1e9


def encode_header(key_bytes: bytes, value_len: int, seq: int, value_crc: int, *,
                  flags: int = 0, write_ns: int | None = None) -> bytearray:
    """Return the first VALUE_OFFSET bytes of a record: header, key and zero padding."""
    if write_ns is None:
        write_ns = time.time_ns()
    block = bytearray(VALUE_OFFSET)
    HEADER_CORE.pack_into(block, 0, MAGIC, RECORD_VERSION, flags, len(key_bytes), 0,
                          value_len, seq, write_ns, value_crc)
    block[HEADER_SIZE:HEADER_SIZE + len(key_bytes)] = key_bytes
    head_crc = crc32c(key_bytes, crc32c(memoryview(block)[:HEADER_CORE.size]))
    HEADER_CRC.pack_into(block, HEADER_CORE.size, head_crc)
    return block


def looks_like_record(block) -> bool:
    """True when ``block`` starts with the record magic (a cheap pre-check for scans)."""
    return bytes(block[:4]) == MAGIC


def decode_header(block, *, path: str | None = None, offset: int = 0) -> RecordHeader:
    """Parse and verify the header and key at the start of ``block``.

    Raises :class:`CorruptionError` naming the file and offset when the magic, version,
    lengths or header checksum are wrong.
    """
    where = f"record at offset {offset}"
    if len(block) < HEADER_SIZE:
        raise CorruptionError(f"{where} is truncated ({len(block)} bytes of header)", path=path)
    (magic, version, flags, key_len, _reserved, value_len, seq, write_ns,
     value_crc) = HEADER_CORE.unpack_from(block, 0)
    if magic != MAGIC:
        raise CorruptionError(f"{where} has bad magic {magic!r}", path=path)
    if version != RECORD_VERSION:
        raise CorruptionError(
            f"{where} has format version {version}; this kvstored reads version "
            f"{RECORD_VERSION}: upgrade kvstored to read it", path=path)
    if not 0 < key_len <= MAX_KEY_BYTES or len(block) < HEADER_SIZE + key_len:
        raise CorruptionError(f"{where} has an impossible key length {key_len}", path=path)
    key_bytes = bytes(block[HEADER_SIZE:HEADER_SIZE + key_len])
    (stored_crc,) = HEADER_CRC.unpack_from(block, HEADER_CORE.size)
    actual = crc32c(key_bytes, crc32c(memoryview(block)[:HEADER_CORE.size]))
    if stored_crc != actual:
        raise CorruptionError(f"{where} fails its header checksum", path=path)
    try:
        key = key_bytes.decode("utf-8")
    except UnicodeDecodeError:
        raise CorruptionError(f"{where} has a key that is not UTF-8", path=path) from None
    return RecordHeader(key, value_len, seq, write_ns, value_crc, flags)


class ReadOutcome(NamedTuple):
    """How one record read back ended: the value's length (``status >= 0``), or a negative
    :class:`~kvstored.sdk.ReadStatus` and why (for logs and check reports)."""

    status: int
    reason: str | None = None

    @property
    def ok(self) -> bool:
        return self.status >= 0


def verify_record(head: Buffer, value: Buffer, *, key: str, size: int, seq: int,
                  checksum: int, complete: bool = True) -> str | None:
    """Why the record read back as ``head`` (its first VALUE_OFFSET bytes) and ``value``
    is not the one the index describes (``key``, ``size``, ``seq``, ``checksum``), or None
    when it is. ``complete`` says whether the read got the whole record."""
    if not complete:
        return "the record is cut short (its file or volume ends inside it)"
    try:
        header = decode_header(head)
    except CorruptionError as exc:
        return exc.message
    if header.tombstone:
        return "a delete marker stands where the index expects the record"
    if (header.key, header.value_len, header.seq, header.value_crc) != (key, size, seq,
                                                                          checksum):
        return (f"the record is not the one indexed (it holds key {header.key!r}, seq "
                f"{header.seq}, {header.value_len} bytes)")
    if crc32c(value) != checksum:
        return "the value fails its checksum (CRC-32C)"
    return None


def verified_read(dest: memoryview, head: Buffer, value: Buffer | None, *, key: str,
                  size: int, seq: int, checksum: int, complete: bool = True,
                  error: OSError | None = None) -> ReadOutcome:
    """Finish one read of a record into the caller's ``dest``: verify it, then hand the
    value over, or make sure nothing of it stays in ``dest``.

    ``head`` is the record's header block as read. ``value`` is its value as read into
    scratch memory, or None when it was read straight into ``dest[:size]``. ``error`` is
    the read's I/O error, if it had one; ``complete`` whether it got the whole record.

    On success the value is in ``dest[:size]`` and the outcome's status is ``size``. On any
    failure ``dest[:size]`` is zeroed, whatever the read put there, and the status is
    ``IO_ERROR`` or ``CORRUPT`` (with the reason from :func:`verify_record`).
    """
    if error is not None:
        outcome = ReadOutcome(ReadStatus.IO_ERROR, str(error))
    else:
        got = dest[:size] if value is None else value
        problem = verify_record(head, got, key=key, size=size, seq=seq, checksum=checksum,
                                complete=complete)
        if problem is None:
            if value is not None:
                dest[:size] = value
            return ReadOutcome(size)
        outcome = ReadOutcome(ReadStatus.CORRUPT, problem)
    if size:
        dest[:size] = bytes(size)  # never leave bytes that failed in the caller's buffer
    return outcome


#: One record read back, for :func:`verified_reads`: ``(dest, head, value, key, size, seq,
#: checksum, error, complete)``, the arguments of :func:`verified_read` in that order.
ReadBack = tuple[memoryview, Buffer, "Buffer | None", str, int, int, int, "OSError | None",
                 bool]


def verified_reads(reads: Sequence[ReadBack]) -> list[ReadOutcome]:
    """:func:`verified_read` of each record of a batch, with the same outcomes.

    The records that read whole and pass are checked (and their values handed over) by
    one call into C (``kvstored.sdk._record_check``, where it was built); any record that
    fails there, or did not read whole, goes through :func:`verified_read` itself, which
    says why and zeroes the destination. So C decides only that a record passes, never
    why one fails.
    """
    return outcomes_of(*verified_statuses(reads))


def outcomes_of(statuses: Sequence[int], failures: dict[int, ReadOutcome]
                ) -> list[ReadOutcome]:
    """The outcomes :func:`verified_statuses` describes, one per record."""
    passed: dict[int, ReadOutcome] = {}  # one outcome per size: they are immutable
    outcomes = []
    for n, status in enumerate(statuses):
        outcome = failures.get(n) if status < 0 else passed.get(status)
        if outcome is None:
            outcome = passed[status] = ReadOutcome(status)
        outcomes.append(outcome)
    return outcomes


def verified_statuses(reads: Sequence[ReadBack]) -> tuple[list[int], dict[int, ReadOutcome]]:
    """:func:`verified_reads` as a read path wants it: each record's status (the value's
    length, or a negative :class:`~kvstored.sdk.ReadStatus`), and the outcome (with its
    reason) of each that failed, by position. The same checks, the same destinations."""
    if _record_check is None:
        outcomes = [verified_read(dest, head, value, key=key, size=size, seq=seq,
                                  checksum=checksum, complete=complete, error=error)
                    for dest, head, value, key, size, seq, checksum, error, complete in reads]
        return ([o.status for o in outcomes],
                {n: o for n, o in enumerate(outcomes) if not o.ok})
    statuses = [read[4] for read in reads]
    failures: dict[int, ReadOutcome] = {}
    for n in _record_check.check(reads if type(reads) is list else list(reads)):
        dest, head, value, key, size, seq, checksum, error, complete = reads[n]
        outcome = failures[n] = verified_read(dest, head, value, key=key, size=size,
                                              seq=seq, checksum=checksum,
                                              complete=complete, error=error)
        statuses[n] = outcome.status
    return statuses, failures


#: Bytes read at a time by :func:`scan_records`.
SCAN_CHUNK = 8 << 20


def scan_records(pread: Callable[[int, int], bytes], start: int, end: int
                 ) -> Iterator[tuple[int, RecordHeader]]:
    """Every record between ``start`` and ``end`` whose header *and* value check, as
    ``(offset, header)``, found without any index: what repair uses when an index, a
    journal or a superblock is lost.

    Records start on 4 KiB boundaries, so the scan looks for the magic at every 4 KiB
    step from ``start`` (a multiple of 4096); after a record that checks it jumps past
    the record's padded extent. Tombstones are skipped. ``pread(length, offset)`` reads
    the file or volume (shorter at its end). A value that itself contains a record that
    checks is found only if the record around it does not: objects are opaque bytes.
    """
    pos = align_up(start)
    while pos + HEADER_SIZE <= end:
        window = pread(min(SCAN_CHUNK, end - pos), pos)
        if not window:
            return
        at = 0
        resume = None
        while at + HEADER_SIZE <= len(window):
            if window[at:at + 4] != MAGIC:
                at += ALIGN
                continue
            head = window[at:at + VALUE_OFFSET]
            if len(head) < VALUE_OFFSET:
                head = pread(VALUE_OFFSET, pos + at)
            try:
                header = decode_header(head, offset=pos + at)
            except CorruptionError:
                at += ALIGN
                continue
            value_at = pos + at + VALUE_OFFSET
            if header.tombstone or value_at + header.value_len > end:
                at += ALIGN
                continue
            inside = at + VALUE_OFFSET + header.value_len <= len(window)
            value = (window[at + VALUE_OFFSET:at + VALUE_OFFSET + header.value_len] if inside
                     else pread(header.value_len, value_at))
            if len(value) != header.value_len or value_checksum(value) != header.value_crc:
                at += ALIGN
                continue
            yield pos + at, header
            at += record_size(header.value_len)
            if at > len(window):
                resume = pos + at
                break
        pos = resume if resume is not None else pos + len(window) - len(window) % ALIGN
        if len(window) % ALIGN and resume is None:
            return  # the file ends inside this window
