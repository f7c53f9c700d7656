"""``check`` and ``check(repair=True)`` for the bucket backend.

What is examined, and what repair does about it:

- What recovery did at open (buckets dropped, unfinished writes removed) is reported by
  the next check, with the action already taken; a repairing check acknowledges it.
- Files in ``buckets/`` that no bucket owns (a data or index file of an unknown bucket,
  a stray temporary file, a name kvstored never writes): ORPHAN or TORN_WRITE; repair
  moves them to ``quarantine/``.
- Each bucket's index file is re-read and compared with memory: INDEX_MISMATCH if it
  fails its CRC or lists other records; repair rewrites it from memory (which was
  loaded from a verified index and kept up to date since).
- Every visible record is read back through the io engine and verified (the SDK's
  record pass, :func:`kvstored.sdk.check.check_records`): CORRUPT_RECORD for each that
  fails; repair copies the record's bytes to ``quarantine/`` with a JSON note and flags
  the key QUARANTINED in the index, durably.
- Each bucket's ``st_blocks`` is compared with what usage counts: ACCOUNTING; repair
  corrects the figure.

Checks run one at a time; reads, writes and deletes go on meanwhile.
"""

from __future__ import annotations

import os
import threading
from typing import Protocol

from kvstored.backends.bucket.index import IndexEntry, read_index
from kvstored.backends.bucket.layout import list_buckets
from kvstored.backends.bucket.state import Bucket, Slot
from kvstored.sdk.check import RecordStore, check_records, start_report
from kvstored.sdk.errors import CorruptionError
from kvstored.sdk.quarantine import Quarantine
from kvstored.sdk.types import CheckReport, Problem, ProblemKind, RepairAction


class CheckedStore(RecordStore[Slot], Protocol):
    """What the checks need of the backend, and nothing more (BucketBackend has it): the
    record pass's :class:`~kvstored.sdk.check.RecordStore`, and the buckets' files."""

    @property
    def buckets_dir(self) -> str: ...
    @property
    def quarantine(self) -> Quarantine: ...

    def loaded_buckets(self) -> list[Bucket]:
        """The buckets that make up the store now."""
        ...

    def busy_bucket_ids(self) -> set[int]:
        """Ids of the buckets whose files are in use: loaded, being written or removed."""
        ...

    def index_entries(self, bucket: Bucket) -> list[IndexEntry]:
        """What ``bucket``'s index file should hold, from memory (hold its meta_lock)."""
        ...

    def rewrite_index(self, bucket: Bucket) -> None:
        """Make ``bucket``'s index file say what memory says, durably."""
        ...

    def counted_physical(self, bucket: Bucket) -> int | None:
        """The disk bytes usage counts for ``bucket``; None once it left the store."""
        ...

    def correct_physical(self, bucket: Bucket, actual: int) -> None:
        """Count ``actual`` disk bytes for ``bucket`` from now on."""
        ...


class Checker:
    """Runs the checks above against one open backend."""

    def __init__(self, backend: CheckedStore, recovery_problems: list[Problem],
                 unindexed: set[int] = frozenset()) -> None:
        self.backend = backend
        self._recovery_problems = list(recovery_problems)
        #: Buckets whose index file recovery found damaged and, read-only, left as it is.
        self._unindexed = set(unindexed)
        self._lock = threading.Lock()

    def run(self, repair: bool) -> CheckReport:
        with self._lock:
            report = start_report(self._recovery_problems, repair=repair)
            self._check_files(report, repair)
            for bucket in self.backend.loaded_buckets():
                self._check_index(bucket, report, repair)
                self._check_blocks(bucket, report, repair)
            check_records(self.backend, report, repair=repair)
            return report

    # -- files nobody owns -------------------------------------------------------------

    def _check_files(self, report: CheckReport, repair: bool) -> None:
        backend = self.backend
        listing = list_buckets(backend.buckets_dir)
        busy = backend.busy_bucket_ids()
        found: list[tuple[ProblemKind, str, str]] = []
        for bucket_id, entry in listing.tmp:
            if bucket_id not in busy:  # a known bucket's temporary file is a rewrite
                found.append((ProblemKind.TORN_WRITE, "a temporary index file no write "
                              "owns", entry.path))
        for bucket_id, entry in [*listing.data.items(), *listing.index.items()]:
            if bucket_id not in busy:
                found.append((ProblemKind.ORPHAN, "a file of no known bucket", entry.path))
        for entry in listing.unknown:
            found.append((ProblemKind.ORPHAN, "a file kvstored does not write", entry.path))
        # Left on disk by a read-only open, and already reported by recovery, with what
        # the next read-write open does about it.
        reported = {p.path for p in self._recovery_problems}
        for kind, detail, path in found:
            if path in reported:
                continue
            action = where = None
            if repair:
                try:
                    where = backend.quarantine.move_aside(path, detail)
                except FileNotFoundError:
                    continue  # its owner removed it meanwhile: nothing was wrong
                action = RepairAction.QUARANTINED
            report.problems.append(Problem(kind, detail, path=path, action=action,
                                           action_detail=where))

    # -- one bucket ----------------------------------------------------------------------

    def _check_index(self, bucket: Bucket, report: CheckReport, repair: bool) -> None:
        backend = self.backend
        if bucket.id in self._unindexed:
            return  # reported by recovery, with what it found in the data file
        with bucket.meta_lock:
            if bucket.files_gone:
                return
            expected = backend.index_entries(bucket)
            try:
                _, on_disk = read_index(bucket.index_path)
                detail = _compare(expected, on_disk)
            except CorruptionError as exc:
                detail = exc.message
            except FileNotFoundError:
                detail = "the index file is missing"
        if detail is None:
            return
        action = None
        if repair:
            backend.rewrite_index(bucket)
            action = RepairAction.REBUILT
        report.problems.append(Problem(ProblemKind.INDEX_MISMATCH, detail,
                                       path=bucket.index_path, action=action,
                                       action_detail="from memory" if action else None))

    def _check_blocks(self, bucket: Bucket, report: CheckReport, repair: bool) -> None:
        backend = self.backend
        with bucket.meta_lock:
            if bucket.files_gone:
                return
            try:
                actual = (os.stat(bucket.data_path).st_blocks
                          + os.stat(bucket.index_path).st_blocks) * 512
            except FileNotFoundError:
                return  # reported by the index and record checks
        counted = backend.counted_physical(bucket)
        if counted is None or actual == counted:
            return
        if repair:
            backend.correct_physical(bucket, actual)
        report.problems.append(Problem(
            ProblemKind.ACCOUNTING, f"bucket {bucket.id:016x} occupies {actual} bytes, "
            f"usage counts {counted}", path=bucket.data_path,
            action=RepairAction.CORRECTED if repair else None))


def _compare(expected: list, on_disk: list) -> str | None:
    """Why the on-disk entries are not the in-memory ones, or None if they agree.

    A key flagged gone in memory but not yet on disk is a delete whose index rewrite is
    in flight, not a mismatch.
    """
    if len(expected) != len(on_disk):
        return f"the index lists {len(on_disk)} records, memory {len(expected)}"
    for mine, theirs in zip(expected, on_disk):
        if mine[:-1] != theirs[:-1]:
            return f"the index entry at record offset {theirs.record_offset} differs"
        if mine.flags != theirs.flags and (theirs.flags & ~mine.flags):
            return (f"the index flags key {theirs.key!r} gone, memory has it visible")
    return None
