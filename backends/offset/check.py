"""``check`` and ``check(repair=True)`` for the offset layout.

What is examined:

- the superblock, against the geometry the backend opened with;
- the newest checkpoint slot (header and payload CRC);
- every indexed record: header (magic, version, CRC, and that it matches the index
  entry) and value CRC;
- the in-memory index: extents inside the data area, no overlaps, each extent allocated
  in the allocator with the record's footprint, the byte counters.

What repair does:

- a bad record is *copied out* (the bytes of its whole extent) to the quarantine folder
  as ``<time>-<offset>.kvr`` with a ``.json`` note saying what it was and why it was
  taken out, then deleted like any key (a tombstone, so it stays gone after a crash);
- a damaged superblock or checkpoint is rewritten from memory.

Free space is not examined: records of deleted objects legitimately remain there until
the space is reused, and nothing points at them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol

from crc32c import crc32c

from kvstored.backends.offset.journal import write_sync
from kvstored.backends.offset.layout import SLOT_HEADER_SIZE, Geometry, decode_slot_header
from kvstored.backends.offset.recovery import Entry, read_exact, record_problem
from kvstored.backends.record import ALIGN, VALUE_OFFSET, align_up
from kvstored.native import IoEngine, IoError, IoFile
from kvstored.sdk.errors import BackendError, CorruptionError
from kvstored.sdk.quarantine import Quarantine
from kvstored.sdk.types import CheckReport, Problem, ProblemKind

log = logging.getLogger(__name__)

#: Records (and value bytes) verified per engine submission, and the largest chunk
#: copied out at once.
CHECK_BATCH = 32
CHECK_BYTES = 64 << 20
COPY_CHUNK = 16 << 20


@dataclass(frozen=True, slots=True)
class IndexAudit:
    """The in-memory index as one consistent picture, for the index checks."""

    #: Every indexed object, in volume order.
    entries: list[tuple[str, Entry]]
    #: What the counters say: logical bytes, and bytes of the records' extents.
    logical: int
    record_bytes: int
    #: Keys whose extent the allocator does not hold with the record's footprint.
    unallocated: list[str]


class CheckedVolume(Protocol):
    """What the checks need of an open offset-layout volume, and nothing more
    (:class:`~kvstored.backends.offset.volume.OffsetLayoutBackend` has it)."""

    @property
    def engine(self) -> IoEngine: ...
    @property
    def volume_file(self) -> IoFile: ...
    @property
    def geometry(self) -> Geometry: ...
    @property
    def generation(self) -> int: ...
    @property
    def quarantine(self) -> Quarantine: ...
    @property
    def open_problems(self) -> list[Problem]: ...

    def checkpoint(self) -> None:
        """Write a checkpoint of the index now."""
        ...

    def indexed(self) -> list[tuple[str, Entry]]:
        """Every indexed object now."""
        ...

    def is_current(self, key: str, entry: Entry) -> bool:
        """Whether ``key`` is still indexed as ``entry`` (not deleted, nor rewritten)."""
        ...

    def pin(self, keys: Iterable[str]) -> AbstractContextManager[None]: ...

    def drop(self, key: str, entry: Entry) -> None:
        """Delete ``key`` durably (a tombstone), unless it changed since ``entry``."""
        ...

    def audit(self) -> IndexAudit:
        """The index, its counters and the allocator, taken together."""
        ...


def check_volume(backend: CheckedVolume, repair: bool) -> CheckReport:
    report = CheckReport(repaired=repair)
    report.problems.extend(backend.open_problems)  # what this open rebuilt, once
    if repair:
        backend.open_problems.clear()
    _check_superblock(backend, report, repair)
    _check_checkpoint(backend, report, repair)
    chunk: list[tuple[str, Entry]] = []
    chunk_bytes = 0
    for key, entry in backend.indexed():
        if chunk and (len(chunk) == CHECK_BATCH or chunk_bytes + entry.size > CHECK_BYTES):
            _check_records(backend, chunk, report, repair)
            chunk, chunk_bytes = [], 0
        chunk.append((key, entry))
        chunk_bytes += entry.size
    if chunk:
        _check_records(backend, chunk, report, repair)
    _check_index(backend, report)
    return report


def _check_superblock(backend: CheckedVolume, report: CheckReport, repair: bool) -> None:
    path = backend.volume_file.path
    try:
        on_disk = Geometry.decode(read_exact(backend.engine, backend.volume_file, 0, ALIGN),
                                  path=path)
        if on_disk == backend.geometry:
            return
        detail = "the superblock differs from the geometry the volume was opened with"
    except BackendError as exc:
        detail = exc.message
    action = None
    if repair:
        volume = backend.volume_file
        write_sync(backend.engine, volume, [(volume, 0, backend.geometry.encode())],
                   "rewriting the superblock")
        action = "rewrote the superblock from the open volume's geometry"
        log.warning("%s: %s; %s", path, detail, action)
    report.problems.append(Problem(ProblemKind.CORRUPT_RECORD, detail, None, path, action))


def _check_checkpoint(backend: CheckedVolume, report: CheckReport, repair: bool) -> None:
    geometry, path = backend.geometry, backend.volume_file.path
    generation = backend.generation
    slot = geometry.slot_offsets[generation % 2]
    head = read_exact(backend.engine, backend.volume_file, slot, ALIGN)
    header = decode_slot_header(head, geometry)
    if header is not None and header.generation == generation:
        raw = read_exact(backend.engine, backend.volume_file, slot,
                         align_up(SLOT_HEADER_SIZE + header.payload_len))
        if crc32c(raw[SLOT_HEADER_SIZE:SLOT_HEADER_SIZE + header.payload_len]) == \
                header.payload_crc:
            return
    elif header is not None and header.generation > generation:
        return  # a checkpoint ran meanwhile
    detail = f"checkpoint generation {generation} at offset {slot} does not check"
    action = None
    if repair:
        backend.checkpoint()
        action = "wrote a new checkpoint"
    report.problems.append(Problem(ProblemKind.INDEX_MISMATCH, detail, None, path, action))


def _check_records(backend: CheckedVolume, chunk: list[tuple[str, Entry]],
                   report: CheckReport, repair: bool) -> None:
    keys = [key for key, _ in chunk]
    quarantined: list[tuple[str, Entry]] = []
    with backend.pin(keys):
        heads = [bytearray(ALIGN) for _ in chunk]
        values = [bytearray(entry.size) for _, entry in chunk]
        items = []
        for (_, entry), head, value in zip(chunk, heads, values):
            items.append((backend.volume_file, entry.offset, head))
            items.append((backend.volume_file, entry.offset + VALUE_OFFSET, value))
        outcomes = backend.engine.read(items)
        for n, (key, entry) in enumerate(chunk):
            if not backend.is_current(key, entry):
                continue  # deleted or evicted since the snapshot
            report.records_checked += 1
            got_head, got_value = outcomes[2 * n], outcomes[2 * n + 1]
            if isinstance(got_head, IoError) or isinstance(got_value, IoError):
                problem = f"reading the record failed: {got_head if isinstance(got_head, IoError) else got_value}"  # noqa: E501
            else:
                problem = record_problem(key, entry, heads[n], values[n], got_head, got_value)
            if problem is None:
                continue
            action = None
            if repair:
                try:
                    action = _quarantine(backend, key, entry, problem)
                    quarantined.append((key, entry))
                except (BackendError, OSError) as exc:
                    log.error("%s: could not quarantine %r: %s", backend.volume_file.path, key, exc)
            report.problems.append(Problem(ProblemKind.CORRUPT_RECORD, problem, key,
                                           backend.volume_file.path, action))
    for key, entry in quarantined:  # after the pins are gone, so the space is freed now
        backend.drop(key, entry)


def _quarantine(backend: CheckedVolume, key: str, entry: Entry, reason: str) -> str:
    """Copy the record's whole extent out of the volume, with a note; return the action."""
    def chunks():
        done, total = 0, entry.footprint
        while done < total:
            length = min(COPY_CHUNK, total - done)
            buf = bytearray(length)
            [got] = backend.engine.read([(backend.volume_file, entry.offset + done, buf)])
            if isinstance(got, IoError):
                raise CorruptionError(f"copying the record out failed: {got}", key=key)
            yield memoryview(buf)[:got]
            if got < length:
                return  # the volume ends early: keep what there is
            done += length

    note = {"key": key, "volume": backend.volume_file.path, "record_offset": entry.offset,
            "record_length": entry.footprint, "value_length": entry.size, "seq": entry.seq,
            "value_crc32c": entry.crc, "reason": reason}
    target = backend.quarantine.copy_out(f"{entry.offset:012x}", chunks(), note)
    log.warning("%s: quarantined the record of %r at offset %d (%s) to %s",
                backend.volume_file.path, key, entry.offset, reason, target)
    return f"copied to {target} and dropped from the index"


def _check_index(backend: CheckedVolume, report: CheckReport) -> None:
    geometry, path = backend.geometry, backend.volume_file.path
    audit = backend.audit()
    previous_end, previous_key = geometry.data_offset, None
    for key, entry in audit.entries:
        if entry.offset < previous_end:
            report.problems.append(Problem(
                ProblemKind.INDEX_MISMATCH,
                f"the record at {entry.offset} overlaps that of {previous_key!r}", key, path))
        if entry.offset + entry.footprint > geometry.volume_size:
            report.problems.append(Problem(ProblemKind.INDEX_MISMATCH,
                                           "the record extends past the volume", key, path))
        previous_end, previous_key = entry.offset + entry.footprint, key
    for key in audit.unallocated:
        report.problems.append(Problem(ProblemKind.ACCOUNTING, "the record's extent is not "
                                       "allocated with its size", key, path))
    logical = sum(entry.size for _, entry in audit.entries)
    footprints = sum(entry.footprint for _, entry in audit.entries)
    if (audit.logical, audit.record_bytes) != (logical, footprints):
        report.problems.append(Problem(
            ProblemKind.ACCOUNTING, f"counters say {audit.logical} logical / "
            f"{audit.record_bytes} record bytes, the index adds up to {logical} / "
            f"{footprints}", None, path))
