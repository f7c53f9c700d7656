"""The :class:`BucketBackend`: objects written in sealed buckets, evicted a bucket at a time.

How the pieces fit (the byte layouts are in docs/format.md):

- ``batch_write`` cuts its items into buckets (at most ``bucket_keys`` keys and
  ``bucket_bytes`` bytes each), reserves room for them (evicting between the
  watermarks), writes all their data files through the io engine together (in
  submissions of up to 16 MiB of scratch memory), fdatasyncs them together, then makes
  their index files durable (temporary file, fsync, rename, one directory fsync). Only
  then are the objects visible and reported WRITTEN.
- ``batch_read`` reads every record asked for in one engine submission and checks both
  CRCs of each (records.py). A bucket being read cannot be evicted, and its space is not
  counted free until the read ends. ``read_stream`` reads the same way, a group of keys
  at a time with the next groups' submissions in flight (kvstored.sdk.streams), each
  group's buckets held until its results are handed out.
- ``batch_delete`` flags the keys deleted in their buckets' indexes (rewritten
  atomically) before it returns; a bucket left with no visible key is removed at once.
- Eviction removes whole buckets, oldest written first (``fifo``) or least recently read
  first (``lru``), skipping any bucket that holds a pinned key or has a read in flight.

Locks, always taken in this order: ``_space_lock`` (reservations and evictions, so that
room is never promised twice), a bucket's ``meta_lock`` (its files), ``_lock`` (the
in-memory maps and counters; held only briefly, never across I/O). Two writers of one
key are kept apart by the SDK's :class:`~kvstored.sdk.claims.WriteClaims` under
``_lock``; the store's directory lock (:mod:`kvstored.sdk.lock`) keeps other processes
out.

Every open mode of the SDK is supported: read-only, recovery draws its conclusions in
memory and writes nothing (recovery.py); repair rebuilds a lost or damaged stamp.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from kvstored.backends.bucket.check import Checker
from kvstored.backends.bucket.handles import ReadHandles
from kvstored.backends.bucket.index import (
    FLAG_DELETED,
    FLAG_QUARANTINED,
    FLAGS_GONE,
    IndexEntry,
    encode_index,
    index_size,
    write_indexes,
)
from kvstored.backends.bucket.layout import BUCKETS_DIR, LAYOUT_VERSION, QUARANTINE_DIR
from kvstored.backends.bucket.records import NewRecord, RecordReads, start_records
from kvstored.backends.bucket.recovery import recover
from kvstored.backends.bucket.state import Bucket, Slot
from kvstored.backends.bucket.writer import Claimed, cut, new_bucket, write_buckets
from kvstored.backends.builtin import BuiltinBackend
from kvstored.backends.stamp import claim_directory
from kvstored.native import EngineUnavailableError, IoFile, get_engine
from kvstored.sdk.backend import EvictionCallback, OpenProgress
from kvstored.sdk.claims import WriteClaims
from kvstored.sdk.errors import BackendError, CapacityError, InvalidRequestError, from_oserror
from kvstored.sdk.eviction import EvictionOrder, EvictionPolicy
from kvstored.sdk.files import fsync_dir, make_private_dirs
from kvstored.sdk.group_reads import GroupReadBackend
from kvstored.sdk.index import ObjectIndex
from kvstored.sdk.quarantine import Quarantine
from kvstored.sdk.record import ReadOutcome, align_up, outcomes_of, record_size
from kvstored.sdk.streams import RecordReadGroup, byte_view
from kvstored.sdk.types import (
    DEFAULT_MAX_VALUE_SIZE,
    Buffer,
    CheckReport,
    EvictionGranularity,
    OpenMode,
    ReadStatus,
    Usage,
    WriteBatchHint,
    WriteOutcome,
    WriteResult,
    encode_key,
)

log = logging.getLogger("kvstored.backends.bucket")

MiB = 1024 * 1024


class BucketBackend(GroupReadBackend, BuiltinBackend):
    """The default SSD backend: objects grouped into buckets, one data file and one index
    file each, evicted a whole bucket at a time.

    Options, besides the common ``capacity``, ``max_value_size`` and ``on_evict``:

    ``policy`` (``fifo``)
        Which bucket eviction removes first (:class:`~kvstored.sdk.eviction.EvictionPolicy`):
        ``fifo`` the oldest written, ``lru`` the least recently read (or written). LRU
        order is kept in memory; after a reopen it starts again from write order.
    ``bucket_bytes`` (256 MiB), ``bucket_keys`` (500)
        A ``batch_write`` is cut into buckets of at most this many bytes of records (a
        single larger value gets a bucket of its own) and this many keys.
    ``bucket_age`` (5.0 s)
        How long a caller should hold a trickle of objects before writing it anyway.
        The backend never holds objects itself (a write is durable when it returns):
        the age, with the two limits above, is what :meth:`write_batch_hint` tells the
        node's offloader, which batches by it.
    ``high_watermark`` (0.90), ``low_watermark`` (0.80)
        With a ``capacity``: when a write would take usage above ``high_watermark *
        capacity``, whole buckets are evicted until usage after the write is at most
        ``low_watermark * capacity``. The capacity itself is never exceeded: a write that
        cannot fit fails its items with CapacityError.
    ``engine`` (None), ``direct`` (None)
        The io engine (``auto``, ``uring`` or ``posix``; None: ``KVSTORED_IO_ENGINE``)
        and whether data files use O_DIRECT (None: ``KVSTORED_IO_DIRECT``).
    ``progress`` (None)
        An :data:`~kvstored.sdk.OpenProgress` told of every bucket recovery loads.
    """

    name = "bucket"
    sdk_version = "1.2"
    eviction_granularity = EvictionGranularity.BUCKET
    #: What this backend keeps in its directory (how a store with a lost stamp is known).
    layout_markers = (BUCKETS_DIR,)

    def __init__(self, path: str | os.PathLike, *, capacity: int | None = None,
                 max_value_size: int = DEFAULT_MAX_VALUE_SIZE,
                 on_evict: EvictionCallback | None = None,
                 mode: OpenMode = OpenMode.READ_WRITE,
                 policy: EvictionPolicy = EvictionPolicy.FIFO, bucket_bytes: int = 256 * MiB,
                 bucket_keys: int = 500,
                 bucket_age: float = 5.0, high_watermark: float = 0.90,
                 low_watermark: float = 0.80, engine: str | None = None,
                 direct: bool | None = None, progress: OpenProgress | None = None) -> None:
        super().__init__(path, capacity=capacity, max_value_size=max_value_size,
                         on_evict=on_evict, mode=mode)
        if bucket_bytes < 1 or bucket_keys < 1 or not bucket_age > 0:
            raise InvalidRequestError(
                f"bucket_bytes, bucket_keys and bucket_age must be positive (got "
                f"{bucket_bytes}, {bucket_keys}, {bucket_age})")
        if not 0 < low_watermark <= high_watermark <= 1:
            raise InvalidRequestError(
                "watermarks must satisfy 0 < low_watermark <= high_watermark <= 1 (got "
                f"low {low_watermark}, high {high_watermark})")
        self.policy = EvictionPolicy.parse(policy)
        self.bucket_bytes = bucket_bytes
        self.bucket_keys = bucket_keys
        self.bucket_age = bucket_age
        self.high_watermark = high_watermark
        self.low_watermark = low_watermark
        try:
            self.engine = get_engine(engine, direct=direct)
        except (ValueError, EngineUnavailableError) as exc:
            raise InvalidRequestError(f"engine={engine!r}: {exc}", path=path) from None
        self.root = Path(self.path)
        self.buckets_dir = str(self.root / BUCKETS_DIR)
        self.quarantine_dir = str(self.root / QUARANTINE_DIR)
        self.quarantine = Quarantine(self.quarantine_dir)
        self._lock = threading.Lock()
        self._space_lock = threading.Lock()
        #: Every visible key, and the slot of its record.
        self.index: ObjectIndex[Slot] = ObjectIndex(Slot.location, self._lock)
        #: The buckets of the store, first to be evicted first.
        self._buckets: EvictionOrder[int, Bucket] = EvictionOrder(self.policy)
        self._claims = WriteClaims(self._lock)
        # Buckets being written (not yet visible) and being removed (no longer
        # visible): their files are busy, not orphans.
        self._writing: set[int] = set()
        self._removing: set[int] = set()
        self._handles = ReadHandles(self.engine)
        self._physical = self._reserved = 0
        stamp_report: list = []
        self._dir_lock = claim_directory(self.root, self.name, LAYOUT_VERSION, mode=self.mode,
                                         markers=self.layout_markers, report=stamp_report)
        try:
            if not self.read_only:
                make_private_dirs(self.buckets_dir)
            self._block = max(4096, os.statvfs(self.root).f_bsize)
            found = recover(self.buckets_dir, self.quarantine, read_only=self.read_only,
                            progress=progress)
        except BaseException as exc:
            self._dir_lock.release()
            if isinstance(exc, OSError) and not isinstance(exc, BackendError):
                raise from_oserror(exc, path=self.root, action="opening the backend") from exc
            raise
        for bucket_id, bucket in found.buckets.items():
            self._buckets.add(bucket_id, bucket)
            self._physical += bucket.physical
        for key, slot in found.keys.items():
            self.index.add(key, slot)
        self._next_bucket = found.next_bucket_id
        self._next_seq = found.next_seq
        self._checker = Checker(self, stamp_report + found.problems, found.unindexed)

    # -- lifecycle ---------------------------------------------------------------------

    def _close(self) -> None:
        with self._lock:
            self._handles.close_all_locked()
            self.index.clear()
            self._buckets.clear()
        self._dir_lock.release()

    def write_batch_hint(self) -> WriteBatchHint:
        return WriteBatchHint(max_bytes=self.bucket_bytes, max_keys=self.bucket_keys,
                              max_age=self.bucket_age)

    # -- writes ------------------------------------------------------------------------

    def batch_write(self, items: Sequence[tuple[str, Buffer]]) -> list[WriteResult]:
        self._check_writable()
        encoded = self._check_value_sizes(items)
        results: list[WriteResult | None] = [None] * len(items)

        def write(positions: list[int]) -> None:
            claimed: list[Claimed] = [(i, items[i][0], encoded[i],
                                       memoryview(items[i][1]).cast("B")) for i in positions]
            self._write_buckets(cut(claimed, self.bucket_keys, self.bucket_bytes), results)

        for i in self._claims.write_batch([key for key, _ in items],
                                          stored=self.index.__contains__, write=write):
            results[i] = WriteResult(items[i][0], WriteOutcome.EXISTS)
        return results  # type: ignore[return-value]

    def _write_buckets(self, groups: list[list[Claimed]], results: list) -> None:
        """Reserve room for each group, write them all as buckets (writer.py), and
        publish those that became durable; fill in ``results``."""
        planned: list[tuple[list[Claimed], Bucket, list[NewRecord], int]] = []
        for group in self._within_capacity(groups):
            need = self._group_footprint(group)
            with self._space_lock:
                error = self._reserve(need, group[0][1])
            if error is not None:
                for i, key, _, _ in group:
                    results[i] = WriteResult(key, WriteOutcome.FAILED, CapacityError(
                        error.message, key=key, path=self.path))
                continue
            with self._lock:
                bucket_id, first_seq = self._next_bucket, self._next_seq
                self._next_bucket += 1
                self._next_seq += len(group)
                self._writing.add(bucket_id)
            bucket, records = new_bucket(self.buckets_dir, bucket_id, first_seq,
                                         time.time_ns(), group)
            planned.append((group, bucket, records, need))
        if not planned:
            return
        failures = write_buckets(self.engine, self.buckets_dir,
                                 [(bucket, records) for _, bucket, records, _ in planned])
        over = 0
        with self._lock:
            for group, bucket, _, need in planned:
                self._writing.discard(bucket.id)
                self._reserved -= need
                exc = failures.get(bucket.id)
                if exc is not None:
                    for i, key, _, _ in group:
                        results[i] = WriteResult(key, WriteOutcome.FAILED, from_oserror(
                            exc, key=key, path=bucket.data_path, action="writing the bucket"))
                    log.warning("bucket: writing bucket %016x failed: %s", bucket.id, exc)
                    continue
                self._physical += bucket.physical
                self._buckets.add(bucket.id, bucket)
                for slot in bucket.slots:
                    self.index.add(slot.key, slot)
                for i, key, _, _ in group:
                    results[i] = WriteResult(key, WriteOutcome.WRITTEN)
            if self.capacity is not None:
                over = self._physical + self._reserved - self.capacity
        if over > 0:  # only if the file system allocated more than _footprint allowed
            log.warning("bucket: the file system allocated more than estimated; evicting "
                        "%d bytes to stay within the capacity", over)
            self.evict(over, self.on_evict)

    def _group_footprint(self, group: list[Claimed]) -> int:
        data_len = sum(record_size(item[3].nbytes) for item in group)
        return self._footprint(data_len, index_size(len(group), sum(len(i[2]) for i in group)))

    def _within_capacity(self, groups: list[list[Claimed]]) -> list[list[Claimed]]:
        """``groups``, with any group that needs more than the whole capacity cut into
        one-item groups: capacity fails items one by one, so an item that cannot fit
        fails alone instead of taking the rest of its bucket with it."""
        if self.capacity is None:
            return groups
        fitted: list[list[Claimed]] = []
        for group in groups:
            if len(group) > 1 and self._group_footprint(group) > self.capacity:
                fitted.extend([item] for item in group)
            else:
                fitted.append(group)
        return fitted

    def _footprint(self, data_len: int, index_len: int) -> int:
        """The most disk a new bucket may take: its files rounded up to blocks, plus one
        block for the file system's own bookkeeping of a large extent map."""
        return (align_up(data_len, self._block) + align_up(index_len, self._block)
                + self._block)

    # -- capacity and eviction --------------------------------------------------------

    def _reserve(self, need: int, key: str) -> CapacityError | None:
        """Reserve ``need`` bytes, evicting between the watermarks; hold _space_lock."""
        if self.capacity is None:
            with self._lock:
                self._reserved += need
            return None
        if need > self.capacity:
            return CapacityError(f"the bucket needs {need} bytes, more than the whole "
                                 f"capacity of {self.capacity}", key=key, path=self.path)
        with self._lock:
            used = self._physical + self._reserved
        if used + need > self.high_watermark * self.capacity:
            self._evict_held(int(used + need - self.low_watermark * self.capacity),
                             self.on_evict)
        with self._lock:
            used = self._physical + self._reserved
            if used + need > self.capacity:
                return CapacityError(
                    f"no room: {used} of {self.capacity} bytes in use and nothing more "
                    "can be evicted (pinned or being read); delete objects or raise the "
                    "capacity", key=key, path=self.path)
            self._reserved += need
        return None

    def evict(self, nbytes: int, on_evict: EvictionCallback | None = None) -> list[str]:
        self._check_writable()
        with self._space_lock:
            return self._evict_held(nbytes, on_evict)

    def _evict_held(self, nbytes: int, on_evict: EvictionCallback | None) -> list[str]:
        """Evict whole buckets in policy order until ``nbytes`` are freed; hold
        _space_lock."""
        victims: list[Bucket] = []
        keys: list[str] = []
        with self._lock:
            freed = 0
            for bucket in self._buckets.values():
                if freed >= nbytes:
                    break
                if bucket.readers or any(self._pins.is_pinned(s.key)
                                         for s in bucket.slots if s.live):
                    continue
                victims.append(bucket)
                freed += bucket.physical
            for bucket in victims:
                self._retire_locked(bucket)
                keys.extend(slot.key for slot in bucket.slots if slot.live)
        try:
            if keys and on_evict is not None:
                on_evict(list(keys))  # before the files go: their space is not reused yet
        finally:
            # The keys are invisible already: the files go even if the callback failed,
            # so that memory and disk still agree.
            self._remove_files(victims)
        if victims:
            log.info("bucket: evicted %d bucket(s), %d keys", len(victims), len(keys))
        return keys

    def _retire_locked(self, bucket: Bucket) -> None:
        """Take ``bucket`` out of the store: its keys become invisible at once."""
        bucket.retired = True
        self._buckets.discard(bucket.id)
        self._removing.add(bucket.id)
        for slot in bucket.slots:
            if slot.live and self.index.get(slot.key) is slot:
                self.index.pop(slot.key)

    def _remove_files(self, buckets: list[Bucket]) -> None:
        """Unlink retired buckets' files durably (index first, so a crash in between
        leaves a data file without index, which the next open removes), then count
        their space free once no read holds them."""
        if not buckets:
            return
        for bucket in buckets:
            with bucket.meta_lock:
                _unlink_quietly(bucket.index_path)
                _unlink_quietly(bucket.data_path)
                bucket.files_gone = True
        fsync_dir(self.buckets_dir)
        closing: list[IoFile] = []
        with self._lock:
            for bucket in buckets:
                self._removing.discard(bucket.id)
                if bucket.readers == 0:
                    self._release_locked(bucket, closing)
        for file in closing:
            file.close()

    def _release_locked(self, bucket: Bucket, closing: list[IoFile]) -> None:
        """Stop counting a removed bucket's space, and drop its read handle."""
        self._physical -= bucket.physical
        bucket.physical = 0
        self._handles.drop_locked(bucket, closing)

    # -- reads -------------------------------------------------------------------------

    def _start_group(self, keys: Sequence[str], buffers: Sequence[memoryview], span: range, *,
                     wait: bool = False) -> RecordReadGroup:
        """Look up the keys of ``span`` and start reading them: a ``batch_read`` (``wait``:
        read at once) or one group of a stream. The buckets read are held (not removed,
        their space not reused) until the group is released."""
        answered: list[int] = [ReadStatus.MISSING] * len(span)
        wanted: list[int] = []
        slots: list[Slot] = []
        dests: list[memoryview] = []
        names = keys[span.start:span.stop]
        touch = self._buckets.touch if self._buckets.moves_on_read else None
        with self._lock:
            for n, slot in enumerate(self.index.get_many(names)):
                if slot is None:
                    continue
                dest = byte_view(buffers[span.start + n])
                if dest.nbytes < slot.size:
                    answered[n] = ReadStatus.BUFFER_TOO_SMALL
                    continue
                slot.bucket.readers += 1
                wanted.append(n)
                slots.append(slot)
                dests.append(dest)
                if touch is not None:
                    touch(slot.bucket.id)
        try:
            outcomes, reads, where = self._start_held(slots, dests, wait=wait)
        except BaseException:
            self._end_reads(slots)
            raise
        for n, outcome in zip(wanted, outcomes):
            if outcome is not None:
                answered[n] = outcome.status
        return RecordReadGroup(span, answered, [wanted[k] for k in where], reads,
                               lambda k, outcome: self._note_read(slots[where[k]], outcome),
                               lambda: self._end_reads(slots))

    def _note_read(self, slot: Slot, outcome: ReadOutcome) -> None:
        self._note_failed_read(slot.key, f"{slot.bucket.data_path} at {slot.offset}", outcome)

    def _hold(self, slots: Sequence[Slot]) -> list[Slot]:
        """Of ``slots``, those still visible, with their buckets held against removal."""
        with self._lock:
            held = [s for s in slots if s.live and not s.bucket.retired]
            for slot in held:
                slot.bucket.readers += 1
        return held

    def _start_held(self, slots: Sequence[Slot], dests: Sequence[memoryview], *,
                    wait: bool) -> tuple[list[ReadOutcome | None], RecordReads | None, list[int]]:
        """Start reading ``slots`` (whose buckets the caller holds) into ``dests``: the
        outcomes known without reading (a bucket's file gone or not opening; None for the
        others), the reads of the others, and their positions in ``slots``."""
        files = self._files_of({slot.bucket for slot in slots})
        outcomes: list[ReadOutcome | None] = [None] * len(slots)
        requests, where = [], []
        for n, (slot, dest) in enumerate(zip(slots, dests)):
            file = files[slot.bucket.id]
            if isinstance(file, FileNotFoundError):
                # Every key of the bucket was deleted since the lookup: a miss.
                outcomes[n] = ReadOutcome(ReadStatus.MISSING)
            elif isinstance(file, OSError):
                failed = outcomes[n] = ReadOutcome(ReadStatus.IO_ERROR, str(file))
                self._note_read(slot, failed)
            else:
                requests.append((slot, file, dest))
                where.append(n)
        if not requests:
            return outcomes, None, []
        return outcomes, start_records(self.engine, requests, wait=wait), where

    def _read_held(self, slots: Sequence[Slot], dests: Sequence[memoryview]) -> list[ReadOutcome]:
        """Read ``slots`` (whose buckets the caller holds) into ``dests``, verified."""
        outcomes, reads, where = self._start_held(slots, dests, wait=True)
        if reads is not None:
            for n, outcome in zip(where, outcomes_of(*reads.finish())):
                outcomes[n] = outcome
        return outcomes  # type: ignore[return-value]

    def _files_of(self, buckets: set[Bucket]) -> dict[int, IoFile | OSError]:
        """A read handle for each bucket (held by the caller), opened if not cached."""
        opened = self._handles.open_missing(buckets)
        closing: list[IoFile] = []
        with self._lock:
            files = self._handles.adopt_locked(buckets, opened, closing)
        for file in closing:
            file.close()
        return files

    def _end_reads(self, slots: Sequence[Slot]) -> None:
        closing: list[IoFile] = []
        with self._lock:
            for slot in slots:
                bucket = slot.bucket
                bucket.readers -= 1
                if bucket.readers == 0 and bucket.files_gone and bucket.physical:
                    self._release_locked(bucket, closing)
        for file in closing:
            file.close()

    def _read_slots(self, slots: Sequence[Slot]) -> list[ReadOutcome | None]:
        """Read and verify ``slots`` into scratch buffers (for scan and check); None for a
        slot no longer visible."""
        held = self._hold(slots)
        try:
            outcomes = self._read_held(held, [memoryview(bytearray(s.size)) for s in held])
        finally:
            self._end_reads(held)
        by_slot = dict(zip(map(id, held), outcomes))
        return [by_slot.get(id(slot)) for slot in slots]

    def usage(self) -> Usage:
        self._check_open()
        with self._lock:
            return Usage(self.index.logical_bytes, self._physical, len(self.index),
                         self.capacity)

    # -- deletes -----------------------------------------------------------------------

    def batch_delete(self, keys: Sequence[str]) -> list[bool]:
        self._check_writable()
        for key in keys:
            encode_key(key)
        touched: dict[int, Bucket] = {}
        found: list[bool] = []
        with self._lock:
            for key in keys:
                slot = self.index.pop(key)
                found.append(slot is not None)
                if slot is not None:
                    slot.bucket.forget(slot, FLAG_DELETED)
                    touched[slot.bucket.id] = slot.bucket
            dead = [b for b in touched.values() if not b.live and not b.retired]
            for bucket in dead:
                self._retire_locked(bucket)
        try:
            self._rewrite_indexes([b for b in touched.values() if b.live])
            self._remove_files(dead)
        except OSError as exc:
            raise from_oserror(exc, path=self.buckets_dir,
                               action="recording the deletes durably") from exc
        return found

    def _rewrite_indexes(self, buckets: list[Bucket]) -> None:
        """Make the in-memory flags of ``buckets`` durable in their index files."""
        if not buckets:
            return
        buckets = sorted(buckets, key=lambda b: b.id)
        for bucket in buckets:  # in id order, so that two rewriters cannot deadlock
            bucket.meta_lock.acquire()
        try:
            with self._lock:
                live = [b for b in buckets if not b.files_gone]
                entries = [[slot.entry() for slot in b.slots] for b in live]
            if len(live) < len(buckets):
                # Removed meanwhile, by a thread that may not have synced the directory
                # yet: sync it, so that this call's deletes are durable on return.
                fsync_dir(self.buckets_dir)
            write_indexes(self.buckets_dir, [
                (b.tmp_index_name, b.index_name,
                 encode_index(b.id, b.data_len, b.created_ns, e)) for b, e in zip(live, entries)])
        finally:
            for bucket in buckets:
                bucket.meta_lock.release()

    # -- check and repair -------------------------------------------------------------

    def check(self, repair: bool = False) -> CheckReport:
        self._check_checkable(repair)
        return self._checker.run(repair)

    # What check.py needs of the store (its CheckedStore), and nothing else: these are
    # not part of the SDK contract.

    def loaded_buckets(self) -> list[Bucket]:
        with self._lock:
            return list(self._buckets.values())

    def busy_bucket_ids(self) -> set[int]:
        with self._lock:
            return set(self._buckets) | self._writing | self._removing

    def index_entries(self, bucket: Bucket) -> list[IndexEntry]:
        with self._lock:
            return [slot.entry() for slot in bucket.slots]

    def rewrite_index(self, bucket: Bucket) -> None:
        self._rewrite_indexes([bucket])

    def indexed(self) -> list[tuple[str, Slot]]:
        # In volume order: a batch of the record pass reads neighbouring records.
        return sorted(self.index.snapshot(), key=lambda item: (item[1].bucket.id,
                                                                item[1].offset))

    def read_back(self, records: Sequence[tuple[str, Slot]]) -> list[ReadOutcome | None]:
        return self._read_slots([slot for _, slot in records])

    def set_aside(self, key: str, entry: Slot, reason: str) -> str | None:
        bucket = entry.bucket
        try:
            where = self.quarantine.copy_range(
                bucket.data_path, entry.offset, entry.length, reason=reason, key=key,
                stem=f"{bucket.id:016x}-{entry.offset:x}", seq=entry.seq,
                value_length=entry.size, value_crc32c=entry.checksum)
        except FileNotFoundError:
            where = None  # its bucket went meanwhile: nothing left to keep
        self.drop_records(bucket, [entry])
        return where

    def record_path(self, entry: Slot) -> str:
        return entry.bucket.data_path

    def drop_records(self, bucket: Bucket, slots: Sequence[Slot]) -> None:
        with self._lock:
            for slot in slots:
                if slot.flags & FLAGS_GONE:
                    continue  # deleted meanwhile: already out of the index
                if self.index.get(slot.key) is slot:
                    self.index.pop(slot.key)
                bucket.forget(slot, FLAG_QUARANTINED)
            emptied = not bucket.live and not bucket.retired
            if emptied:
                self._retire_locked(bucket)
        if emptied:
            self._remove_files([bucket])
        else:
            self._rewrite_indexes([bucket])

    def counted_physical(self, bucket: Bucket) -> int | None:
        with self._lock:
            return None if bucket.retired else bucket.physical

    def correct_physical(self, bucket: Bucket, actual: int) -> None:
        with self._lock:
            if not bucket.retired:
                self._physical += actual - bucket.physical
                bucket.physical = actual


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass

