"""``check`` and ``check(repair=True)`` for the ``file-per-key`` backend.

What is examined, and what repair does about it:

- files in ``tmp/`` (writes that never finished): TORN_WRITE; repair quarantines them
  (opened read-only, they are left for the next read-write open to remove);
- every indexed object, read back and verified against the index (the SDK's record
  pass, :func:`kvstored.sdk.check.check_records`): CORRUPT_RECORD for one that fails,
  INDEX_MISMATCH for one whose file is gone; repair moves the file to the quarantine
  and drops the key;
- every other file under ``objects/``: a valid record nobody indexed is an ORPHAN, which
  repair adds to the index; anything else is CORRUPT_RECORD, which repair quarantines.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from kvstored.backends.file_per_key.recovery import Entry, leftovers, read_entry, record_files
from kvstored.sdk.check import CheckedBackend, check_records, start_report
from kvstored.sdk.errors import CorruptionError
from kvstored.sdk.record import VALUE_OFFSET, value_checksum
from kvstored.sdk.types import CheckReport, Problem, ProblemKind, RepairAction


class CheckedFiles(CheckedBackend[Entry], Protocol):
    """What the checks need of the backend, and nothing more (FilePerKeyBackend has it):
    what every check needs (:class:`~kvstored.sdk.check.CheckedBackend`), and its
    folders."""

    @property
    def objects_dir(self) -> Path: ...
    @property
    def tmp_dir(self) -> Path: ...

    def adopt(self, key: str, entry: Entry) -> bool:
        """Index a valid record nobody indexed; False if its key is indexed by now."""
        ...


def check_store(b: CheckedFiles, repair: bool) -> CheckReport:
    report = start_report(b.open_problems, repair=repair)
    for leftover in leftovers(b.tmp_dir):
        if b.read_only:
            report.problems.append(Problem(
                ProblemKind.TORN_WRITE, "a write that never finished", path=str(leftover),
                action=RepairAction.LEFT_FOR_NEXT_OPEN))
        else:
            _set_aside(b, report, repair, ProblemKind.TORN_WRITE, "unfinished write", leftover)
    indexed = {entry.path for _, entry in b.indexed()}
    check_records(b, report, repair=repair)
    for path in record_files(b.objects_dir):
        if str(path) not in indexed:
            _check_unindexed(b, report, repair, path)
    return report


def _check_unindexed(b: CheckedFiles, report: CheckReport, repair: bool, path: Path) -> None:
    """A file no index entry names: with no index to compare against, the record must
    pass its own checks (header CRC, place, length, value CRC) to be adopted."""
    report.records_checked += 1
    try:
        key, entry = read_entry(path)
        if value_checksum(_read_value(path, entry.size)) != entry.checksum:
            raise CorruptionError("value fails its checksum", key=key, path=path)
    except FileNotFoundError:
        return  # written and indexed, or deleted, since the index was looked at
    except (CorruptionError, OSError) as exc:
        detail = exc.message if isinstance(exc, CorruptionError) else str(exc)
        _set_aside(b, report, repair, ProblemKind.CORRUPT_RECORD, detail, path)
        return
    action = RepairAction.ADDED_TO_INDEX if repair and b.adopt(key, entry) else None
    report.problems.append(Problem(ProblemKind.ORPHAN, "valid record missing from the index",
                                   key, str(path), action))


def _set_aside(b: CheckedFiles, report: CheckReport, repair: bool, kind: ProblemKind,
               detail: str, path: Path) -> None:
    where = b.quarantine.move_aside(path, detail) if repair else None
    report.problems.append(Problem(kind, detail, path=str(path),
                                   action=RepairAction.QUARANTINED if where else None,
                                   action_detail=where))


def _read_value(path: Path, size: int) -> bytearray:
    buf = bytearray(size)
    with open(path, "rb", buffering=0) as f:
        f.seek(VALUE_OFFSET)
        got = f.readinto(buf)
    if got != size:
        raise CorruptionError(f"value is short ({got} of {size} bytes)", path=path)
    return buf
