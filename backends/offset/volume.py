"""The offset layout as a StorageBackend: shared by the ``offset`` and ``nvmeof`` backends.

A subclass says where the volume is (:meth:`OffsetLayoutBackend._attach`); this class
does the rest: formatting, the index, placement with
:class:`~kvstored.allocator.OffsetAllocator`, reads, deletes and eviction. Recovery is in
:mod:`.recovery`, the journal gate and checkpoints in :mod:`.journal`,
``check`` in :mod:`.check`, the byte layout in :mod:`.layout` and
docs/format.md.

Write path, per batch
    1. Place: allocate each record's extent (header block + value padded to 4 KiB),
       evicting by policy when the volume or the index area is full.
    2. Enter the *journal gate*: reserve journal blocks and take sequence numbers. When
       the journal is full, a checkpoint runs first and restarts it.
    3. Write the records through the io engine, then one journal entry listing the
       records that were written (offset, length, header CRC), then one ``fdatasync``.
    4. Publish: only now are the objects visible, and the call returns.

Deletes and evictions
    Keys leave the index at once. A journal entry of tombstones is written and
    fdatasync'd *before* their extents are freed, so a reused extent can never tear a
    record that a crash would bring back, and a deleted key never returns. Extents of
    keys being read are freed when the last read ends (read pins).

Checkpoints
    The index is written to the checkpoint slot not holding the newest checkpoint, then
    fdatasync'd, then the journal restarts. A checkpoint runs when the journal is full,
    when ``checkpoint_bytes`` were written since the last, at open after a replay, and at
    close. It waits for operations inside the gate to finish (so its sequence number
    covers everything acknowledged) and blocks new ones while it writes; reads go on.

Locking
    ``_lock`` guards every in-memory structure (index, order, allocator, counters, the
    journal position) and is never held across I/O. Two writers of one key are kept apart
    by the SDK's :class:`~kvstored.sdk.claims.WriteClaims`. Other processes are kept out
    by a lock the subclass takes when it attaches the volume, on a descriptor of its own:
    never the one the io engine uses, whose io_uring requests may hold the file a moment
    past ``close`` (issue 24).

Creating, formatting, refusing, rebuilding
    A new volume file is created, sized and formatted under a temporary name and only
    then renamed into place, so a volume file that exists has always been formatted. A
    volume whose superblock does not decode is never formatted over: it is refused with
    what to do, except a device (``nvmeof``) whose first MiB is blank. Opened in repair
    mode, a damaged superblock is rebuilt from the checkpoint slots (nothing lost) or, when
    they are gone too, the index is rebuilt by scanning the data area for every record that
    checks; the damaged metadata is copied to the quarantine first. Opened read-only,
    nothing is written: no format, no checkpoint after a replay, no regrown file.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from crc32c import crc32c

from kvstored.allocator import OffsetAllocator
from kvstored.backends.builtin import BuiltinBackend
from kvstored.backends.offset.check import IndexAudit, check_volume
from kvstored.backends.offset.journal import JournalGate, write_sync
from kvstored.backends.offset.layout import (
    ALIGN,
    JOURNAL_PUT,
    MAX_ENTRY_PAYLOAD,
    SUPER_MAGIC,
    Geometry,
    GiB,
    MiB,
    encode_checkpoint,
    entry_size,
    header_crc_of,
    journal_blocks,
    pack_entry,
    peek_slot,
    tombstone_bytes,
)
from kvstored.backends.offset.recovery import (
    Entry,
    Recovered,
    find_geometry,
    read_exact,
    recover,
    salvage_records,
)
from kvstored.native import (
    EngineUnavailableError,
    IoEngine,
    IoError,
    IoFile,
    LentBatch,
    ScratchMemory,
    ScratchPool,
    get_engine,
)
from kvstored.native.engine import Item
from kvstored.sdk.backend import EvictionCallback
from kvstored.sdk.claims import WriteClaims
from kvstored.sdk.errors import (
    BackendError,
    CapacityError,
    CorruptionError,
    InvalidRequestError,
    MissingStoreError,
    from_oserror,
)
from kvstored.sdk.eviction import EvictionOrder, EvictionPolicy
from kvstored.sdk.files import PRIVATE_FILE, fsync_dir
from kvstored.sdk.group_reads import GroupReadBackend
from kvstored.sdk.index import ObjectIndex
from kvstored.sdk.quarantine import Quarantine
from kvstored.sdk.record import (
    HEADER_SIZE,
    VALUE_OFFSET,
    ReadOutcome,
    encode_header,
    outcomes_of,
    record_size,
    verified_statuses,
)
from kvstored.sdk.streams import RecordReadGroup, byte_view
from kvstored.sdk.types import (
    DEFAULT_MAX_VALUE_SIZE,
    Buffer,
    CheckReport,
    EvictionGranularity,
    Location,
    OpenMode,
    Problem,
    ProblemKind,
    ReadStatus,
    RepairAction,
    Usage,
    WriteBatchHint,
    WriteOutcome,
    WriteResult,
    encode_key,
)
from kvstored.sdk.units import format_size

log = logging.getLogger(__name__)

#: Records per journal entry and per engine submission of a write batch.
WRITE_CHUNK = MAX_ENTRY_PAYLOAD // JOURNAL_PUT.size
#: Tombstones journalled per operation (a 1 KiB key takes about 1 KiB of journal).
TOMBSTONE_CHUNK = 512


#: Scratch lent to the reads of a stream's groups, in flight past their thread's next call.
_stream_scratch = ScratchPool()


class EntryReads:
    """Records of a volume being read (:meth:`OffsetLayoutBackend._start_entries`):
    ``finish`` waits and verifies them; ``close`` waits for what is still in flight and
    gives the scratch back. An :class:`~kvstored.sdk.streams.IssuedReads`."""

    __slots__ = ("batch", "heads", "plan")

    def __init__(self, batch: LentBatch, plan: Sequence[tuple[str, Entry, memoryview]],
                 heads: list[memoryview]) -> None:
        self.batch, self.plan, self.heads = batch, plan, heads

    def finish(self) -> tuple[list[int], dict[int, ReadOutcome]]:
        return verified_statuses([
            (target, head, None, key, entry.size, entry.seq, entry.checksum,
             None if isinstance(got, int) else got, got == ALIGN + entry.size)
            for (key, entry, target), head, got in zip(self.plan, self.heads,
                                                       self.batch.wait())])

    def close(self) -> None:
        self.heads = []
        self.batch.close()


@dataclass(frozen=True, slots=True)
class Volume:
    """What a subclass's :meth:`~OffsetLayoutBackend._attach` hands over."""

    #: The volume, opened read-write through the engine (and locked against others).
    file: IoFile
    #: Bytes available on the volume right now (file size, or device size).
    size: int
    #: A block device rather than a regular file.
    device: bool


class OffsetLayoutBackend(GroupReadBackend, BuiltinBackend):
    """Objects as records at allocator-chosen offsets of one volume; see the module doc.

    Options beyond the common ones: ``policy`` (``fifo`` or ``lru``), ``auto_evict``
    (a write that does not fit evicts instead of failing), ``engine`` and ``direct``
    (the io engine and O_DIRECT), ``checkpoint_bytes`` (checkpoint after this much was
    written, which bounds the work of recovery after a crash), ``index_bytes`` (the size
    of each checkpoint slot, fixed when the volume is formatted).
    """

    #: The volume size used when a new volume is created without a capacity.
    DEFAULT_VOLUME_SIZE = 1 * GiB
    eviction_granularity = EvictionGranularity.OBJECT

    def __init__(self, path: str | os.PathLike, *, capacity: int | None = None,
                 max_value_size: int = DEFAULT_MAX_VALUE_SIZE,
                 on_evict: EvictionCallback | None = None,
                 mode: OpenMode = OpenMode.READ_WRITE,
                 policy: EvictionPolicy = EvictionPolicy.FIFO, auto_evict: bool = True,
                 engine: str | None = None, direct: bool | None = None,
                 checkpoint_bytes: int = 1 * GiB, index_bytes: int | None = None) -> None:
        super().__init__(path, capacity=capacity, max_value_size=max_value_size,
                         on_evict=on_evict, mode=mode)
        if checkpoint_bytes <= 0:
            raise InvalidRequestError(f"checkpoint_bytes must be positive, not {checkpoint_bytes}")
        self.policy = EvictionPolicy.parse(policy)
        self.auto_evict = auto_evict
        self.checkpoint_bytes = checkpoint_bytes
        self.index_bytes = index_bytes
        try:
            self._engine: IoEngine = get_engine(engine, direct=direct)
        except (ValueError, EngineUnavailableError) as exc:
            raise InvalidRequestError(str(exc), path=path) from None
        self._lock = threading.Lock()
        self.index: ObjectIndex[Entry] = ObjectIndex(self._location, self._lock)
        #: The visible objects, first to be evicted first (the values are their entries).
        self._order: EvictionOrder[str, Entry] = EvictionOrder(self.policy)
        self._claims = WriteClaims(self._lock)
        self._scratch = ScratchMemory()
        self._records_bytes = 0      # footprints of visible objects
        self._index_used = 0         # checkpoint bytes of visible + placed objects
        #: Locks and claims the subclass took in _attach, released at close.
        self._holds: list = []
        #: What this open found wrong and did (or, read-only, left) about it; the next
        #: check() reports them.
        self.open_problems: list[Problem] = []

        try:
            volume = self._attach()
        except BaseException:
            self._release_holds()
            raise
        self._file = volume.file
        self.device = volume.device
        try:
            self._geometry = self._open_geometry(volume)
            self._alloc = OffsetAllocator(self._geometry.data_size, ALIGN)
            self._load(self._recover(volume))
        except BaseException as exc:
            self._file.close()
            self._release_holds()
            if isinstance(exc, OSError) and not isinstance(exc, BackendError):
                raise from_oserror(exc, path=self._file.path,
                                   action="opening the volume") from exc
            raise

    # -- subclass hooks ----------------------------------------------------------------

    def _attach(self) -> Volume:
        """Open the volume (creating a new one with :meth:`_create_volume` where there is
        none and the mode allows), locked against other processes; add what must be
        released at close to ``self._holds``. Implemented by each backend."""
        raise NotImplementedError

    def _volume_size_for_new(self, available: int) -> int:
        """The size to format a volume with, given the bytes available."""
        return self.capacity if self.capacity is not None else available

    def _may_format(self, volume: Volume, first_block) -> bool:
        """Whether a volume without a readable superblock may be formatted in place.
        Never, here: new volume files are created formatted. ``nvmeof`` allows it for a
        device (or a file it did not create) whose first MiB is blank, or with consent."""
        return False

    @property
    def quarantine_dir(self) -> Path:
        """Where check(repair=True) copies bad records."""
        raise NotImplementedError

    @property
    def quarantine(self) -> Quarantine:
        return Quarantine(self.quarantine_dir)

    def _repair_hint(self) -> str:
        """What to tell an operator whose volume's metadata cannot be read."""
        return (f"restore the volume from a backup, run `kvstore recover --offline "
                f"{self.path} --repair` to rebuild its metadata from the records that "
                f"still check, or move {self.path} aside to start a new store")

    def _release_holds(self) -> None:
        while self._holds:
            self._holds.pop().release()

    # -- creating a volume ----------------------------------------------------------

    def _create_volume(self, target: Path, size: int) -> bool:
        """Create the volume file ``target`` with ``size`` bytes allocated (not sparse)
        and formatted, atomically: it is built under a temporary name and linked into
        place only when complete, so a volume file that exists was formatted, and a
        crash leaves no volume or a whole one. Returns False if another process created
        it meanwhile (theirs is kept). CapacityError when the file system cannot hold it.
        """
        geometry = Geometry.plan(size, self.index_bytes)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, PRIVATE_FILE)
        try:
            os.fchmod(fd, PRIVATE_FILE)
            _allocate(fd, size, target)
            file = IoFile(os.dup(fd), str(tmp))
            try:
                self._write_format(file, geometry, 0, [])
            finally:
                file.close()
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            os.unlink(tmp)
            raise
        os.close(fd)
        try:
            os.link(tmp, target)  # never replaces a volume someone else just made
            created = True
        except FileExistsError:
            created = False
        finally:
            os.unlink(tmp)
        fsync_dir(target.parent)
        if created:
            log.info("%s: created and formatted a %s offset volume", target,
                     format_size(size))
        return created

    # -- open: format or recover ------------------------------------------------------

    def _open_geometry(self, volume: Volume) -> Geometry:
        block = read_exact(self._engine, self._file, 0, ALIGN) if volume.size >= ALIGN \
            else bytes(ALIGN)
        try:
            geometry = Geometry.decode(block, path=self._file.path)
        except CorruptionError as exc:
            return self._unreadable_superblock(volume, block, exc)
        if self.capacity is not None and geometry.volume_size != self.capacity - \
                self.capacity % ALIGN:
            raise InvalidRequestError(
                f"the volume was formatted with {geometry.volume_size} bytes, not the "
                f"{self.capacity} asked for; resizing is not supported: open it with "
                f"capacity={geometry.volume_size} (or none), or move it aside to start a "
                "new one", path=self._file.path)
        if volume.size < geometry.volume_size:
            self._restore_size(volume, geometry)
        return geometry

    def _unreadable_superblock(self, volume: Volume, block, exc: CorruptionError) -> Geometry:
        """No superblock that checks: format only a blank device (or with consent), rebuild
        in repair mode, refuse otherwise."""
        ours = block[:len(SUPER_MAGIC)] == SUPER_MAGIC
        if self.mode is OpenMode.REPAIR and (any(block) or self._has_checkpoints(volume)):
            return self._rebuild_superblock(volume, exc.message)
        if not ours and self._may_format(volume, block):
            if self.read_only:
                raise MissingStoreError(
                    "no volume here: the device or file is blank (never formatted), and a "
                    "read-only open does not format it", path=self._file.path)
            geometry = Geometry.plan(self._volume_size_for_new(volume.size), self.index_bytes)
            if geometry.volume_size > volume.size:
                raise InvalidRequestError(
                    f"capacity {geometry.volume_size} exceeds the {volume.size} bytes of the "
                    "device; give a capacity up to its size, or none to use all of it",
                    path=self._file.path)
            self._write_format(self._file, geometry, 0, [])
            return geometry
        raise CorruptionError(
            f"{exc.message}. kvstored never formats over data it cannot read: "
            f"{self._repair_hint()}", path=self._file.path) from None

    def _has_checkpoints(self, volume: Volume) -> bool:
        """Whether checkpoint slot A (always at 4096) holds a checkpoint header."""
        if volume.size < 2 * ALIGN:
            return False
        return peek_slot(read_exact(self._engine, self._file, ALIGN, ALIGN)) is not None

    def _restore_size(self, volume: Volume, geometry: Geometry) -> None:
        """A volume shorter than its superblock says: a device is refused, a regular file
        (truncated by accident or by a test) is grown back; records past the cut are lost
        and recovery drops them. Read-only, the file is left as it is."""
        if volume.device:
            raise InvalidRequestError(
                f"the device holds {volume.size} bytes but its volume was formatted with "
                f"{geometry.volume_size}; is this the right device?", path=self._file.path)
        log.warning("%s: the volume file is %d bytes, its superblock says %d; %s (records "
                    "past the cut are lost)", self._file.path, volume.size,
                    geometry.volume_size,
                    "left as it is (read-only)" if self.read_only else "growing it back")
        if not self.read_only:
            _allocate(self._file.fd, geometry.volume_size, self._file.path)

    def _write_format(self, file: IoFile, geometry: Geometry, seq: int,
                      entries: list[bytes]) -> None:
        """Write a volume's metadata: checkpoint slot A (generation 0, holding
        ``entries`` as of ``seq``), an empty slot B, then the superblock, last: a crash in
        between leaves no superblock, hence no volume that anyone could take for one."""
        slot_a, slot_b = geometry.slot_offsets
        first = encode_checkpoint(geometry, 0, seq, entries)  # generation g in slot g % 2
        write_sync(self._engine, file, [(file, slot_a, first), (file, slot_b, bytes(ALIGN))],
                   "formatting the volume")
        write_sync(self._engine, file, [(file, 0, geometry.encode())],
                   "writing the superblock")
        log.info("%s: formatted a %d-byte offset volume (index %d bytes per slot, journal "
                 "%d bytes, data from %d)", file.path, geometry.volume_size,
                 geometry.slot_size, geometry.journal_size, geometry.data_offset)

    # -- repair mode: rebuilding lost metadata ----------------------------------------

    def _rebuild_superblock(self, volume: Volume, why: str) -> Geometry:
        """Repair mode, the superblock does not check: set the volume's first MiB aside,
        then recognise the volume from its checkpoint slots and write the superblock
        again, or, if they are lost too, rebuild everything from the records."""
        size = volume.size if not volume.device else self._volume_size_for_new(volume.size)
        self._copy_out(0, min(volume.size, 1 * MiB) - min(volume.size, 1 * MiB) % ALIGN,
                       "head", why)
        geometry = find_geometry(self._engine, self._file, size - size % ALIGN,
                                 self.index_bytes)
        if geometry is None:
            return self._rebuild_from_records(Geometry.plan(size, self.index_bytes),
                                              f"the superblock did not check ({why}) and "
                                              "the checkpoint slots do not identify the "
                                              "volume")
        write_sync(self._engine, self._file, [(self._file, 0, geometry.encode())],
                   "rewriting the superblock")
        self._note(ProblemKind.CORRUPT_RECORD, f"the superblock did not check ({why})",
                   f"the superblock, from the checkpoint slots of volume "
                   f"{geometry.uuid.hex()}; the first MiB was copied to the quarantine first")
        return geometry

    def _rebuild_from_records(self, geometry: Geometry, why: str) -> Geometry:
        """Scan the volume for every record that checks and write new metadata (for
        ``geometry``) indexing the newest record of each key."""
        found = salvage_records(self._file.path, ALIGN, geometry.volume_size,
                                below=geometry.data_offset)
        for offset, header in found.shadowed:  # the new metadata goes over them: copy out
            self._copy_out(offset, record_size(header.value_len), f"{offset:x}",
                           f"{why}; the record of {header.key!r} lies where the rebuilt "
                           "metadata goes")
        ordered = sorted(found.records.items(), key=lambda item: item[1][1].seq)
        entries, kept = [], 0
        budget = geometry.index_capacity
        for key, (offset, header) in reversed(ordered):  # newest first, if they do not all fit
            packed = pack_entry(offset, header.value_len, header.seq, header.write_ns,
                                header.value_crc, key.encode())
            if len(packed) > budget:
                break
            budget -= len(packed)
            entries.append(packed)
            kept += 1
        entries.reverse()
        seq = max((h.seq for _, h in found.records.values()), default=0)
        self._write_format(self._file, geometry, seq, entries)
        lost = len(ordered) - kept
        self._note(ProblemKind.INDEX_MISMATCH, why,
                   f"the index, from {kept} record(s) found by scanning "
                   f"{format_size(found.scanned_bytes)} of the volume"
                   + (f" ({lost} older one(s) did not fit the index)" if lost else "")
                   + "; objects deleted before the damage may reappear")
        return geometry

    def _recover(self, volume: Volume) -> Recovered:
        try:
            return recover(self._engine, self._file, self._geometry, valid_end=volume.size)
        except CorruptionError as exc:
            if self.mode is not OpenMode.REPAIR:
                raise CorruptionError(f"{exc.message}: {self._repair_hint()}",
                                      path=self._file.path) from None
            slot_a, _ = self._geometry.slot_offsets
            self._copy_out(slot_a, 2 * self._geometry.slot_size, "checkpoints", exc.message)
            self._rebuild_from_records(self._geometry, exc.message)
            return recover(self._engine, self._file, self._geometry, valid_end=volume.size)

    def _copy_out(self, offset: int, length: int, stem: str, why: str) -> str | None:
        """Copy ``length`` bytes of the volume at ``offset`` to the quarantine."""
        return self.quarantine.copy_range(self._file.path, offset, length, reason=why,
                                          stem=f"{Path(self._file.path).name}-{stem}",
                                          volume=self._file.path)

    def _note(self, kind: ProblemKind, detail: str, rebuilt: str) -> None:
        log.warning("%s: %s: %s", self._file.path, detail, rebuilt)
        self.open_problems.append(Problem(kind, detail, path=self._file.path,
                                          action=RepairAction.REBUILT, action_detail=rebuilt))

    def _load(self, found: Recovered) -> None:
        data_offset = self._geometry.data_offset
        self._alloc.reserve_many((offset - data_offset, footprint)
                                 for offset, footprint in found.extents)
        for key, entry in found.entries.items():  # already in eviction order
            self.index.add(key, entry)
            self._order.add(key, entry)
        self._records_bytes = sum(offset[1] for offset in found.extents)
        self._index_used = sum(len(entry.packed) for entry in found.entries.values())
        #: What the last open found, for logs, metrics and benchmarks.
        self.last_recovery = {"objects": len(found.entries), "journal_entries": found.replayed,
                              "replayed_records": found.records, "notes": list(found.notes)}
        self._seq = found.last_seq
        # What recovery dropped (records cut off or overlapped) is reported by the next
        # check(): an open that loses an acknowledged record must never look clean.
        self.open_problems.extend(
            Problem(ProblemKind.INDEX_MISMATCH, note, None, self._file.path,
                    RepairAction.DROPPED_FROM_INDEX, "at open") for note in found.notes)
        self._journal = JournalGate(self._engine, self._file, self._geometry, self._lock,
                                    self._snapshot_locked, generation=found.generation,
                                    checkpoint_bytes=self.checkpoint_bytes)
        if (found.replayed or found.notes) and not self.read_only:
            # Restart the journal on a checkpoint of the recovered state, so that new
            # entries never overwrite live ones.
            log.info("%s: replayed %d journal entries; %d objects", self._file.path,
                     found.replayed, len(self.index))
            self._journal.checkpoint()

    # -- lifecycle ---------------------------------------------------------------------

    def _close(self) -> None:
        try:
            self._journal.close()
        except BackendError as exc:
            log.error("%s: the closing checkpoint failed (%s); the journal still holds "
                      "everything, the next open replays it", self.path, exc)
        finally:
            self._file.close()
            self._release_holds()
            with self._lock:
                self.index.clear()
                self._order.clear()

    def write_batch_hint(self) -> WriteBatchHint:
        """Any batch size works; a batch costs one journal entry and one fdatasync, and
        200 records is what one 4 KiB journal block holds."""
        return WriteBatchHint(max_bytes=64 << 20, max_keys=200, max_age=0.5)

    # -- the journal gate -----------------------------------------------------------

    @property
    def generation(self) -> int:
        """The generation of the newest durable checkpoint."""
        return self._journal.generation

    def _take_seqs_locked(self, n: int) -> int:
        first = self._seq + 1
        self._seq += n
        return first

    def _snapshot_locked(self) -> tuple[int, list[bytes]]:
        return self._seq, [entry.packed for entry in self._order.values()]

    def checkpoint(self) -> None:
        """Write a checkpoint now (normally they happen on their own)."""
        self._check_writable()
        self._journal.checkpoint()

    # -- writes ------------------------------------------------------------------------

    def batch_write(self, items: Sequence[tuple[str, Buffer]]) -> list[WriteResult]:
        self._check_writable()
        encoded = self._check_value_sizes(items)
        results: list[WriteResult | None] = [None] * len(items)

        def write(positions: list[int]) -> None:
            claimed = [(i, items[i][0], encoded[i], memoryview(items[i][1]).cast("B"))
                       for i in positions]
            for start in range(0, len(claimed), WRITE_CHUNK):
                self._write_chunk(claimed[start:start + WRITE_CHUNK], results)

        for i in self._claims.write_batch([key for key, _ in items],
                                          stored=self.index.__contains__, write=write):
            results[i] = WriteResult(items[i][0], WriteOutcome.EXISTS)
        return results  # type: ignore[return-value]

    def _write_chunk(self, chunk, results: list) -> None:
        placed = []
        for i, key, key_bytes, view in chunk:
            where = self._place(key, record_size(view.nbytes), entry_size(key_bytes))
            if isinstance(where, BackendError):
                results[i] = WriteResult(key, WriteOutcome.FAILED, where)
            else:
                placed.append((i, key, key_bytes, view, where))
        if not placed:
            return
        try:
            block = self._journal.enter(journal_blocks(len(placed), []))
        except BackendError as exc:  # a checkpoint for journal room failed
            for i, key, _, _, offset in placed:
                results[i] = WriteResult(key, WriteOutcome.FAILED, exc)
                with self._lock:
                    self._alloc.free(offset - self._geometry.data_offset)
            with self._lock:
                self._index_used -= sum(entry_size(kb) for _, _, kb, _, _ in placed)
            return
        written, abandoned = 0, None
        try:
            with self._lock:
                first_seq = self._take_seqs_locked(len(placed))
            records, io_items = [], []
            # A header block and a tail block per record, page-aligned, so that O_DIRECT
            # takes each record's request as it is (no bounce copy).
            blocks = self._scratch.take(len(placed) * 2 * ALIGN)
            for n, (i, key, key_bytes, view, offset) in enumerate(placed):
                entry, head_crc = self._encode_record(
                    key_bytes, view, offset, first_seq + n,
                    blocks[2 * n * ALIGN:(2 * n + 2) * ALIGN], io_items)
                records.append((i, key, entry, head_crc, len(io_items)))
            try:
                outcomes = self._engine.write(io_items)
            except BaseException:
                for _, _, entry, _, _ in records:
                    self._unplace(entry)
                raise
            good, start = [], 0
            for i, key, entry, head_crc, end in records:
                error = next((r for r in outcomes[start:end] if isinstance(r, IoError)), None)
                start = end
                if error is None:
                    good.append((i, key, entry, head_crc))
                    continue
                # Not journalled, so never recovered: the space can be reused at once.
                results[i] = WriteResult(key, WriteOutcome.FAILED, from_oserror(
                    error, key=key, path=self._file.path, action="writing the record"))
                self._unplace(entry)
            if good:
                try:
                    self._journal.append(block, first_seq + len(placed) - 1,
                                  [(e.offset, e.size, h) for _, _, e, h in good], [])
                except BackendError as exc:
                    abandoned = (good, exc)
                else:
                    self._publish(good, results)
                    written = sum(e.footprint for _, _, e, _ in good)
        finally:
            self._journal.leave(written)
        if abandoned is not None:  # outside the gate: cancelling needs the journal again
            self._abandon(*abandoned, results)

    def _encode_record(self, key_bytes: bytes, view: memoryview, offset: int, seq: int,
                       blocks: memoryview, io_items: list) -> tuple[Entry, int]:
        """Append the engine item writing one record, using ``blocks`` (two aligned
        blocks of scratch) for its header and tail; return its index entry and its
        header CRC (which the journal records).

        The record is one vectored request: header block, the value from the caller's
        memory and, on O_DIRECT, its last partial block zero-padded in scratch (so the
        engine needs no read-modify-write and no bounce copy)."""
        crc = crc32c(view)
        write_ns = time.time_ns()
        header = blocks[:ALIGN]
        header[:] = encode_header(key_bytes, view.nbytes, seq, crc, write_ns=write_ns)
        entry = Entry.build(key_bytes, offset, view.nbytes, seq, write_ns, crc)
        body = view.nbytes - view.nbytes % ALIGN if self._file.direct else view.nbytes
        pieces = [header, view[:body]]
        if body < view.nbytes:
            tail = blocks[ALIGN:]
            tail[:view.nbytes - body] = view[body:]
            tail[view.nbytes - body:] = bytes(ALIGN - (view.nbytes - body))
            pieces.append(tail)
        io_items.append((self._file, offset, pieces))
        return entry, header_crc_of(header)

    def _publish(self, good, results: list) -> None:
        with self._lock:
            for i, key, entry, _ in good:
                self.index.add(key, entry)
                self._order.add(key, entry)
                self._records_bytes += entry.footprint
                results[i] = WriteResult(key, WriteOutcome.WRITTEN)

    def _abandon(self, good, error: BackendError, results: list) -> None:
        """The journal write or fdatasync failed: fail the items and, since the journal
        entry may still reach the disk, try to cancel them with tombstones before their
        space is reused; if even that fails, keep their space until the next open."""
        for i, key, _, _ in good:
            results[i] = WriteResult(key, WriteOutcome.FAILED, error)
        victims = [(key, entry) for _, key, entry, _ in good]
        try:
            self._tombstone(victims)
        except BackendError as exc:
            log.error("%s: could not cancel %d failed writes (%s); their space is held "
                      "until the next open", self.path, len(victims), exc)
            return
        for _, entry in victims:
            self._unplace(entry)

    # -- placement and eviction --------------------------------------------------------

    def _place(self, key: str, footprint: int, index_cost: int) -> int | BackendError:
        """Allocate an extent for a record (evicting if allowed); return its volume
        offset, or the CapacityError to report."""
        geometry = self._geometry
        if footprint > geometry.data_size or index_cost > geometry.index_capacity:
            return CapacityError(
                f"the object needs {footprint} bytes, more than the volume's whole data "
                f"area of {geometry.data_size}", key=key, path=self._file.path)
        while True:
            with self._lock:
                if self._index_used + index_cost <= geometry.index_capacity:
                    offset = self._alloc.allocate(footprint)
                    if offset is not None:
                        self._index_used += index_cost
                        return offset + geometry.data_offset
                victims = []
                if self.auto_evict:
                    victims = self._choose_victims_locked(footprint, index_cost)
                if not victims:
                    return CapacityError(
                        f"no room: {self._alloc.used_bytes} of {geometry.data_size} data "
                        f"bytes and {self._index_used} of {geometry.index_capacity} index "
                        "bytes in use, and nothing evictable; delete objects or give the "
                        "volume more capacity", key=key, path=self._file.path)
            self._retire(victims, self.on_evict, evicting=True)

    def _unplace(self, entry: Entry) -> None:
        """Give back an extent (and its index bytes) that no visible object uses."""
        with self._lock:
            self._alloc.free(entry.offset - self._geometry.data_offset)
            self._index_used -= len(entry.packed)

    def _choose_victims_locked(self, nbytes: int, index_cost: int = 0) -> list[tuple[str, Entry]]:
        """Detach victims in policy order (skipping pinned keys) until they free
        ``nbytes`` of data and ``index_cost`` of index beyond what is free."""
        need_index = self._index_used + index_cost - self._geometry.index_capacity
        victims, freed, freed_index = [], 0, 0
        for key, entry in self._order.items():
            if freed >= nbytes and freed_index >= need_index:
                break
            if self._pins.is_pinned(key):
                continue
            victims.append((key, entry))
            freed += entry.footprint
            freed_index += len(entry.packed)
        for key, entry in victims:
            self._detach_locked(key, entry)
        return victims

    def _detach_locked(self, key: str, entry: Entry) -> None:
        self.index.pop(key)
        self._order.discard(key)
        self._records_bytes -= entry.footprint

    def _retire(self, victims: list[tuple[str, Entry]], callback: EvictionCallback | None,
                *, evicting: bool) -> None:
        """Make the removal of detached ``victims`` durable, then free their space."""
        try:
            if callback is not None:
                callback([key for key, _ in victims])
        finally:  # a failing callback must not leave the removal half done
            self._make_durable(victims, evicting)

    def _make_durable(self, victims: list[tuple[str, Entry]], evicting: bool) -> None:
        """Journal the victims' tombstones, then free their extents (when unpinned).
        If the journal cannot be written, a delete is undone and raises; an eviction
        keeps its space held (a crash could bring the records back) and logs."""
        try:
            self._tombstone(victims)
        except BackendError as exc:
            if not evicting:
                with self._lock:  # the delete did not happen: put the keys back
                    for key, entry in victims:
                        if key in self.index or self._claims.claimed(key):
                            continue  # written again meanwhile: keep the new one
                        self.index.add(key, entry)
                        self._order.add(key, entry)
                        self._records_bytes += entry.footprint
                raise
            log.error("%s: evicting %d objects could not be made durable (%s); their "
                      "space is held until the next open", self.path, len(victims), exc)
            return
        for key, entry in victims:
            self._pins.when_released(key, lambda e=entry: self._unplace(e))

    def _tombstone(self, victims: list[tuple[str, Entry]]) -> None:
        """Journal a tombstone per victim and fdatasync."""
        for start in range(0, len(victims), TOMBSTONE_CHUNK):
            chunk = victims[start:start + TOMBSTONE_CHUNK]
            lengths = [HEADER_SIZE + len(key.encode()) for key, _ in chunk]
            block = self._journal.enter(journal_blocks(0, lengths))
            try:
                with self._lock:
                    first = self._take_seqs_locked(len(chunk))
                tombs = [tombstone_bytes(key.encode(), first + n)
                         for n, (key, _) in enumerate(chunk)]
                self._journal.append(block, first + len(chunk) - 1, [], tombs)
            finally:
                self._journal.leave()

    def evict(self, nbytes: int, on_evict: EvictionCallback | None = None) -> list[str]:
        self._check_writable()
        with self._lock:
            victims = self._choose_victims_locked(max(nbytes, 0)) if nbytes > 0 else []
        if victims:
            self._retire(victims, on_evict, evicting=True)
        return [key for key, _ in victims]

    def batch_delete(self, keys: Sequence[str]) -> list[bool]:
        self._check_writable()
        for key in keys:
            encode_key(key)
        removed: list[tuple[str, Entry]] = []
        found = []
        with self._lock:
            for key in keys:
                entry = self.index.get(key)
                found.append(entry is not None)
                if entry is not None:
                    self._detach_locked(key, entry)
                    removed.append((key, entry))
        if removed:
            self._retire(removed, None, evicting=False)
        return found

    # -- reads -------------------------------------------------------------------------

    def _start_group(self, keys: Sequence[str], buffers: Sequence[memoryview], span: range,
                     *, wait: bool = False) -> RecordReadGroup:
        """Look up and pin the keys of ``span`` and start reading them: a ``batch_read``
        (``wait``: read at once) or one group of a stream. The pins hold until the group
        is released."""
        answered: list[int] = [ReadStatus.MISSING] * len(span)
        plan: list[tuple[str, Entry, memoryview]] = []
        read_at: list[int] = []
        names = keys[span.start:span.stop]
        touch = self._order.touch if self._order.moves_on_read else None
        with self._lock:
            for n, (key, entry) in enumerate(zip(names, self.index.get_many(names))):
                if entry is None:
                    continue
                target = byte_view(buffers[span.start + n])
                if target.nbytes < entry.size:
                    answered[n] = ReadStatus.BUFFER_TOO_SMALL
                    continue
                if touch is not None:
                    touch(key)
                plan.append((key, entry, target))
                read_at.append(n)
            pinned = self._pins.acquire([key for key, _, _ in plan])
        try:
            reads = self._start_entries(plan, wait=wait) if plan else None
        except BaseException:
            self._pins.release(pinned)
            raise
        return RecordReadGroup(span, answered, read_at, reads,
                               lambda k, outcome: self._note_failed_read(
                                   plan[k][0], f"{self._file.path} at {plan[k][1].offset}",
                                   outcome),
                               lambda: self._pins.release(pinned))

    def _start_entries(self, plan: Sequence[tuple[str, Entry, memoryview]], *,
                       wait: bool) -> EntryReads:
        """Start reading each ``(key, entry, destination)`` in one engine submission.

        One vectored request per record: its header block into scratch, its value
        straight into the destination (so a value is never copied on its way). With
        ``wait`` the reads are done on return, into this thread's scratch (a
        ``batch_read``); without, they stay in flight, into scratch lent for their life
        (a stream's group)."""
        loan = None if wait else _stream_scratch.lend(len(plan) * ALIGN)
        memory = self._scratch.take(len(plan) * ALIGN) if loan is None else loan.view
        heads = [memory[at:at + ALIGN] for at in range(0, len(plan) * ALIGN, ALIGN)]
        file = self._file
        items: list[Item] = [(file, entry.offset, [head, target[:entry.size]])
                             for head, (_, entry, target) in zip(heads, plan)]
        return EntryReads(LentBatch(self._engine, items, _stream_scratch, loan), plan, heads)

    def _read_entries(self, plan: Sequence[tuple[str, Entry, memoryview]]
                      ) -> list[ReadOutcome]:
        """Read each ``(key, entry, destination)`` in one engine submission, verified."""
        if not plan:
            return []
        return outcomes_of(*self._start_entries(plan, wait=True).finish())

    def _location(self, entry: Entry) -> Location:
        return Location(self._file.path, entry.offset + VALUE_OFFSET, entry.size,
                        entry.offset, entry.footprint, device=self.device)

    def usage(self) -> Usage:
        """Physical bytes are the volume's fixed metadata plus the records of visible
        objects. Journalled tombstones and space awaiting the end of a read are not
        counted: they are transient, and the preallocated volume bounds everything."""
        self._check_open()
        with self._lock:
            return Usage(self.index.logical_bytes,
                         self._geometry.data_offset + self._records_bytes, len(self.index),
                         self._geometry.volume_size)

    # -- check and repair ---------------------------------------------------------------

    def check(self, repair: bool = False) -> CheckReport:
        self._check_checkable(repair)
        return check_volume(self, repair)

    # What check.py needs of the volume (its CheckedVolume), and nothing else: these are
    # not part of the SDK contract.

    @property
    def engine(self) -> IoEngine:
        """The io engine every I/O of this volume goes through."""
        return self._engine

    @property
    def volume_file(self) -> IoFile:
        """The volume, open through the engine."""
        return self._file

    @property
    def geometry(self) -> Geometry:
        return self._geometry

    def indexed(self) -> list[tuple[str, Entry]]:
        return self.index.snapshot()

    def read_back(self, records: Sequence[tuple[str, Entry]]) -> list[ReadOutcome | None]:
        with self.pin([key for key, _ in records]):
            outcomes: list[ReadOutcome | None] = list(self._read_entries(
                [(key, entry, memoryview(bytearray(entry.size))) for key, entry in records]))
        for n, (key, entry) in enumerate(records):
            if not self.index.is_current(key, entry):
                outcomes[n] = None  # deleted or evicted since the snapshot
        return outcomes

    def set_aside(self, key: str, entry: Entry, reason: str) -> str | None:
        where = self.quarantine.copy_range(
            self._file.path, entry.offset, entry.footprint, reason=reason, key=key,
            volume=self._file.path, value_length=entry.size, seq=entry.seq,
            value_crc32c=entry.checksum)
        self.drop(key, entry)
        return where

    def record_path(self, entry: Entry) -> str:
        return self._file.path

    def drop(self, key: str, entry: Entry) -> None:
        with self._lock:
            if self.index.get(key) is not entry:
                return  # deleted, or deleted and written again, meanwhile
            self._detach_locked(key, entry)
        self._retire([(key, entry)], None, evicting=False)

    def audit(self) -> IndexAudit:
        data_offset = self._geometry.data_offset
        with self._lock:
            entries = sorted(self.index.items(), key=lambda item: item[1].offset)
            unallocated = [key for key, entry in entries
                           if (entry.offset - data_offset) not in self._alloc
                           or self._alloc.allocation_size(entry.offset - data_offset)
                           != entry.footprint]
            return IndexAudit(entries, self.index.logical_bytes, self._records_bytes,
                              unallocated)


def _allocate(fd: int, size: int, path) -> None:
    """``posix_fallocate`` the first ``size`` bytes of ``fd``; a full file system is a
    CapacityError naming the file, the size needed and what is free."""
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        st = os.fstatvfs(fd)
        free = st.f_bavail * st.f_frsize
        raise CapacityError(
            f"the volume needs {format_size(size)} ({size} bytes) but the file system holding "
            f"it has {format_size(free)} free; give a smaller capacity (the node's --ssd) or "
            "free space", path=path) from None
