"""Recovery at open of one node of the ``3fs`` backend.

Recovery trusts the journal and checks it against the files: it never guesses. What it
cannot reconcile is left out of the index and remembered as a finding, for ``check`` to
report and ``check(repair=True)`` to fix (check.py), keeping the evidence.

Opened read-only, recovery draws the same conclusions and changes nothing: no journal is
created, a torn tail stays (parsing stops before it), shards keep their sparse tails. In
repair mode an unreadable journal is moved to ``quarantine/`` and a new one started: every
shard file is then an orphan, whose records ``check(repair=True)`` adopts.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from kvstored.backends.threefs.index import NodeIndex, Shard, Slot
from kvstored.backends.threefs.journal import (
    JOURNAL_NAME,
    Header,
    JournalFormatError,
    JournalWriter,
    parse,
    read_file,
    remove_stale_tmp,
)
from kvstored.backends.threefs.layout import shard_number, shard_path
from kvstored.sdk.errors import CorruptionError
from kvstored.sdk.quarantine import Quarantine
from kvstored.sdk.record import (
    VALUE_OFFSET,
    align_up,
)
from kvstored.sdk.types import OpenMode, Problem, ProblemKind, RepairAction

log = logging.getLogger(__name__)


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


@dataclass
class Recovered:
    """What recovery found: the node's journal (open for appends), its index and shards,
    and what it could not reconcile."""

    journal: JournalWriter
    index: NodeIndex
    shards: dict[int, Shard] = field(default_factory=dict)
    #: Bytes of this node's shard files, as the writer counts them.
    data_bytes: int = 0
    #: What recovery could not reconcile, for check() to report and repair.
    findings: list[Finding] = field(default_factory=list)
    #: What repair mode already did at open, for check() to report.
    reports: list[Problem] = field(default_factory=list)
    #: Byte ranges of the journal that are damaged.
    damage: list[tuple[int, int]] = field(default_factory=list)
    #: The counters to resume above.
    seq: int = 0
    next_shard: int = 1


def recover(node_dir: Path, quarantine: Quarantine, *, mode: OpenMode, node_id: str,
            root: Path, lock: threading.Lock) -> Recovered:
    """Load the node's journal and reconcile it with the shard files (see the module
    docstring). ``root`` is the backend's path, named in what to do when the journal is
    unreadable; ``lock`` the backend's lock, which guards the index from then on."""
    read_only = mode is OpenMode.READ_ONLY
    if not read_only and remove_stale_tmp(node_dir):
        log.info("3fs: removed an unfinished journal rewrite in %s", node_dir)
    files = {}
    for item in os.scandir(node_dir):
        number = shard_number(item.name)
        if number is not None and item.is_file():
            files[number] = _cut_trailing_hole(item.path, item.stat().st_size,
                                               read_only=read_only)
    path = node_dir / JOURNAL_NAME
    index = NodeIndex(node_dir, lock)
    header: Header | None = None
    base, data = 0, b""  # what follows the header, once read
    reports: list[Problem] = []
    damage: list[tuple[int, int]] = []
    if path.exists():
        try:
            header, base, data = read_file(path)
        except JournalFormatError as exc:
            if mode is not OpenMode.REPAIR:
                raise CorruptionError(
                    f"the journal of node {node_id} is unreadable ({exc}). kvstored does "
                    "not guess: restore it, or run `kvstore recover --offline "
                    f"{root} --backend 3fs --repair`, which sets it aside and adopts the "
                    "records of the shards (objects deleted since may come back)",
                    path=path) from None
            moved = quarantine.move_aside(path, f"the journal is unreadable ({exc})")
            reports.append(Problem(
                ProblemKind.CORRUPT_RECORD, f"the journal was unreadable ({exc})",
                path=str(path), action=RepairAction.REBUILT,
                action_detail=f"a new, empty journal (the damaged one is in {moved}); "
                "check(repair=True) adopts the records of the shards"))
    if header is None:
        # The generation starts from the clock so that it never repeats one a reader
        # remembers from an earlier journal of the same node.
        header = Header(time.time_ns(), 0, max(files, default=0))
        journal = (JournalWriter.empty(path, header) if read_only
                   else JournalWriter.create(path, header))
    else:
        parsed = parse(data, base)
        journal = JournalWriter(path, header, base + len(data), read_only=read_only)
        if parsed.end < base + len(data) and not read_only:
            # An append a crash interrupted (never acknowledged), or the last entries
            # damaged in place: either way they cannot be read. Keep the bytes before
            # cutting them, so that nothing unreadable is ever simply destroyed.
            tail = data[parsed.end - base:]
            kept = quarantine.copy_out("journal-tail", tail, {
                "journal": str(path), "offset": parsed.end, "length": len(tail),
                "reason": "the journal's last bytes do not parse (a torn append)"},
                suffix=".kvj")
            log.info("3fs: cutting the torn tail (%d bytes, copied to %s) off %s: an "
                     "append a crash interrupted, never acknowledged", len(tail), kept, path)
            journal.truncate(parsed.end)
        for start, stop in parsed.damaged:
            log.warning("3fs: %s bytes %d..%d are damaged; the entries there are lost "
                        "(check(repair=True) rewrites the journal)", path, start, stop)
        damage = parsed.damaged
        for entry in parsed.entries:
            index.apply(entry)
    found = Recovered(journal, index, reports=reports, damage=damage)
    for number, size in sorted(files.items()):
        name = str(shard_path(node_dir, number))
        if number in index.shards:
            continue
        if number in index.dropped:
            if not read_only:
                os.unlink(name)  # an eviction that a crash interrupted after journaling it
            continue
        found.findings.append(Finding(ProblemKind.ORPHAN, "shard file the journal does "
                                      "not name", None, name, "orphan", shard=number))
        found.data_bytes += align_up(size)
    for number in sorted(index.shards):
        name = str(shard_path(node_dir, number))
        size = files.get(number)
        keys = sorted(index.shards[number])
        if size is None:
            for key in keys:
                found.findings.append(Finding(ProblemKind.INDEX_MISMATCH, "its shard file "
                                              "is missing", key, name, "forget",
                                              slot=index.remove(key)))
            del index.shards[number]
            if keys:
                found.findings.append(Finding(ProblemKind.INDEX_MISMATCH, "shard file "
                                              "missing", None, name, "drop", shard=number))
            continue
        for key in keys:
            slot = index.objects[key]
            if slot.offset + VALUE_OFFSET + slot.size > size:
                index.remove(key)
                found.findings.append(Finding(
                    ProblemKind.TORN_WRITE, f"the record at offset {slot.offset} runs past "
                    f"the end of the file ({size} bytes)", key, name, "forget", slot=slot))
        found.shards[number] = Shard(number, name, align_up(size))
        found.data_bytes += align_up(size)
    for finding in found.findings:
        log.warning("3fs: %s: %s%s (run check(repair=True))", finding.path, finding.detail,
                    f" (key {finding.key!r})" if finding.key else "")
    found.seq = max(journal.header.seq_floor, index.max_seq)
    found.next_shard = max(journal.header.shard_floor, index.max_shard,
                           max(files, default=0)) + 1
    return found


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
