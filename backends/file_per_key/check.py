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
from typing import TYPE_CHECKING

from kvstored.backends.file_per_key.recovery import leftovers, read_entry, record_files
from kvstored.backends.record import VALUE_OFFSET, value_checksum
from kvstored.sdk.errors import CorruptionError
from kvstored.sdk.types import CheckReport, Problem, ProblemKind

if TYPE_CHECKING:
    from kvstored.backends.file_per_key.backend import FilePerKeyBackend


def check_store(b: FilePerKeyBackend, repair: bool) -> CheckReport:
    report = CheckReport(repaired=repair)
    report.problems.extend(b.open_problems)
    if repair:
        b.open_problems = []
    with b._lock:
        index = dict(b._index)
    seen: set[str] = set()
    for leftover in leftovers(b.tmp_dir):
        if b.read_only:
            report.problems.append(Problem(
                ProblemKind.TORN_WRITE, "a write that never finished", None,
                str(leftover), "left in place (opened read-only); the next read-write "
                "open removes it"))
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
            with b._lock:
                owner = next((k for k, e in b._index.items() if e.path == str(path)), None)
                if repair and owner is not None:
                    b._forget_locked(owner)
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
                with b._lock:
                    b._adopt_locked(key, entry)
                action = "added to the index"
            report.problems.append(Problem(ProblemKind.ORPHAN, "valid record missing from "
                                           "the index", key, str(path), action))
    with b._lock:
        still_indexed = {k: e for k, e in b._index.items() if k in index}
    for key, entry in still_indexed.items():
        if key not in seen and not os.path.exists(entry.path):
            action = None
            if repair:
                with b._lock:
                    b._forget_locked(key)
                action = "dropped from the index"
            report.problems.append(Problem(ProblemKind.INDEX_MISMATCH, "indexed record "
                                           "has no file", key, entry.path, action))
    return report


def _problem(b: FilePerKeyBackend, report: CheckReport, repair: bool, kind: ProblemKind,
             detail: str, key: str | None, path: Path) -> None:
    action = f"quarantined to {b.quarantine.move_aside(path, detail)}" if repair else None
    report.problems.append(Problem(kind, detail, key, str(path), action))


def _read_value(path: Path, size: int) -> bytearray:
    buf = bytearray(size)
    with open(path, "rb", buffering=0) as f:
        f.seek(VALUE_OFFSET)
        got = f.readinto(buf)
    if got != size:
        raise CorruptionError(f"value is short ({got} of {size} bytes)", path=path)
    return buf
