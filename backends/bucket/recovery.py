"""Open-time recovery of a bucket store: load every index, and tidy what a crash left.

The rules, in order (docs/format.md repeats them):

1. Temporary index files are index writes that never finished: removed.
2. A data file without an index is a bucket whose write was never acknowledged (the
   index is written last), or one whose eviction was cut short (the index is removed
   first): removed either way.
3. Every index is loaded and verified (magic, version, whole-file CRC, entries in order
   and inside the data file). A bucket whose index fails, or whose data file is missing
   or shorter than the index says, is dropped: its files are moved to ``quarantine/``
   and the next ``check()`` reports it.
4. A key listed live by two buckets (a crash between a delete and its index rewrite,
   after the key was written again) resolves to the record with the higher sequence
   number; the other is marked deleted in its index, durably, so it can never resurface.
5. A bucket left without a visible key is removed.
6. The bucket and sequence counters resume above everything seen on disk.

Records themselves are not read here: an index was written only after its data was
fsync'd, so opening stays fast (a few index files for 100k objects), and every read
checks its record's CRCs anyway.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

from kvstored.backends.bucket.index import (
    FLAG_DELETED,
    FLAGS_GONE,
    read_index,
    write_indexes,
)
from kvstored.backends.bucket.layout import list_buckets
from kvstored.backends.bucket.quarantine import move_aside
from kvstored.backends.bucket.state import Bucket, Slot
from kvstored.backends.stamp import fsync_dir
from kvstored.sdk.errors import CorruptionError
from kvstored.sdk.types import Problem, ProblemKind

log = logging.getLogger("kvstored.backends.bucket")


@dataclass
class Recovered:
    """What recovery found: the loaded buckets (ascending ids) and visible keys."""

    buckets: dict[int, Bucket] = field(default_factory=dict)
    keys: dict[str, Slot] = field(default_factory=dict)
    next_bucket_id: int = 1
    next_seq: int = 1
    #: What recovery dropped or removed, each with the action taken; ``check`` reports
    #: them once.
    problems: list[Problem] = field(default_factory=list)


def recover(directory: str, quarantine: str) -> Recovered:
    """Load the bucket store in ``directory`` (the ``buckets/`` folder)."""
    found = Recovered()
    listing = list_buckets(directory)
    found.next_bucket_id = listing.highest_id + 1
    removed = False
    for _, entry in listing.tmp:
        os.unlink(entry.path)
        removed = True
        found.problems.append(Problem(ProblemKind.TORN_WRITE, "an index write that never "
                                      "finished", path=entry.path, action="removed at open"))
    for bucket_id, entry in listing.data.items():
        if bucket_id not in listing.index:
            os.unlink(entry.path)
            removed = True
            found.problems.append(Problem(
                ProblemKind.TORN_WRITE, "a data file without an index (a bucket write never "
                "acknowledged, or an eviction cut short)", path=entry.path,
                action="removed at open"))
    if removed:
        fsync_dir(directory)
    max_seq = 0
    for bucket_id in sorted(listing.index):
        bucket = _load(directory, quarantine, bucket_id, listing.index[bucket_id],
                       listing.data.get(bucket_id), found.problems)
        if bucket is None:
            continue
        found.buckets[bucket_id] = bucket
        for slot in bucket.slots:
            max_seq = max(max_seq, slot.seq)
    found.next_seq = max_seq + 1
    _resolve_keys(found, directory)
    return found


def _load(directory: str, quarantine: str, bucket_id: int, index_entry: os.DirEntry,
          data_entry: os.DirEntry | None, problems: list[Problem]) -> Bucket | None:
    """One bucket from its index, or None (after moving its files aside) if it is broken."""

    def drop(kind: ProblemKind, why: str) -> None:
        moved = [move_aside(entry.path, quarantine, why)
                 for entry in (index_entry, data_entry) if entry is not None]
        problems.append(Problem(kind, f"bucket {bucket_id:016x} dropped: {why}",
                                path=index_entry.path,
                                action=f"moved to {', '.join(moved)} at open"))

    try:
        header, entries = read_index(index_entry.path, rows=True)
        if header.bucket_id != bucket_id:
            raise CorruptionError(f"index names bucket {header.bucket_id:016x}",
                                  path=index_entry.path)
    except CorruptionError as exc:
        drop(ProblemKind.INDEX_MISMATCH, exc.message)
        return None
    if data_entry is None:
        drop(ProblemKind.INDEX_MISMATCH, "its data file is missing")
        return None
    data_stat = data_entry.stat()
    if data_stat.st_size < header.data_len:
        drop(ProblemKind.TORN_WRITE, f"its data file is {data_stat.st_size} bytes, "
                                     f"the index covers {header.data_len}")
        return None
    bucket = Bucket(directory, bucket_id, header.data_len, header.created_ns)
    bucket.slots = [Slot(bucket, *row) for row in entries]
    live = [row[2] for row in entries if not row[6] & FLAGS_GONE]
    bucket.live = len(live)
    bucket.logical = sum(live)
    bucket.physical = (data_stat.st_blocks + index_entry.stat().st_blocks) * 512
    return bucket


def _resolve_keys(found: Recovered, directory: str) -> None:
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
    if rewrites:
        # Only flags change, so each index keeps its size and its blocks.
        write_indexes(directory, [(b.tmp_index_name, b.index_name, b.index_bytes())
                                  for b in rewrites])
    empty = [b for b in found.buckets.values() if not b.live]
    for bucket in empty:
        os.unlink(bucket.index_path)
        os.unlink(bucket.data_path)
        del found.buckets[bucket.id]
        log.info("bucket: removed bucket %016x, which holds no visible key", bucket.id)
    if empty:
        fsync_dir(directory)

