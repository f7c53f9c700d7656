"""Recovery at open, and check/repair, for one node of the ``3fs`` backend.

Recovery trusts the journal and checks it against the files: it never guesses. What it
cannot reconcile is left out of the index and remembered as a finding, for ``check`` to
report and ``check(repair=True)`` to fix, keeping the evidence (records are copied to
``quarantine/``, files moved there, never simply deleted).

Opened read-only, recovery draws the same conclusions and changes nothing: no journal is
created, a torn tail stays (parsing stops before it), shards keep their sparse tails. In
repair mode an unreadable journal is moved to ``quarantine/`` and a new one started: every
shard file is then an orphan, whose records ``check(repair=True)`` adopts.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvstored.backends.record import (
    VALUE_OFFSET,
    align_up,
    record_size,
    scan_records,
)
from kvstored.backends.threefs_index import NodeIndex, Slot, shard_number, shard_path
from kvstored.backends.threefs_journal import (
    JOURNAL_NAME,
    Entry,
    Header,
    JournalFormatError,
    JournalWriter,
    Kind,
    parse,
    read_file,
    remove_stale_tmp,
)
from kvstored.sdk.errors import CorruptionError
from kvstored.sdk.types import CheckReport, OpenMode, Problem, ProblemKind, ReadStatus

if TYPE_CHECKING:
    from kvstored.backends.threefs import ThreeFsBackend

log = logging.getLogger(__name__)
VERIFY_BATCH = 32


@dataclass
class Finding:
    """Something recovery could not reconcile; ``fix`` says what repair does about it."""

    kind: ProblemKind
    detail: str
    key: str | None
    path: str
    #: "forget" (journal a delete of ``key``), "drop" (journal a drop of ``shard``),
    #: "orphan" (adopt the file's valid records, or move it to quarantine).
    fix: str
    shard: int = 0
    slot: Slot | None = None


# -- recovery at open ----------------------------------------------------------------------


def recover(b: ThreeFsBackend) -> None:
    """Load the node's journal, reconcile it with the shard files, and set up ``b``."""
    from kvstored.backends.threefs import _Shard

    read_only = b.read_only
    if not read_only and remove_stale_tmp(b.node_dir):
        log.info("3fs: removed an unfinished journal rewrite in %s", b.node_dir)
    files = {}
    for item in os.scandir(b.node_dir):
        number = shard_number(item.name)
        if number is not None and item.is_file():
            files[number] = _cut_trailing_hole(item.path, item.stat().st_size,
                                               read_only=read_only)
    path = b.node_dir / JOURNAL_NAME
    index = NodeIndex()
    header: Header | None = None
    if path.exists():
        try:
            header, base, data = read_file(path)
        except JournalFormatError as exc:
            if b.mode is not OpenMode.REPAIR:
                raise CorruptionError(
                    f"the journal of node {b.node_id} is unreadable ({exc}). kvstored does "
                    "not guess: restore it, or run `kvstore recover --offline "
                    f"{b.root} --backend 3fs --repair`, which sets it aside and adopts the "
                    "records of the shards (objects deleted since may come back)",
                    path=path) from None
            moved = b.quarantine.move_aside(path, f"the journal is unreadable ({exc})")
            b.open_reports.append(Problem(
                ProblemKind.CORRUPT_RECORD, f"the journal was unreadable ({exc})", None,
                str(path), f"moved to {moved}; a new journal was started, and "
                "check(repair=True) adopts the records of the shards"))
    if header is None:
        # The generation starts from the clock so that it never repeats one a reader
        # remembers from an earlier journal of the same node.
        header = Header(time.time_ns(), 0, max(files, default=0))
        b.journal = (JournalWriter.empty(path, header) if read_only
                     else JournalWriter.create(path, header))
    else:
        parsed = parse(data, base)
        b.journal = JournalWriter(path, header, base + len(data), read_only=read_only)
        if parsed.end < base + len(data) and not read_only:
            # An append a crash interrupted (never acknowledged), or the last entries
            # damaged in place: either way they cannot be read. Keep the bytes before
            # cutting them, so that nothing unreadable is ever simply destroyed.
            tail = data[parsed.end - base:]
            kept = b.quarantine.copy_out("journal-tail", tail, {
                "journal": str(path), "offset": parsed.end, "length": len(tail),
                "reason": "the journal's last bytes do not parse (a torn append)"},
                suffix=".kvj")
            log.info("3fs: cutting the torn tail (%d bytes, copied to %s) off %s: an "
                     "append a crash interrupted, never acknowledged", len(tail), kept, path)
            b.journal.truncate(parsed.end)
        for start, stop in parsed.damaged:
            log.warning("3fs: %s bytes %d..%d are damaged; the entries there are lost "
                        "(check(repair=True) rewrites the journal)", path, start, stop)
        b.journal_damage = parsed.damaged
        for entry in parsed.entries:
            index.apply(entry)
    b._index = index
    findings: list[Finding] = []
    for number, size in sorted(files.items()):
        name = str(shard_path(b.node_dir, number))
        if number in index.shards:
            continue
        if number in index.dropped:
            if not read_only:
                os.unlink(name)  # an eviction that a crash interrupted after journaling it
            continue
        findings.append(Finding(ProblemKind.ORPHAN, "shard file the journal does not name",
                                None, name, "orphan", shard=number))
        b._data_bytes += align_up(size)
    now = time.monotonic()
    for number in sorted(index.shards):
        name = str(shard_path(b.node_dir, number))
        size = files.get(number)
        keys = sorted(index.shards[number])
        if size is None:
            for key in keys:
                findings.append(Finding(ProblemKind.INDEX_MISMATCH, "its shard file is "
                                        "missing", key, name, "forget",
                                        slot=index.remove(key)))
            del index.shards[number]
            if keys:
                findings.append(Finding(ProblemKind.INDEX_MISMATCH, "shard file missing",
                                        None, name, "drop", shard=number))
            continue
        for key in keys:
            slot = index.objects[key]
            if slot.offset + VALUE_OFFSET + slot.size > size:
                index.remove(key)
                findings.append(Finding(ProblemKind.TORN_WRITE, f"the record at offset "
                                        f"{slot.offset} runs past the end of the file "
                                        f"({size} bytes)", key, name, "forget", slot=slot))
        b._shards[number] = _Shard(number, name, align_up(size), last_access=now)
        b._data_bytes += align_up(size)
    for finding in findings:
        log.warning("3fs: %s: %s%s (run check(repair=True))", finding.path, finding.detail,
                    f" (key {finding.key!r})" if finding.key else "")
    b.open_problems = findings
    b._seq = max(b.journal.header.seq_floor, index.max_seq)
    b._next_shard = max(b.journal.header.shard_floor, index.max_shard,
                        max(files, default=0)) + 1
    if not read_only:
        b._maybe_compact_locked()


def _cut_trailing_hole(path: str, size: int, *, read_only: bool = False) -> int:
    """The shard that was being written when the process died was sized ahead of its
    data (a sparse tail): cut the tail back to the end of the last data, and return the
    size. Only a hole is removed, never data; a file system that cannot report holes
    keeps the file as it is (its size then overstates the shard until it is dropped).
    Read-only, the size without the tail is returned and the file is left as it is."""
    fd = os.open(path, (os.O_RDONLY if read_only else os.O_RDWR) | os.O_CLOEXEC)
    try:
        end = 0
        pos = 0
        while pos < size:
            try:
                start = os.lseek(fd, pos, os.SEEK_DATA)
            except OSError:  # ENXIO: no data after pos
                break
            pos = os.lseek(fd, start, os.SEEK_HOLE)
            end = pos
        end = min(align_up(end), size)
        if end < size and not read_only:
            os.ftruncate(fd, end)
            log.info("3fs: cut the sparse tail of %s (%d -> %d bytes)", path, size, end)
        return end
    except OSError as exc:
        log.info("3fs: cannot look for a sparse tail in %s (%s); keeping its size", path, exc)
        return size
    finally:
        os.close(fd)


# -- check and repair -----------------------------------------------------------------------


def check(b: ThreeFsBackend, repair: bool) -> CheckReport:
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
    from kvstored.backends.threefs import _Shard

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
        b._shards[finding.shard] = _Shard(finding.shard, finding.path, align_up(size),
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
