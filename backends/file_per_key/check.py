"""``check`` and ``check(repair=True)`` for the ``file-per-key`` backend.

What is examined, and what repair does about it:

- files in ``tmp/`` (writes that never finished): TORN_WRITE; repair quarantines them;
- every record file: its header, its place, its length and its value's CRC-32C; a file
  that fails is CORRUPT_RECORD, and repair moves it to the quarantine and drops its key;
- a valid record the index does not hold: ORPHAN; repair adds it to the index;
- an indexed key whose file is gone: INDEX_MISMATCH; repair drops it from the index.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Protocol

from kvstored.backends.file_per_key.recovery import Entry, leftovers, read_entry, record_files
from kvstored.sdk.errors import CorruptionError
from kvstored.sdk.quarantine import Quarantine
from kvstored.sdk.record import VALUE_OFFSET, value_checksum
from kvstored.sdk.types import CheckReport, Problem, ProblemKind, RepairAction


class CheckedFiles(Protocol):
    """What the checks need of the backend, and nothing more (FilePerKeyBackend has it)."""

    @property
    def objects_dir(self) -> Path: ...
    @property
    def tmp_dir(self) -> Path: ...
    @property
    def read_only(self) -> bool: ...
    @property
    def quarantine(self) -> Quarantine: ...
    @property
    def open_problems(self) -> list[Problem]: ...

    def indexed(self) -> dict[str, Entry]:
        """Every indexed object now."""
        ...

    def owner_of(self, path: Path) -> str | None:
        """The key whose indexed record is the file ``path``, if any."""
        ...

    def forget(self, key: str) -> None:
        """Drop ``key`` from the index (its file is gone or set aside)."""
        ...

    def adopt(self, key: str, entry: Entry) -> None:
        """Index a valid record nobody indexed."""
        ...


def check_store(b: CheckedFiles, repair: bool) -> CheckReport:
    report = CheckReport(repaired=repair)
    report.problems.extend(b.open_problems)
    if repair:
        b.open_problems.clear()
    index = b.indexed()
    seen: set[str] = set()
    for leftover in leftovers(b.tmp_dir):
        if b.read_only:
            report.problems.append(Problem(
                ProblemKind.TORN_WRITE, "a write that never finished", path=str(leftover),
                action=RepairAction.LEFT_FOR_NEXT_OPEN))
            continue
        _problem(b, report, repair, ProblemKind.TORN_WRITE, "unfinished write", None,
                 leftover)
    for path in record_files(b.objects_dir):
        report.records_checked += 1
        try:
            key, entry = read_entry(path)
            if value_checksum(_read_value(path, entry.size)) != entry.checksum:
                raise CorruptionError("value fails its checksum", key=key, path=path)
        except CorruptionError as exc:
            owner = b.owner_of(path)
            if repair and owner is not None:
                b.forget(owner)
            _problem(b, report, repair, ProblemKind.CORRUPT_RECORD, exc.message,
                     exc.key or owner, path)
            continue
        except OSError as exc:
            _problem(b, report, repair, ProblemKind.CORRUPT_RECORD, str(exc), None, path)
            continue
        seen.add(key)
        known = index.get(key)
        if known is None:
            action = None
            if repair:
                b.adopt(key, entry)
                action = RepairAction.ADDED_TO_INDEX
            report.problems.append(Problem(ProblemKind.ORPHAN, "valid record missing from "
                                           "the index", key, str(path), action))
    still_indexed = {k: e for k, e in b.indexed().items() if k in index}
    for key, entry in still_indexed.items():
        if key not in seen and not os.path.exists(entry.path):
            action = None
            if repair:
                b.forget(key)
                action = RepairAction.DROPPED_FROM_INDEX
            report.problems.append(Problem(ProblemKind.INDEX_MISMATCH, "indexed record "
                                           "has no file", key, entry.path, action))
    return report


def _problem(b: CheckedFiles, report: CheckReport, repair: bool, kind: ProblemKind,
             detail: str, key: str | None, path: Path) -> None:
    where = b.quarantine.move_aside(path, detail) if repair else None
    report.problems.append(Problem(kind, detail, key, str(path),
                                   RepairAction.QUARANTINED if where else None, where))


def _read_value(path: Path, size: int) -> bytearray:
    buf = bytearray(size)
    with open(path, "rb", buffering=0) as f:
        f.seek(VALUE_OFFSET)
        got = f.readinto(buf)
    if got != size:
        raise CorruptionError(f"value is short ({got} of {size} bytes)", path=path)
    return buf
