"""The record pass of ``check()``: every indexed record read back and verified, and what
repair does about one that fails. Written once, for every backend whose objects are in
an index.

A check starts from :func:`start_report`: what the backend's open found and did about it
(a rebuilt stamp, unfinished writes removed) is in every report until a repairing check
has reported it.

A backend hands :func:`check_records` a :class:`RecordStore`, the four things the pass
needs of it and nothing more. A record that fails is reported as
:attr:`~kvstored.sdk.ProblemKind.CORRUPT_RECORD` (or, when its file is gone altogether,
:attr:`~kvstored.sdk.ProblemKind.INDEX_MISMATCH`); with ``repair`` the backend sets it
aside, its bytes to the quarantine and its key out of the index, durably, and the problem
says :attr:`~kvstored.sdk.RepairAction.QUARANTINED` and where the bytes went.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar

from kvstored.sdk.index import IndexEntry
from kvstored.sdk.quarantine import Quarantine
from kvstored.sdk.record import ReadOutcome
from kvstored.sdk.types import CheckReport, Problem, ProblemKind, ReadStatus, RepairAction

#: Records, and value bytes, read back per batch.
CHECK_BATCH = 32
CHECK_BATCH_BYTES = 32 << 20

E = TypeVar("E", bound=IndexEntry)


class RecordStore(Protocol[E]):
    """What the record pass needs of a backend."""

    def indexed(self) -> Sequence[tuple[str, E]]:
        """Every indexed object now, as (key, entry)."""
        ...

    def read_back(self, records: Sequence[tuple[str, E]]) -> list[ReadOutcome | None]:
        """Read and verify each record (``sdk.record.verified_read``); None for one that
        is no longer indexed (deleted or evicted meanwhile)."""
        ...

    def set_aside(self, key: str, entry: E, reason: str) -> str | None:
        """Copy (or move) the record's bytes into the quarantine, then take ``key`` out
        of the index durably (unless it changed meanwhile). Returns where the bytes went,
        or None when there were none left to keep."""
        ...

    def record_path(self, entry: E) -> str:
        """The file or device the record is in (for the report)."""
        ...


class CheckedBackend(RecordStore[E], Protocol):
    """A :class:`RecordStore` with what a backend's own checks need besides: whether
    they may change anything (a read-only open may not), where repair puts the evidence,
    and what the open found (:func:`start_report`)."""

    @property
    def read_only(self) -> bool: ...
    @property
    def quarantine(self) -> Quarantine: ...
    @property
    def open_problems(self) -> list[Problem]: ...


def start_report(open_problems: list[Problem], *, repair: bool) -> CheckReport:
    """A new report, holding ``open_problems``: what the open found, with what it did
    about each. Every check reports them until a repairing one has, which empties the
    list (it is the backend's own)."""
    report = CheckReport(problems=list(open_problems), repaired=repair)
    if repair:
        open_problems.clear()
    return report


def check_records(store: RecordStore[E], report: CheckReport, *, repair: bool) -> None:
    """Read back every indexed record of ``store``, count them in ``report``, and report
    (with ``repair``: set aside) each one that fails."""
    batch: list[tuple[str, E]] = []
    size = 0
    for item in store.indexed():
        if batch and (len(batch) >= CHECK_BATCH or size + item[1].size > CHECK_BATCH_BYTES):
            _check_batch(store, batch, report, repair)
            batch, size = [], 0
        batch.append(item)
        size += item[1].size
    if batch:
        _check_batch(store, batch, report, repair)


def _check_batch(store: RecordStore[E], batch: list[tuple[str, E]], report: CheckReport,
                 repair: bool) -> None:
    for (key, entry), outcome in zip(batch, store.read_back(batch)):
        if outcome is None:
            continue  # deleted or evicted since the snapshot
        report.records_checked += 1
        if outcome.ok:
            continue
        gone = outcome.status == ReadStatus.MISSING
        reason = outcome.reason or ("its file is missing" if gone else "it fails its checks")
        action = where = None
        if repair:
            where = store.set_aside(key, entry, reason)
            action = RepairAction.QUARANTINED if where else RepairAction.DROPPED_FROM_INDEX
        report.problems.append(Problem(
            ProblemKind.INDEX_MISMATCH if gone else ProblemKind.CORRUPT_RECORD, reason,
            key=key, path=store.record_path(entry), action=action, action_detail=where))
