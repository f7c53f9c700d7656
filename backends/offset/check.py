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
from typing import TYPE_CHECKING

from crc32c import crc32c

from kvstored.backends.offset.journal import write_sync
from kvstored.backends.offset.layout import SLOT_HEADER_SIZE, Geometry, decode_slot_header
from kvstored.backends.offset.recovery import Entry, read_exact
from kvstored.backends.record import ALIGN, VALUE_OFFSET, align_up
from kvstored.native import IoError
from kvstored.sdk.errors import BackendError, CorruptionError
from kvstored.sdk.types import CheckReport, Problem, ProblemKind

if TYPE_CHECKING:
    from kvstored.backends.offset.volume import OffsetLayoutBackend

log = logging.getLogger(__name__)

#: Records (and value bytes) verified per engine submission, and the largest chunk
#: copied out at once.
CHECK_BATCH = 32
CHECK_BYTES = 64 << 20
COPY_CHUNK = 16 << 20


def check_volume(backend: OffsetLayoutBackend, repair: bool) -> CheckReport:
    report = CheckReport(repaired=repair)
    report.problems.extend(backend.open_problems)  # what this open rebuilt, once
    if repair:
        backend.open_problems = []
    _check_superblock(backend, report, repair)
    _check_checkpoint(backend, report, repair)
    with backend._lock:
        snapshot = list(backend._index.items())
    chunk: list[tuple[str, Entry]] = []
    chunk_bytes = 0
    for key, entry in snapshot:
        if chunk and (len(chunk) == CHECK_BATCH or chunk_bytes + entry.size > CHECK_BYTES):
            _check_records(backend, chunk, report, repair)
            chunk, chunk_bytes = [], 0
        chunk.append((key, entry))
        chunk_bytes += entry.size
    if chunk:
        _check_records(backend, chunk, report, repair)
    _check_index(backend, report)
    return report


def _check_superblock(backend: OffsetLayoutBackend, report: CheckReport, repair: bool) -> None:
    path = backend._file.path
    try:
        on_disk = Geometry.decode(read_exact(backend._engine, backend._file, 0, ALIGN),
                                  path=path)
        if on_disk == backend._geometry:
            return
        detail = "the superblock differs from the geometry the volume was opened with"
    except BackendError as exc:
        detail = exc.message
    action = None
    if repair:
        write_sync(backend._engine, backend._file,
                   [(backend._file, 0, backend._geometry.encode())], "rewriting the superblock")
        action = "rewrote the superblock from the open volume's geometry"
        log.warning("%s: %s; %s", path, detail, action)
    report.problems.append(Problem(ProblemKind.CORRUPT_RECORD, detail, None, path, action))


def _check_checkpoint(backend: OffsetLayoutBackend, report: CheckReport, repair: bool) -> None:
    geometry, path = backend._geometry, backend._file.path
    with backend._lock:
        generation = backend._generation
    slot = geometry.slot_offsets[generation % 2]
    head = read_exact(backend._engine, backend._file, slot, ALIGN)
    header = decode_slot_header(head, geometry)
    if header is not None and header.generation == generation:
        raw = read_exact(backend._engine, backend._file, slot,
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


def _check_records(backend: OffsetLayoutBackend, chunk: list[tuple[str, Entry]],
                   report: CheckReport, repair: bool) -> None:
    from kvstored.backends.offset.volume import record_problem

    keys = [key for key, _ in chunk]
    quarantined: list[tuple[str, Entry]] = []
    with backend.pin(keys):
        heads = [bytearray(ALIGN) for _ in chunk]
        values = [bytearray(entry.size) for _, entry in chunk]
        items = []
        for (_, entry), head, value in zip(chunk, heads, values):
            items.append((backend._file, entry.offset, head))
            items.append((backend._file, entry.offset + VALUE_OFFSET, value))
        outcomes = backend._engine.read(items)
        for n, (key, entry) in enumerate(chunk):
            with backend._lock:
                if backend._index.get(key) is not entry:
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
                    log.error("%s: could not quarantine %r: %s", backend._file.path, key, exc)
            report.problems.append(Problem(ProblemKind.CORRUPT_RECORD, problem, key,
                                           backend._file.path, action))
    for key, entry in quarantined:  # after the pins are gone, so the space is freed now
        _drop(backend, key, entry)


def _quarantine(backend: OffsetLayoutBackend, key: str, entry: Entry, reason: str) -> str:
    """Copy the record's whole extent out of the volume, with a note; return the action."""
    def chunks():
        done, total = 0, entry.footprint
        while done < total:
            length = min(COPY_CHUNK, total - done)
            buf = bytearray(length)
            [got] = backend._engine.read([(backend._file, entry.offset + done, buf)])
            if isinstance(got, IoError):
                raise CorruptionError(f"copying the record out failed: {got}", key=key)
            yield memoryview(buf)[:got]
            if got < length:
                return  # the volume ends early: keep what there is
            done += length

    note = {"key": key, "volume": backend._file.path, "record_offset": entry.offset,
            "record_length": entry.footprint, "value_length": entry.size, "seq": entry.seq,
            "value_crc32c": entry.crc, "reason": reason}
    target = backend.quarantine.copy_out(f"{entry.offset:012x}", chunks(), note)
    log.warning("%s: quarantined the record of %r at offset %d (%s) to %s",
                backend._file.path, key, entry.offset, reason, target)
    return f"copied to {target} and dropped from the index"


def _drop(backend: OffsetLayoutBackend, key: str, entry: Entry) -> None:
    """Delete a quarantined record durably (a tombstone keeps it out after a crash),
    unless the key was deleted, or deleted and written again, meanwhile."""
    with backend._lock:
        if backend._index.get(key) is not entry:
            return
        backend._detach_locked(key, entry)
    backend._retire([(key, entry)], None, evicting=False)


def _check_index(backend: OffsetLayoutBackend, report: CheckReport) -> None:
    geometry, path = backend._geometry, backend._file.path
    with backend._lock:
        entries = sorted(backend._index.items(), key=lambda item: item[1].offset)
        logical = sum(entry.size for _, entry in entries)
        footprints = sum(entry.footprint for _, entry in entries)
        counters = (backend._logical, backend._records_bytes)
        unallocated = [key for key, entry in entries
                       if (entry.offset - geometry.data_offset) not in backend._alloc
                       or backend._alloc.allocation_size(entry.offset - geometry.data_offset)
                       != entry.footprint]
    previous_end, previous_key = geometry.data_offset, None
    for key, entry in entries:
        if entry.offset < previous_end:
            report.problems.append(Problem(
                ProblemKind.INDEX_MISMATCH,
                f"the record at {entry.offset} overlaps that of {previous_key!r}", key, path))
        if entry.offset + entry.footprint > geometry.volume_size:
            report.problems.append(Problem(ProblemKind.INDEX_MISMATCH,
                                           "the record extends past the volume", key, path))
        previous_end, previous_key = entry.offset + entry.footprint, key
    for key in unallocated:
        report.problems.append(Problem(ProblemKind.ACCOUNTING, "the record's extent is not "
                                       "allocated with its size", key, path))
    if counters != (logical, footprints):
        report.problems.append(Problem(
            ProblemKind.ACCOUNTING, f"counters say {counters[0]} logical / {counters[1]} "
            f"record bytes, the index adds up to {logical} / {footprints}", None, path))
