"""``check`` and ``check(repair=True)`` for one node of the ``3fs`` backend.

What recovery could not reconcile at open (recovery.py) is reported and, with repair,
fixed, keeping the evidence: records are copied to ``quarantine/``, files moved there,
never simply deleted. Then every live record is read back and verified (the SDK's record
pass, :func:`kvstored.sdk.check.check_records`).

The checks reach the node only through :class:`CheckedNode`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from kvstored.backends.threefs.index import Slot
from kvstored.backends.threefs.journal import JournalWriter
from kvstored.backends.threefs.recovery import Finding
from kvstored.sdk.check import CheckedBackend, check_records, start_report
from kvstored.sdk.record import record_size, scan_records
from kvstored.sdk.types import CheckReport, Problem, ProblemKind, RepairAction

log = logging.getLogger(__name__)


class CheckedNode(CheckedBackend[Slot], Protocol):
    """What the checks need of this node's backend, and nothing more
    (:class:`~kvstored.backends.threefs.backend.ThreeFsBackend` has it): what every check
    needs (:class:`~kvstored.sdk.check.CheckedBackend`), the journal, and the shard
    files."""

    @property
    def node_dir(self) -> Path: ...
    @property
    def journal(self) -> JournalWriter: ...

    def findings(self) -> tuple[list[Finding], list[tuple[int, int]]]:
        """What recovery could not reconcile, and the journal's damaged byte ranges."""
        ...

    def resolved(self, findings: Sequence[Finding]) -> None:
        """``findings`` were repaired: forget them."""
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
    report = start_report(b.open_problems, repair=repair)
    findings, damage = b.findings()
    for start, stop in damage:
        action, detail = _repair_journal(b) if repair else (None, None)
        report.problems.append(Problem(
            ProblemKind.CORRUPT_RECORD, f"journal bytes {start}..{stop} are damaged; the "
            "entries there are lost", path=str(b.journal.path), action=action,
            action_detail=detail))
    for finding in findings:
        action, detail = _repair_finding(b, finding) if repair else (None, None)
        report.problems.append(Problem(finding.kind, finding.detail, finding.key,
                                       finding.path, action, detail))
    if repair:
        b.resolved(findings)
    check_records(b, report, repair=repair)
    return report


Repaired = tuple[RepairAction, str | None]


def _repair_journal(b: CheckedNode) -> Repaired:
    target = b.quarantine.copy_range(b.journal.path, 0, None, stem="journal",
                                     suffix=".kvj", reason="the journal has damaged bytes")
    b.rewrite_journal()
    return RepairAction.REBUILT, (f"from the entries that survived; the damaged journal "
                                  f"is in {target}")


def _repair_finding(b: CheckedNode, finding: Finding) -> Repaired:
    if finding.fix == "forget":
        target = None
        if finding.slot is not None and os.path.exists(finding.path):
            target = b.quarantine.copy_range(finding.path, finding.slot.offset,
                                             record_size(finding.slot.size),
                                             reason=finding.detail, key=finding.key)
        assert finding.key is not None  # a "forget" finding names its key
        b.forget(finding.key)
        if target:  # what remains of the record is kept
            return RepairAction.QUARANTINED, target
        return RepairAction.DROPPED_FROM_INDEX, None
    if finding.fix == "drop":
        b.drop_shard(finding.shard)
        return RepairAction.DROPPED_FROM_INDEX, "the shard is journaled as dropped"
    return _repair_orphan(b, finding)


def _repair_orphan(b: CheckedNode, finding: Finding) -> Repaired:
    """Adopt the valid records of a shard the journal does not name (the journal was lost
    or replaced); a file with none is moved to quarantine."""
    adopted = b.adopt_shard(finding.shard, finding.path, _valid_records(finding.path))
    if not adopted:
        target = b.discard_shard_file(finding.path, "a shard file the journal does not "
                                      "name, with no valid record to adopt")
        return RepairAction.QUARANTINED, target
    log.warning("3fs: adopted %d record(s) of %s", adopted, finding.path)
    return RepairAction.ADDED_TO_INDEX, f"{adopted} valid record(s) journaled"


def _valid_records(path: str) -> list[tuple[str, Slot]]:
    """Every record in a shard file whose header and value check, found without the
    journal (:func:`kvstored.sdk.record.scan_records`)."""
    with open(path, "rb", buffering=0) as f:
        fd = f.fileno()
        size = os.fstat(fd).st_size
        return [(header.key, Slot(0, offset, header.value_len, header.value_crc, header.seq,
                                  header.write_ns))
                for offset, header in scan_records(lambda n, at: os.pread(fd, n, at), 0, size)]
