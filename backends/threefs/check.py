"""``check`` and ``check(repair=True)`` for one node of the ``3fs`` backend.

What recovery could not reconcile at open (recovery.py) is reported and, with repair,
fixed, keeping the evidence: records are copied to ``quarantine/``, files moved there,
never simply deleted. Then every live record is read back and verified.
"""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING

from kvstored.backends.record import align_up, record_size, scan_records
from kvstored.backends.threefs.index import Shard, Slot
from kvstored.backends.threefs.journal import Entry, Kind
from kvstored.backends.threefs.layout import shard_path
from kvstored.backends.threefs.recovery import Finding
from kvstored.sdk.types import CheckReport, Problem, ProblemKind, ReadStatus

if TYPE_CHECKING:
    from kvstored.backends.threefs.backend import ThreeFsBackend

log = logging.getLogger(__name__)
VERIFY_BATCH = 32


def check_node(b: ThreeFsBackend, repair: bool) -> CheckReport:
    report = CheckReport(repaired=repair)
    report.problems.extend(b.open_reports)
    if repair:
        b.open_reports = []
    with b._lock:
        findings = list(b.open_problems)
        damage = list(b.journal_damage)
        live = sorted(b._index.objects.items(), key=lambda item: item[1].seq)
    for start, stop in damage:
        report.problems.append(Problem(
            ProblemKind.CORRUPT_RECORD, f"journal bytes {start}..{stop} are damaged; the "
            "entries there are lost", None, str(b.journal.path),
            _repair_journal(b) if repair else None))
    for finding in findings:
        action = _repair_finding(b, finding) if repair else None
        report.problems.append(Problem(finding.kind, finding.detail, finding.key,
                                       finding.path, action))
    if repair:
        with b._lock:
            b.open_problems = [f for f in b.open_problems if f not in findings]
    for start in range(0, len(live), VERIFY_BATCH):
        chunk = live[start:start + VERIFY_BATCH]
        keys = [key for key, _ in chunk]
        views = [memoryview(bytearray(slot.size)) for _, slot in chunk]
        results = [int(ReadStatus.MISSING)] * len(keys)
        details: dict[int, str] = {}
        b._read_own_keys(keys, views, results, details=details)
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


def _repair_journal(b: ThreeFsBackend) -> str:
    with b._lock:
        target = _copy_range(str(b.journal.path), 0, None, "journal", b,
                             "the journal has damaged bytes", suffix=".kvj")
        b._compact_locked()
        b.journal_damage = []
    return f"copied to {target}; journal rewritten from the entries that survived"


def _repair_finding(b: ThreeFsBackend, finding: Finding) -> str:
    if finding.fix == "forget":
        copied = ""
        if finding.slot is not None and os.path.exists(finding.path):
            target = _copy_range(finding.path, finding.slot.offset,
                                 record_size(finding.slot.size),
                                 f"shard{finding.slot.shard}-at{finding.slot.offset}", b,
                                 finding.detail, key=finding.key)
            if target:
                copied = f"what remains copied to {target}; "
        with b._lock:
            b._seq += 1
            entry = Entry(Kind.DELETE, finding.key, seq=b._seq)
            b._journal_append([entry])
            b._index.apply(entry)
        return copied + "dropped from the index"
    if finding.fix == "drop":
        with b._lock:
            b._seq += 1
            b._journal_append([Entry(Kind.SHARD_DROP, shard=finding.shard, seq=b._seq)])
        return "journaled as dropped"
    return _repair_orphan(b, finding)


def _repair_orphan(b: ThreeFsBackend, finding: Finding) -> str:
    """Adopt the valid records of a shard the journal does not name (the journal was lost
    or replaced); a file with none is moved to quarantine."""
    found = _valid_records(finding.path)
    with b._lock:
        size = os.stat(finding.path).st_size
        fresh = [(key, slot) for key, slot in found if key not in b._index.objects]
        if not fresh:
            target = b.quarantine.move_aside(finding.path, "a shard file the journal does "
                                             "not name, with no valid record to adopt")
            b._data_bytes -= align_up(size)
            return f"moved to {target} (no valid record to adopt)"
        b._seq += 1
        entries = [Entry(Kind.SHARD_OPEN, shard=finding.shard, seq=b._seq)]
        for key, slot in fresh:
            entries.append(Entry(Kind.PUT, key, finding.shard, slot.seq, slot.offset,
                                 slot.size, slot.write_ns, slot.checksum))
        b._journal_append(entries)
        for entry in entries:
            b._index.apply(entry)
        b._shards[finding.shard] = Shard(finding.shard, finding.path, align_up(size),
                                          last_access=time.monotonic())
        b._next_shard = max(b._next_shard, finding.shard + 1)
    log.warning("3fs: adopted %d record(s) of %s", len(fresh), finding.path)
    return f"adopted {len(fresh)} valid record(s) into the journal"


def _valid_records(path: str) -> list[tuple[str, Slot]]:
    """Every record in a shard file whose header and value check, found without the
    journal (:func:`kvstored.backends.record.scan_records`)."""
    with open(path, "rb", buffering=0) as f:
        fd = f.fileno()
        size = os.fstat(fd).st_size
        return [(header.key, Slot(0, offset, header.value_len, header.value_crc, header.seq,
                                  header.write_ns))
                for offset, header in scan_records(lambda n, at: os.pread(fd, n, at), 0, size)]


def _quarantine_record(b: ThreeFsBackend, key: str, slot: Slot) -> str:
    path = str(shard_path(b.node_dir, slot.shard))
    target = _copy_range(path, slot.offset, record_size(slot.size),
                         f"shard{slot.shard}-at{slot.offset}", b, "the record fails its checks",
                         key=key)
    with b._lock:
        if b._index.objects.get(key) is not slot:
            return f"copied to {target}; the key was removed meanwhile"
        b._seq += 1
        entry = Entry(Kind.DELETE, key, seq=b._seq)
        b._journal_append([entry])
        b._index.apply(entry)
    log.warning("3fs: quarantined %r: record copied from %s to %s and dropped from the "
                "index", key, path, target)
    return f"copied to {target}; dropped from the index"


def _copy_range(source: str, offset: int, length: int | None, stem: str,
                b: ThreeFsBackend, reason: str, *, key: str | None = None,
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
