"""``check`` and ``check(repair=True)`` for the offset layout.

What is examined:

- the superblock, against the geometry the backend opened with;
- the newest checkpoint slot (header and payload CRC);
- every indexed record, read back and verified (the SDK's record pass,
  :func:`kvstored.sdk.check.check_records`);
- the in-memory index: extents inside the data area, no overlaps, each extent allocated
  in the allocator with the record's footprint, the byte counters.

What repair does:

- a bad record is *copied out* (the bytes of its whole extent) to the quarantine folder
  as ``<time>-<volume>-<offset in hex>.kvr`` with a ``.json`` note saying what it was and
  why it was taken out, then deleted like any key (a tombstone, so it stays gone after a
  crash);
- a damaged superblock or checkpoint is rewritten from memory.

Free space is not examined: records of deleted objects legitimately remain there until
the space is reused, and nothing points at them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Protocol

from crc32c import crc32c

from kvstored.backends.offset.journal import write_sync
from kvstored.backends.offset.layout import SLOT_HEADER_SIZE, Geometry, decode_slot_header
from kvstored.backends.offset.recovery import Entry, read_exact
from kvstored.native import IoEngine, IoFile
from kvstored.sdk.check import CheckedBackend, check_records, start_report
from kvstored.sdk.errors import BackendError
from kvstored.sdk.record import ALIGN, align_up
from kvstored.sdk.types import CheckReport, Problem, ProblemKind, RepairAction

log = logging.getLogger(__name__)


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


class CheckedVolume(CheckedBackend[Entry], Protocol):
    """What the checks need of an open offset-layout volume, and nothing more
    (:class:`~kvstored.backends.offset.volume.OffsetLayoutBackend` has it): what every
    check needs (:class:`~kvstored.sdk.check.CheckedBackend`), and the volume's own
    metadata."""

    @property
    def engine(self) -> IoEngine: ...
    @property
    def volume_file(self) -> IoFile: ...
    @property
    def geometry(self) -> Geometry: ...
    @property
    def generation(self) -> int: ...

    def checkpoint(self) -> None:
        """Write a checkpoint of the index now."""
        ...

    def audit(self) -> IndexAudit:
        """The index, its counters and the allocator, taken together."""
        ...


def check_volume(backend: CheckedVolume, repair: bool) -> CheckReport:
    report = start_report(backend.open_problems, repair=repair)  # what this open rebuilt
    _check_superblock(backend, report, repair)
    _check_checkpoint(backend, report, repair)
    check_records(backend, report, repair=repair)
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
    action = rebuilt = None
    if repair:
        volume = backend.volume_file
        write_sync(backend.engine, volume, [(volume, 0, backend.geometry.encode())],
                   "rewriting the superblock")
        action, rebuilt = RepairAction.REBUILT, "from the open volume's geometry"
        log.warning("%s: %s; rewrote the superblock %s", path, detail, rebuilt)
    report.problems.append(Problem(ProblemKind.CORRUPT_RECORD, detail, path=path,
                                   action=action, action_detail=rebuilt))


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
    action = rebuilt = None
    if repair:
        backend.checkpoint()
        action, rebuilt = RepairAction.REBUILT, "a new checkpoint of the index in memory"
    report.problems.append(Problem(ProblemKind.INDEX_MISMATCH, detail, path=path,
                                   action=action, action_detail=rebuilt))


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
