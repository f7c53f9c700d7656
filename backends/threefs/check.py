"""``check`` and ``check(repair=True)`` for one node of the ``3fs`` backend.

What recovery could not reconcile at open (recovery.py) is reported and, with repair,
fixed, keeping the evidence: records are copied to ``quarantine/``, files moved there,
never simply deleted. Then every live record is read back and verified.

The checks reach the node only through :class:`CheckedNode`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from kvstored.backends.record import record_size, scan_records
from kvstored.backends.threefs.index import Slot
from kvstored.backends.threefs.journal import JournalWriter
from kvstored.backends.threefs.layout import shard_path
from kvstored.backends.threefs.recovery import Finding
from kvstored.sdk.quarantine import Quarantine
from kvstored.sdk.types import CheckReport, Problem, ProblemKind, ReadStatus

log = logging.getLogger(__name__)
VERIFY_BATCH = 32


class CheckedNode(Protocol):
    """What the checks need of this node's backend, and nothing more
    (:class:`~kvstored.backends.threefs.backend.ThreeFsBackend` has it)."""

    @property
    def node_dir(self) -> Path: ...
    @property
    def quarantine(self) -> Quarantine: ...
    @property
    def journal(self) -> JournalWriter | None: ...
    @property
    def open_reports(self) -> list[Problem]: ...

    def findings(self) -> tuple[list[Finding], list[tuple[int, int]]]:
        """What recovery could not reconcile, and the journal's damaged byte ranges."""
        ...

    def resolved(self, findings: Sequence[Finding]) -> None:
        """``findings`` were repaired: forget them."""
        ...

    def indexed(self) -> list[tuple[str, Slot]]:
        """This node's live objects, oldest first."""
        ...

    def read_back(self, keys: Sequence[str], views: Sequence[memoryview]
                  ) -> tuple[list[int], dict[int, str]]:
        """Read and verify this node's ``keys``: each one's status, and why those that
        failed did."""
        ...

    def rewrite_journal(self) -> None:
        """Rewrite the journal from what is live, and forget the damage."""
        ...

    def forget(self, key: str, slot: Slot | None = None) -> bool:
        """Journal a delete of ``key`` (only if it is still ``slot``, when given)."""
        ...

    def drop_shard(self, number: int) -> None:
        """Journal shard ``number`` as dropped."""
        ...

    def adopt_shard(self, number: int, path: str, records: Sequence[tuple[str, Slot]]
                    ) -> int:
        """Journal an unnamed shard file and those of ``records`` whose key is not
        stored; return how many were adopted (0: nothing was journaled)."""
        ...

    def discard_shard_file(self, path: str, why: str) -> str:
        """Move a shard file nothing names into the quarantine; return where it went."""
        ...


def check_node(b: CheckedNode, repair: bool) -> CheckReport:
    report = CheckReport(repaired=repair)
    report.problems.extend(b.open_reports)
    if repair:
        b.open_reports.clear()
    findings, damage = b.findings()
    live = b.indexed()
    for start, stop in damage:
        report.problems.append(Problem(
            ProblemKind.CORRUPT_RECORD, f"journal bytes {start}..{stop} are damaged; the "
            "entries there are lost", None, _journal_path(b),
            _repair_journal(b) if repair else None))
    for finding in findings:
        action = _repair_finding(b, finding) if repair else None
        report.problems.append(Problem(finding.kind, finding.detail, finding.key,
                                       finding.path, action))
    if repair:
        b.resolved(findings)
    for start in range(0, len(live), VERIFY_BATCH):
        chunk = live[start:start + VERIFY_BATCH]
        keys = [key for key, _ in chunk]
        views = [memoryview(bytearray(slot.size)) for _, slot in chunk]
        results, details = b.read_back(keys, views)
        for n, (key, slot) in enumerate(chunk):
            if results[n] == ReadStatus.MISSING:
                continue  # deleted or evicted since the snapshot
            report.records_checked += 1
            if results[n] >= 0:
                continue
            path = str(shard_path(b.node_dir, slot.shard))
            action = _quarantine_record(b, key, slot) if repair else None
            report.problems.append(Problem(ProblemKind.CORRUPT_RECORD,
                                           details.get(n, "the record fails its checks"),
                                           key, path, action))
    return report


def _journal_path(b: CheckedNode) -> str:
    assert b.journal is not None  # an open node has its journal
    return str(b.journal.path)


def _repair_journal(b: CheckedNode) -> str:
    target = _copy_range(_journal_path(b), 0, None, "journal", b,
                         "the journal has damaged bytes", suffix=".kvj")
    b.rewrite_journal()
    return f"copied to {target}; journal rewritten from the entries that survived"


def _repair_finding(b: CheckedNode, finding: Finding) -> str:
    if finding.fix == "forget":
        copied = ""
        if finding.slot is not None and os.path.exists(finding.path):
            target = _copy_range(finding.path, finding.slot.offset,
                                 record_size(finding.slot.size),
                                 f"shard{finding.slot.shard}-at{finding.slot.offset}", b,
                                 finding.detail, key=finding.key)
            if target:
                copied = f"what remains copied to {target}; "
        assert finding.key is not None  # a "forget" finding names its key
        b.forget(finding.key)
        return copied + "dropped from the index"
    if finding.fix == "drop":
        b.drop_shard(finding.shard)
        return "journaled as dropped"
    return _repair_orphan(b, finding)


def _repair_orphan(b: CheckedNode, finding: Finding) -> str:
    """Adopt the valid records of a shard the journal does not name (the journal was lost
    or replaced); a file with none is moved to quarantine."""
    adopted = b.adopt_shard(finding.shard, finding.path, _valid_records(finding.path))
    if not adopted:
        target = b.discard_shard_file(finding.path, "a shard file the journal does not "
                                      "name, with no valid record to adopt")
        return f"moved to {target} (no valid record to adopt)"
    log.warning("3fs: adopted %d record(s) of %s", adopted, finding.path)
    return f"adopted {adopted} valid record(s) into the journal"


def _valid_records(path: str) -> list[tuple[str, Slot]]:
    """Every record in a shard file whose header and value check, found without the
    journal (:func:`kvstored.backends.record.scan_records`)."""
    with open(path, "rb", buffering=0) as f:
        fd = f.fileno()
        size = os.fstat(fd).st_size
        return [(header.key, Slot(0, offset, header.value_len, header.value_crc, header.seq,
                                  header.write_ns))
                for offset, header in scan_records(lambda n, at: os.pread(fd, n, at), 0, size)]


def _quarantine_record(b: CheckedNode, key: str, slot: Slot) -> str:
    path = str(shard_path(b.node_dir, slot.shard))
    target = _copy_range(path, slot.offset, record_size(slot.size),
                         f"shard{slot.shard}-at{slot.offset}", b, "the record fails its checks",
                         key=key)
    if not b.forget(key, slot):
        return f"copied to {target}; the key was removed meanwhile"
    log.warning("3fs: quarantined %r: record copied from %s to %s and dropped from the "
                "index", key, path, target)
    return f"copied to {target}; dropped from the index"


def _copy_range(source: str, offset: int, length: int | None, stem: str,
                b: CheckedNode, reason: str, *, key: str | None = None,
                suffix: str = ".kvr") -> str | None:
    """Copy ``length`` bytes (None: to the end) of ``source`` at ``offset`` into the
    quarantine as ``stem``, durably; its path, or None when there was nothing to copy."""
    with open(source, "rb") as f:
        f.seek(offset)
        data = f.read() if length is None else f.read(length)
    if not data:
        return None
    return b.quarantine.copy_out(stem, data, {"key": key, "source": source, "offset": offset,
                                              "length": len(data), "reason": reason},
                                 suffix=suffix)
