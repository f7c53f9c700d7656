"""Open-time recovery of a bucket store: load every index, and tidy what a crash left.

The rules, in order (docs/format.md repeats them):

1. Temporary index files are index writes that never finished: removed.
2. A data file without an index is a bucket whose write was never acknowledged (the
   index is written last), or one whose eviction was cut short (the index is removed
   first): removed either way.
3. Every index is loaded and verified (magic, version, whole-file CRC, entries in order
   and inside the data file). Records describe themselves, so a bucket whose index fails
   is not lost: its data file is scanned record by record and every record whose header
   and value CRCs check is kept; the damaged index is moved to ``quarantine/`` and a new
   one written from the records found. (What the lost index alone knew, which keys were
   deleted, is lost with it: a key deleted from that bucket may come back. The problem
   report says so.) A data file shorter than its index says keeps the records that lie
   inside it. A bucket with no record that checks has its files moved to
   ``quarantine/``.
4. A key listed live by two buckets (a crash between a delete and its index rewrite,
   after the key was written again) resolves to the record with the higher sequence
   number; the other is marked deleted in its index, durably, so it can never resurface.
5. A bucket left without a visible key is removed.
6. The bucket and sequence counters resume above everything seen on disk.

Each rule that changes the directory is reported as a :class:`Problem` with the action
taken, for the next ``check()`` to show. Opened read-only, recovery changes nothing: the
same conclusions are drawn in memory only, and the problems say what was left in place.

Records themselves are not read for a bucket whose index checks: an index was written only
after its data was fsync'd, so opening stays fast (a few index files for 100k objects),
and every read checks its record's CRCs anyway.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

from kvstored.backends.bucket.index import (
    FLAG_DELETED,
    FLAG_QUARANTINED,
    FLAGS_GONE,
    read_index,
    write_indexes,
)
from kvstored.backends.bucket.layout import list_buckets
from kvstored.backends.bucket.state import Bucket, Slot
from kvstored.sdk.backend import OpenProgress
from kvstored.sdk.errors import CorruptionError
from kvstored.sdk.files import fsync_dir
from kvstored.sdk.quarantine import Quarantine
from kvstored.sdk.record import RecordHeader, record_size, scan_records
from kvstored.sdk.types import Problem, ProblemKind, RepairAction

log = logging.getLogger("kvstored.backends.bucket")

@dataclass
class Recovered:
    """What recovery found: the loaded buckets (ascending ids) and visible keys."""

    buckets: dict[int, Bucket] = field(default_factory=dict)
    keys: dict[str, Slot] = field(default_factory=dict)
    next_bucket_id: int = 1
    next_seq: int = 1
    #: What recovery dropped, rebuilt or removed, each with the action taken; ``check``
    #: reports them once.
    problems: list[Problem] = field(default_factory=list)
    #: Buckets rebuilt from their records in memory only (read-only open): their index
    #: file on disk is the damaged one, already reported above.
    unindexed: set[int] = field(default_factory=set)


def recover(directory: str, quarantine: Quarantine, *, read_only: bool = False,
            progress: OpenProgress | None = None) -> Recovered:
    """Load the bucket store in ``directory`` (the ``buckets/`` folder); see the module
    docstring. ``read_only`` changes nothing on disk; ``progress`` hears of every bucket
    loaded."""
    found = Recovered()
    if read_only and not os.path.isdir(directory):
        return found  # a store that never wrote a bucket
    listing = list_buckets(directory)
    found.next_bucket_id = listing.highest_id + 1
    removed = False
    leftovers = [(e, "an index write that never finished") for _, e in listing.tmp]
    leftovers += [(entry, "a data file without an index (a bucket write never "
                          "acknowledged, or an eviction cut short)")
                  for bucket_id, entry in listing.data.items() if bucket_id not in listing.index]
    for entry, why in leftovers:
        if read_only:
            action = RepairAction.LEFT_FOR_NEXT_OPEN
        else:
            os.unlink(entry.path)
            removed = True
            action = RepairAction.REMOVED
        found.problems.append(Problem(ProblemKind.TORN_WRITE, why, path=entry.path,
                                      action=action))
    if removed:
        fsync_dir(directory)
    loader = _Loader(directory, quarantine, read_only, found)
    max_seq = 0
    for loaded, bucket_id in enumerate(sorted(listing.index)):
        if progress is not None:
            progress(loaded, len(listing.index), "buckets")
        bucket = loader.load(bucket_id, listing.index[bucket_id].path,
                             listing.data.get(bucket_id))
        if bucket is None:
            continue
        found.buckets[bucket_id] = bucket
        for slot in bucket.slots:
            max_seq = max(max_seq, slot.seq)
    found.next_seq = max_seq + 1
    if progress is not None:
        progress(len(listing.index), len(listing.index), "buckets")
    _resolve_keys(found, directory, read_only)
    return found


class _Loader:
    """Loads one bucket at a time (rule 3), rebuilding what a damaged index lost."""

    def __init__(self, directory: str, quarantine: Quarantine, read_only: bool,
                 found: Recovered) -> None:
        self.directory = directory
        self.quarantine = quarantine
        self.read_only = read_only
        self.found = found
        self.problems = found.problems

    def load(self, bucket_id: int, index_path: str,
             data_entry: os.DirEntry | None) -> Bucket | None:
        try:
            header, rows = read_index(index_path, rows=True)
            if header.bucket_id != bucket_id:
                raise CorruptionError(f"index names bucket {header.bucket_id:016x}",
                                      path=index_path)
        except CorruptionError as exc:
            if data_entry is None:
                return self._drop(bucket_id, index_path, None, ProblemKind.INDEX_MISMATCH,
                                  f"{exc.message}, and its data file is missing")
            return self._rebuild(bucket_id, index_path, data_entry.path, exc.message)
        if data_entry is None:
            return self._drop(bucket_id, index_path, None, ProblemKind.INDEX_MISMATCH,
                              "its data file is missing")
        data_stat = data_entry.stat()
        bucket = Bucket(self.directory, bucket_id, header.data_len, header.created_ns)
        bucket.slots = [Slot(bucket, *row) for row in rows]
        if data_stat.st_size < header.data_len:
            lost = [s for s in bucket.slots if s.live and s.offset + s.length > data_stat.st_size]
            if lost and len(lost) == sum(1 for s in bucket.slots if s.live):
                return self._drop(bucket_id, index_path, data_entry.path,
                                  ProblemKind.TORN_WRITE,
                                  f"its data file is {data_stat.st_size} bytes, the index "
                                  f"covers {header.data_len}: no record is left whole")
            self._cut_short(bucket, lost, data_stat.st_size)
        _count(bucket, data_stat.st_blocks * 512 + os.stat(index_path).st_blocks * 512)
        return bucket

    def _cut_short(self, bucket: Bucket, lost: list[Slot], size: int) -> None:
        """The data file ends before its index does (it was truncated): keep the records
        inside it, flag the ``lost`` ones gone."""
        for slot in lost:
            slot.flags |= FLAG_QUARANTINED
        detail = (f"bucket {bucket.id:016x}: its data file is {size} bytes, the index covers "
                  f"{bucket.data_len}; {len(lost)} record(s) past the end are lost")
        action = None
        if not self.read_only and lost:
            write_indexes(self.directory, [(bucket.tmp_index_name, bucket.index_name,
                                            bucket.index_bytes())])
            action = RepairAction.DROPPED_FROM_INDEX
        log.warning("bucket: %s%s", detail, " (left out of the index, which was rewritten)"
                    if action else "")
        self.problems.append(Problem(ProblemKind.TORN_WRITE, detail, path=bucket.data_path,
                                     action=action, action_detail="the index was rewritten "
                                     "without them" if action else None))

    def _rebuild(self, bucket_id: int, index_path: str, data_path: str,
                 why: str) -> Bucket | None:
        """The index fails: scan the data file and keep every record that checks."""
        with open(data_path, "rb", buffering=0) as f:
            fd = f.fileno()
            size = os.fstat(fd).st_size
            records: list[tuple[int, RecordHeader]] = list(
                scan_records(lambda n, at: os.pread(fd, n, at), 0, size))
        if not records:
            return self._drop(bucket_id, index_path, data_path, ProblemKind.INDEX_MISMATCH,
                              f"{why}, and no record of its data file checks")
        end = records[-1][0] + record_size(records[-1][1].value_len)
        created = min(header.write_ns for _, header in records)
        bucket = Bucket(self.directory, bucket_id, max(end, size), created)
        for offset, header in records:
            bucket.slots.append(Slot(bucket, header.key, offset, header.value_len,
                                     header.seq, header.write_ns, header.value_crc))
        covered = sum(record_size(h.value_len) for _, h in records)
        detail = (f"bucket {bucket_id:016x}: its index fails its check ({why}); found "
                  f"{len(records)} record(s) that verify in its data file "
                  f"({size - covered} of {size} bytes unaccounted for). Keys deleted from "
                  "this bucket may reappear: the index alone recorded deletes")
        if self.read_only:
            rebuilt = None
            self.found.unindexed.add(bucket_id)
            physical = os.stat(data_path).st_blocks * 512 + os.stat(index_path).st_blocks * 512
        else:
            moved = self.quarantine.move_aside(index_path, why)
            write_indexes(self.directory, [(bucket.tmp_index_name, bucket.index_name,
                                            bucket.index_bytes())])
            rebuilt = f"from the records of its data file; the damaged index is in {moved}"
            physical = (os.stat(data_path).st_blocks + os.stat(index_path).st_blocks) * 512
        log.warning("bucket: %s%s", detail, f" (index rebuilt {rebuilt})" if rebuilt else
                    " (opened read-only: kept in memory; recover --repair rebuilds the index)")
        self.problems.append(Problem(ProblemKind.INDEX_MISMATCH, detail, path=index_path,
                                     action=RepairAction.REBUILT if rebuilt else None,
                                     action_detail=rebuilt))
        _count(bucket, physical)
        return bucket

    def _drop(self, bucket_id: int, index_path: str, data_path: str | None,
              kind: ProblemKind, why: str) -> None:
        moved = None
        if not self.read_only:
            moved = ", ".join(self.quarantine.move_aside(p, why) for p in (index_path, data_path)
                              if p is not None)
        log.warning("bucket: bucket %016x dropped: %s%s", bucket_id, why,
                    "" if moved else " (opened read-only: left in place)")
        self.problems.append(Problem(kind, f"bucket {bucket_id:016x} dropped: {why}",
                                     path=index_path,
                                     action=RepairAction.QUARANTINED if moved else None,
                                     action_detail=moved))
        return None


def _count(bucket: Bucket, physical: int) -> None:
    live = [slot for slot in bucket.slots if not slot.flags & FLAGS_GONE]
    bucket.live = len(live)
    bucket.logical = sum(slot.size for slot in live)
    bucket.physical = physical


def _resolve_keys(found: Recovered, directory: str, read_only: bool) -> None:
    """Build the key map (rule 4), then apply rule 5."""
    keys = found.keys
    stale: set[int] = set()
    for bucket in found.buckets.values():
        for slot in bucket.slots:
            if not slot.live:
                continue
            other = keys.get(slot.key)
            if other is None:
                keys[slot.key] = slot
                continue
            loser, winner = (other, slot) if other.seq < slot.seq else (slot, other)
            loser.bucket.forget(loser, FLAG_DELETED)
            stale.add(loser.bucket.id)
            keys[slot.key] = winner
            log.warning("bucket: key %r is live in buckets %016x and %016x; keeping seq %d",
                        slot.key, other.bucket.id, slot.bucket.id, winner.seq)
    rewrites = [found.buckets[i] for i in sorted(stale) if found.buckets[i].live]
    if rewrites and not read_only:
        # Only flags change, so each index keeps its size and its blocks.
        write_indexes(directory, [(b.tmp_index_name, b.index_name, b.index_bytes())
                                  for b in rewrites])
    empty = [b for b in found.buckets.values() if not b.live]
    for bucket in empty:
        del found.buckets[bucket.id]
        if read_only:
            continue
        os.unlink(bucket.index_path)
        os.unlink(bucket.data_path)
        log.info("bucket: removed bucket %016x, which holds no visible key", bucket.id)
    if empty and not read_only:
        fsync_dir(directory)
