"""``3fs``: a backend shared by a cluster, on a 3FS mount (or any shared file system).

The directory layout and the names are in :mod:`.layout`.

Each node writes only under its own directory, so no two nodes ever write one file; any
node reads any node's records directly (``capabilities.shared``), finding them through
that node's journal. The SDK calls that describe "what is stored" (``scan``, ``stat``,
``contains``, ``usage``, ``locate``, ``evict``, ``check``, deletes) concern this node's
objects; ``batch_read`` also finds other nodes' objects (see view.py for
when they become visible), and :meth:`ThreeFsBackend.find`, :meth:`~ThreeFsBackend.nodes`
and :meth:`~ThreeFsBackend.scan_cluster` expose the rest of the cluster.

A batch is written as: records appended to the node's active shard (one engine
submission), the shard fsync'd, the journal entries appended and fsync'd, and only then
the objects are visible and acknowledged. Data I/O goes through 3FS's USRBIO where it is
available (usrbio.py), else through kvstored's io engine.

Every open mode of the SDK is supported. Read-only, nothing under the path is created or
changed (the journal's torn tail and the shards' sparse tails are left, the lock is taken
shared); repair mode sets an unreadable journal aside and starts a new one, whose shards
``check(repair=True)`` then adopts from their records.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from kvstored.backends.builtin import BuiltinBackend
from kvstored.backends.stamp import STAMP_NAME, claim_directory, read_stamp
from kvstored.backends.threefs.check import check_node
from kvstored.backends.threefs.files import (
    HandleCache,
    ReadRequest,
    read_records,
)
from kvstored.backends.threefs.index import NodeIndex, Shard, Slot, slot_location
from kvstored.backends.threefs.journal import (
    ENTRY_SIZE,
    HEADER_SIZE,
    JOURNAL_NAME,
    Entry,
    Header,
    JournalStuckError,
    JournalWriter,
    Kind,
    entry_size,
)
from kvstored.backends.threefs.layout import (
    LAYOUT_VERSION,
    check_name,
    default_node_id,
    shard_path,
)
from kvstored.backends.threefs.recovery import Finding, Recovered, recover
from kvstored.backends.threefs.usrbio import choose_usrbio
from kvstored.backends.threefs.view import ClusterView
from kvstored.backends.threefs.writer import Placed, write_records
from kvstored.native import IoFile, get_engine, sync_written
from kvstored.sdk.backend import EvictionCallback
from kvstored.sdk.claims import WriteClaims
from kvstored.sdk.errors import (
    BackendError,
    BackendIOError,
    CapacityError,
    CorruptionError,
    InvalidRequestError,
    MissingStoreError,
    from_oserror,
)
from kvstored.sdk.eviction import EvictionOrder, EvictionPolicy
from kvstored.sdk.files import fsync_dir, make_private_dirs
from kvstored.sdk.lock import LOCK_NAME, StoreLock
from kvstored.sdk.quarantine import Quarantine
from kvstored.sdk.record import (
    ReadOutcome,
    align_up,
    record_size,
)
from kvstored.sdk.types import (
    DEFAULT_MAX_VALUE_SIZE,
    Buffer,
    CheckReport,
    EvictionGranularity,
    ObjectRecord,
    OpenMode,
    Problem,
    ReadStatus,
    Usage,
    WriteBatchHint,
    WriteOutcome,
    WriteResult,
    encode_key,
)

log = logging.getLogger(__name__)

DEFAULT_SHARD_BYTES = 256 << 20
MIN_SHARD_BYTES = 64 << 10
#: Compact the journal once its dead entries outweigh its live ones by this much.
COMPACT_MIN_DEAD_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class SharedObject:
    """An object anywhere in the cluster, as :meth:`ThreeFsBackend.find` reports it."""

    node_id: str
    record: ObjectRecord


class ThreeFsBackend(BuiltinBackend):
    """Per-node append-only shards plus a journal, on a file system every node mounts.

    Options, besides ``capacity`` (this node's files), ``max_value_size`` and
    ``on_evict``:

    ``cluster``       the cluster's directory name under the path (default ``default``)
    ``node_id``       this node's directory name (default: the host name)
    ``shard_bytes``   a shard is sealed and a new one begun past this size (256 MiB; at
                      most an eighth of ``capacity``, so eviction has several to choose)
    ``policy``        ``fifo`` (oldest shard first) or ``lru`` (least recently read):
                      an :class:`~kvstored.sdk.eviction.EvictionPolicy`
    ``auto_evict``    let a write that does not fit evict shards (default True)
    ``usrbio``        ``auto`` | ``on`` | ``off``: 3FS's native I/O (see usrbio.py)
    ``shared_reads``  let ``batch_read`` find other nodes' objects (default True)
    ``engine``, ``direct``  the io engine for POSIX I/O through the mount
    """

    name = "3fs"
    sdk_version = "1.0"
    eviction_granularity = EvictionGranularity.BUCKET
    shared_by_nodes = True
    #: What a cluster directory holds besides its stamp: node directories, which have no
    #: fixed name, so a cluster directory with a lost stamp is not recognised by name.
    layout_markers: tuple[str, ...] = ()

    def __init__(self, path: str | os.PathLike, *, capacity: int | None = None,
                 max_value_size: int = DEFAULT_MAX_VALUE_SIZE,
                 on_evict: EvictionCallback | None = None,
                 mode: OpenMode = OpenMode.READ_WRITE,
                 engine: str | None = None, direct: bool | None = None,
                 cluster: str = "default", node_id: str | None = None,
                 shard_bytes: int = DEFAULT_SHARD_BYTES,
                 policy: EvictionPolicy = EvictionPolicy.FIFO,
                 auto_evict: bool = True, usrbio: str = "auto",
                 shared_reads: bool = True) -> None:
        super().__init__(path, capacity=capacity, max_value_size=max_value_size,
                         on_evict=on_evict, mode=mode)
        if shard_bytes < MIN_SHARD_BYTES:
            raise InvalidRequestError(f"shard_bytes must be at least {MIN_SHARD_BYTES}, "
                                      f"not {shard_bytes}")
        self.policy = EvictionPolicy.parse(policy)
        self.auto_evict = auto_evict
        self.cluster = check_name("cluster", cluster)
        self.node_id = check_name("node_id", node_id) if node_id else default_node_id()
        self.shard_bytes = (shard_bytes if capacity is None
                            else max(MIN_SHARD_BYTES, min(shard_bytes, capacity // 8)))
        self.root = Path(self.path)
        self.cluster_dir = self.root / self.cluster
        self.node_dir = self.cluster_dir / self.node_id
        self.quarantine_dir = self.node_dir / "quarantine"
        self.quarantine = Quarantine(self.quarantine_dir)

        choice = choose_usrbio(self.path, usrbio)
        #: Why data I/O goes the way it goes (USRBIO or POSIX through the mount).
        self.io_path = choice.reason
        try:
            self.io = choice.engine or get_engine(engine, direct=direct)
        except ValueError as exc:
            raise InvalidRequestError(str(exc), path=path) from None
        self.files = HandleCache(self.io, direct=direct)
        #: Where big batches' I/O runs while the caller prepares or checks the next chunk.
        self._io_threads = ThreadPoolExecutor(max_workers=4,
                                              thread_name_prefix="kvstored-3fs-io")

        self._lock = threading.Lock()
        self._published = threading.Condition(self._lock)
        self._index = NodeIndex(self.node_dir, self._lock)
        self.index = self._index.objects
        self._shards: dict[int, Shard] = {}
        #: This node's shards, first to be evicted first (empty ones go before all).
        self._shard_order: EvictionOrder[int, None] = EvictionOrder(self.policy)
        self._active: Shard | None = None
        self._claims = WriteClaims(self._lock)
        self._seq = 0
        self._next_shard = 1
        self._data_bytes = 0
        self._pending_journal = 0
        self._unpublished = 0
        self._node_lock: StoreLock | None = None
        self._stuck: JournalStuckError | None = None
        #: What this open already did about damage (repair mode), for check() to report.
        self.open_problems: list[Problem] = []
        found: Recovered | None = None
        try:
            self._claim()
            found = recover(self.node_dir, self.quarantine, mode=self.mode,
                            node_id=self.node_id, root=self.root, lock=self._lock)
            self.journal: JournalWriter = found.journal
            self._index = found.index
            self.index = found.index.objects
            self._shards = found.shards
            for number in sorted(found.shards):
                self._shard_order.add(number, None)
            self._data_bytes = found.data_bytes
            self._seq = found.seq
            self._next_shard = found.next_shard
            self.open_problems.extend(found.reports)
            #: What recovery could not reconcile, for check() to report and repair.
            self._findings = found.findings
            self._journal_damage = found.damage
            if not self.read_only:
                self._maybe_compact_locked()
        except BaseException as exc:
            self._io_threads.shutdown()
            if found is not None:
                found.journal.close()
            self._release_node_lock()
            if isinstance(exc, OSError) and not isinstance(exc, BackendError):
                raise from_oserror(exc, path=self.node_dir,
                                   action="opening the backend") from exc
            raise
        self.view = (ClusterView(self.cluster_dir, self.node_id, self.io, self.files,
                                 self._io_threads) if shared_reads else None)
        log.info("3fs: node %s of cluster %s at %s; %s", self.node_id, self.cluster,
                 self.root, self.io_path)

    # -- open ---------------------------------------------------------------------------

    def _claim(self) -> None:
        stamp = read_stamp(self.root)
        if stamp is not None and stamp.backend != self.name:
            raise InvalidRequestError(
                f"{self.root} belongs to the {stamp.backend!r} backend; open it with "
                f"--backend {stamp.backend}", path=self.root)
        if self.read_only:
            claim_directory(self.cluster_dir, self.name, LAYOUT_VERSION, mode=self.mode,
                            lock=False, markers=_cluster_markers(self.cluster_dir))
            if not self.node_dir.is_dir():
                raise MissingStoreError(
                    f"cluster {self.cluster!r} has no node {self.node_id!r} (looked for "
                    f"{self.node_dir / JOURNAL_NAME})", path=self.node_dir)
        else:
            make_private_dirs(self.root)
            _claim_shared(self.cluster_dir, self.name, LAYOUT_VERSION, self.mode,
                          self.open_problems)
            if make_private_dirs(self.node_dir):
                fsync_dir(self.cluster_dir)
        try:
            self._node_lock = StoreLock.acquire(
                self.node_dir / LOCK_NAME, shared=self.read_only,
                what=f"3fs node {self.node_id!r} of cluster {self.cluster!r}")
        except BackendIOError as exc:
            if exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                raise
            log.warning("3fs: %s does not support file locks (%s); nothing stops two "
                        "processes from opening node %s: keep node ids unique",
                        self.node_dir, os.strerror(exc.errno), self.node_id)

    def _release_node_lock(self) -> None:
        if self._node_lock is not None:
            self._node_lock.release()
            self._node_lock = None

    def _close(self) -> None:
        with self._lock:
            while self._unpublished:
                self._published.wait()
            self._active = None
            for shard in self._shards.values():
                self._trim_locked(shard)
        self._io_threads.shutdown()
        self.files.close_all()
        self.journal.close()
        self._release_node_lock()

    # -- batching -----------------------------------------------------------------------

    def write_batch_hint(self) -> WriteBatchHint:
        # Each batch costs two fsyncs (shard, journal), in series by design; on a shared
        # file system they are network round trips. Big batches amortise them; staging
        # memory stays bounded (writer.py), and the age bound keeps trickles moving.
        return WriteBatchHint(max_bytes=min(256 << 20, self.shard_bytes), max_keys=2048,
                              max_age=0.5)

    # -- writes -------------------------------------------------------------------------

    def batch_write(self, items: Sequence[tuple[str, Buffer]]) -> list[WriteResult]:
        self._check_writable()
        encoded = self._check_value_sizes(items)
        results: list[WriteResult | None] = [None] * len(items)

        def write(positions: list[int]) -> None:
            self._write([(i, items[i][0], encoded[i], memoryview(items[i][1]).cast("B"))
                         for i in positions], results)

        for i in self._claims.write_batch([key for key, _ in items],
                                          stored=self.index.__contains__,
                                          write=write):
            results[i] = WriteResult(items[i][0], WriteOutcome.EXISTS)
        return results  # type: ignore[return-value]

    def _write(self, work: list, results: list) -> None:
        placed = []  # (i, key, key_bytes, view, shard, offset, seq, put entry size)
        with self._lock:
            if self._stuck is not None:
                error = BackendIOError(str(self._stuck), errno=self._stuck.errno or errno.EIO,
                                       path=self.journal.path)
                for i, key, *_ in work:
                    results[i] = WriteResult(key, WriteOutcome.FAILED, error)
                return
            for i, key, key_bytes, view in work:
                size = record_size(view.nbytes)
                meta = entry_size(key)
                problem = self._make_room_locked(key, size, meta)
                if problem is not None:
                    results[i] = WriteResult(key, WriteOutcome.FAILED, problem)
                    continue
                try:
                    shard = self._place_locked(size)
                except (OSError, BackendError) as exc:
                    error = exc if isinstance(exc, BackendError) else from_oserror(
                        exc, key=key, action="starting a new shard")
                    results[i] = WriteResult(key, WriteOutcome.FAILED, error)
                    continue
                self._seq += 1
                self._pending_journal += meta
                placed.append((i, key, key_bytes, view, shard, shard.end - size, self._seq,
                               meta))
            if not placed:
                return
            self._unpublished += 1
        entries: list[Entry] = []
        try:
            entries = self._store_records(placed, results)
        finally:
            with self._lock:
                for *_, shard, _offset, _seq, meta in placed:
                    shard.inflight -= 1
                    self._pending_journal -= meta
                    self._trim_locked(shard)
                for entry in entries:
                    self._index.apply(entry)
                self._unpublished -= 1
                self._published.notify_all()
        for i, key, *_ in placed:
            if results[i] is None:
                results[i] = WriteResult(key, WriteOutcome.WRITTEN)

    def _store_records(self, placed: list, results: list) -> list[Entry]:
        """Write, fsync and journal the placed records; return the journaled entries.
        Items that fail get their result here; the rest are left for the caller."""
        files: dict[int, IoFile] = {}
        try:
            for *_, shard, _offset, _seq, _meta in placed:
                if shard.number not in files:
                    files[shard.number] = self.files.acquire(shard.path, os.O_RDWR)
        except OSError as exc:
            for file in files.values():
                self.files.release(file)
            error = from_oserror(exc, action="opening the shard")
            for i, key, *_ in placed:
                results[i] = WriteResult(key, WriteOutcome.FAILED, error)
            return []
        records = [Placed(key_bytes, view, files[shard.number], offset, seq)
                   for _i, _key, key_bytes, view, shard, offset, seq, _meta in placed]
        try:
            errors = sync_written(self.io, [r.file for r in records],
                                          write_records(self.io, records, self._io_threads),
                                          datasync=False)
        finally:
            for file in files.values():
                self.files.release(file)
        good = []
        for (i, key, _kb, _view, shard, *_), record, error in zip(placed, records, errors):
            if error is not None:
                results[i] = WriteResult(key, WriteOutcome.FAILED, from_oserror(
                    error, key=key, action="writing the record"))
                continue
            good.append(Entry(Kind.PUT, key, shard.number, record.seq, record.offset,
                              record.value.nbytes, record.write_ns, record.checksum))
        if not good:
            return []
        try:
            self._journal_append(good)
        except OSError as exc:
            error = from_oserror(exc, path=self.journal.path, action="journaling the batch")
            for i, key, *_ in placed:
                if results[i] is None:
                    results[i] = WriteResult(key, WriteOutcome.FAILED, error)
            return []
        return good

    def _journal_append(self, entries: list[Entry]) -> None:
        try:
            self.journal.append(entries)
        except JournalStuckError as exc:
            self._stuck = exc
            raise

    def _place_locked(self, size: int) -> Shard:
        shard = self._active
        if shard is None or (shard.end and shard.end + size > self.shard_bytes):
            shard = self._rotate_locked()
        shard.end += size
        shard.inflight += 1
        self._data_bytes += size
        return shard

    def _rotate_locked(self) -> Shard:
        """Seal the active shard and start the next: journal it first, then create it."""
        number = self._next_shard
        self._seq += 1
        entry = Entry(Kind.SHARD_OPEN, shard=number, seq=self._seq)
        self._journal_append([entry])
        self._next_shard += 1
        self._index.apply(entry)
        path = str(shard_path(self.node_dir, number))
        file = self.files.acquire(path, os.O_RDWR | os.O_CREAT | os.O_EXCL)
        try:
            # Writes inside the file's size, not past its end: on ext4 an O_DIRECT write
            # that extends a file is done synchronously, one at a time, which would cap
            # an appending shard at a fraction of the disk. The sparse tail costs no
            # space and is cut off when the shard is sealed (or, after a crash, at open).
            os.ftruncate(file.fd, self.shard_bytes)
        finally:
            self.files.release(file)
        fsync_dir(self.node_dir)
        previous = self._active
        shard = self._shards[number] = Shard(number, path, 0, sized_ahead=True)
        self._shard_order.add(number, None)
        self._active = shard
        if previous is not None:
            self._trim_locked(previous)
        return shard

    def _trim_locked(self, shard: Shard) -> None:
        """Cut a sealed shard's sparse tail once no write is in flight in it."""
        if not shard.sized_ahead or shard.inflight or shard is self._active:
            return
        try:
            os.truncate(shard.path, shard.end)
            shard.sized_ahead = False
        except OSError as exc:  # harmless: the tail is a hole; open cuts it later
            log.warning("3fs: could not cut the sparse tail of %s: %s", shard.path, exc)

    # -- capacity -----------------------------------------------------------------------

    def _committed_locked(self) -> int:
        """Bytes on disk now, plus those already promised: journal entries in flight, a
        future delete entry per object and a future drop entry per shard."""
        return (self._data_bytes + self.journal.size + self._pending_journal
                + self._index.key_meta + ENTRY_SIZE * len(self._shards))

    def _make_room_locked(self, key: str, size: int, meta: int) -> CapacityError | None:
        if self.capacity is None:
            return None
        need = size + 2 * meta  # the record, its put entry, its future delete entry
        active = self._active
        if active is None or (active.end and active.end + size > self.shard_bytes):
            need += 2 * ENTRY_SIZE  # a new shard's open entry and future drop entry
        if need > self.capacity:
            return CapacityError(f"the object needs {need} bytes, more than the whole "
                                 f"capacity of {self.capacity}", key=key, path=self.node_dir)
        shortfall = self._committed_locked() + need - self.capacity
        if shortfall > 0 and self.auto_evict:
            try:
                self._evict_locked(shortfall, self.on_evict)
                shortfall = self._committed_locked() + need - self.capacity
                if 0 < shortfall <= self._dead_journal_bytes_locked():
                    self._compact_locked()
                    shortfall = self._committed_locked() + need - self.capacity
            except (OSError, BackendError) as exc:
                log.warning("3fs: making room failed: %s", exc)
        if shortfall > 0:
            return CapacityError(
                f"no room: {self._committed_locked()} of {self.capacity} bytes in use or "
                "promised, and nothing evictable; delete objects or raise the capacity",
                key=key, path=self.node_dir)
        return None

    def _dead_journal_bytes_locked(self) -> int:
        live = HEADER_SIZE + self._index.key_meta + ENTRY_SIZE * len(self._index.shards)
        return max(0, self.journal.size - live)

    def _compact_locked(self) -> None:
        """Rewrite the journal with only what is live (waits for unpublished appends,
        whose entries are not in the index yet and must not be lost)."""
        while self._unpublished:
            self._published.wait()
        header = Header(self.journal.header.generation + 1, self._seq, self._next_shard - 1)
        self.journal.rewrite(header, self._index.live_entries())
        self._index.dead_entries = 0

    def _maybe_compact_locked(self) -> None:
        dead = self._dead_journal_bytes_locked()
        if dead > max(COMPACT_MIN_DEAD_BYTES, self.journal.size - dead):
            self._compact_locked()

    # -- reads --------------------------------------------------------------------------

    def batch_read(self, keys: Sequence[str], buffers: Sequence[memoryview]) -> list[int]:
        """Read this node's objects, and with ``shared_reads`` other nodes' objects too
        (a miss refreshes the view of the other nodes first; see view.py)."""
        self._check_open()
        self._check_read_buffers(keys, buffers)
        asked_at = time.monotonic()
        views = []
        for buffer in buffers:
            view = memoryview(buffer)
            views.append(view if view.format == "B" and view.ndim == 1 else view.cast("B"))
        results = [int(ReadStatus.MISSING)] * len(keys)
        own = self._read_own(keys, views)
        for i, outcome in own.items():
            results[i] = outcome.status
            if outcome.status in (ReadStatus.CORRUPT, ReadStatus.IO_ERROR):
                self._note_failed_read(keys[i], _shard_file(self.node_dir, self.index.get(
                    keys[i])), outcome)
        if self.view is not None and len(own) < len(keys):
            others = [i for i in range(len(keys)) if i not in own]
            got = self.view.read([keys[i] for i in others], [views[i] for i in others],
                                 asked_at)
            for i, status in zip(others, got):
                results[i] = status
        return results

    def _read_own(self, keys: Sequence[str], views: Sequence[memoryview]
                  ) -> dict[int, ReadOutcome]:
        """Read the keys this node holds into ``views`` (one engine submission), verified:
        the outcome of each, by its position. Keys are pinned, and their shards marked as
        being read, for the duration."""
        outcomes: dict[int, ReadOutcome] = {}
        wanted, pinned, shards = [], [], []
        with self._lock:
            for i, key in enumerate(keys):
                slot = self.index.get(key)
                if slot is None:
                    continue
                if len(views[i]) < slot.size:
                    outcomes[i] = ReadOutcome(ReadStatus.BUFFER_TOO_SMALL)
                    continue
                shard = self._shards[slot.shard]
                shard.readers += 1
                self._shard_order.touch(shard.number)
                shards.append(shard)
                pinned.append(key)
                wanted.append((i, key, slot, shard))
            self._pins.acquire(pinned)
        requests, where, held = [], [], []
        try:
            for i, key, slot, shard in wanted:
                try:
                    file = self.files.acquire(shard.path)
                except OSError as exc:
                    outcomes[i] = ReadOutcome(ReadStatus.IO_ERROR,
                                              f"cannot open {shard.path}: {exc}")
                    continue
                held.append(file)
                requests.append(ReadRequest(key, slot, file, views[i]))
                where.append(i)
            for i, outcome in zip(where, read_records(self.io, requests, self._io_threads)):
                outcomes[i] = outcome
        finally:
            for file in held:
                self.files.release(file)
            with self._lock:
                for shard in shards:
                    shard.readers -= 1
            self._pins.release(pinned)
        return outcomes

    def usage(self) -> Usage:
        """This node's objects and files (other nodes' are theirs to count)."""
        self._check_open()
        with self._lock:
            return Usage(self.index.logical_bytes, self._data_bytes + self.journal.size,
                         len(self.index), self.capacity)

    # -- the rest of the cluster --------------------------------------------------------

    def find(self, key: str) -> SharedObject | None:
        """Where ``key`` is stored in the cluster: this node first, else the node with
        the newest copy (refreshing the view of other nodes on a miss)."""
        self._check_open()
        record = self.stat(key)
        if record is not None:
            return SharedObject(self.node_id, record)
        if self.view is None:
            return None
        found = self.view.find_fresh(key, time.monotonic())
        if found is None:
            return None
        return SharedObject(found.node_id, _record(key, found.slot, Path(found.path).parent))

    def read(self, key: str) -> bytes | None:
        """The value of ``key`` from any node (this one first), or None; raises
        CorruptionError or BackendIOError as :meth:`StorageBackend.read` does."""
        for _attempt in range(3):
            found = self.find(key)
            if found is None:
                return None
            buf = bytearray(found.record.size)
            got = self.batch_read([key], [memoryview(buf)])[0]
            if got >= 0:
                return bytes(buf[:got])
            if got == ReadStatus.CORRUPT:
                raise CorruptionError("the stored value failed its checksum", key=key,
                                      path=found.record.location.path)
            if got == ReadStatus.IO_ERROR:
                raise BackendIOError("reading failed", errno=errno.EIO, key=key,
                                     path=found.record.location.path)
            # MISSING or BUFFER_TOO_SMALL: it changed between find and read; look again.
        return None

    def nodes(self) -> list[str]:
        """Every node of the cluster with a journal, this one included."""
        self._check_open()
        if self.view is None:
            return [self.node_id]
        self.view.refresh()
        return sorted({self.node_id, *self.view.nodes()})

    def refresh(self) -> None:
        """Re-read the other nodes' journals now (reads do this by themselves on a miss)."""
        self._check_open()
        if self.view is not None:
            self.view.refresh()

    def scan_cluster(self) -> Iterator[SharedObject]:
        """Every object of every node, this node's first, after a refresh."""
        for record in self.scan():
            yield SharedObject(self.node_id, record)
        if self.view is None:
            return
        self.view.refresh()
        for found in self.view.objects():
            yield SharedObject(found.node_id, _record(found.key, found.slot,
                                                      Path(found.path).parent))

    # -- deletes and eviction -----------------------------------------------------------

    def batch_delete(self, keys: Sequence[str]) -> list[bool]:
        self._check_writable()
        for key in keys:
            encode_key(key)
        answers = []
        entries = []
        seen = set()
        with self._lock:
            for key in keys:
                hit = key in self.index and key not in seen
                seen.add(key)
                answers.append(hit)
                if hit:
                    self._seq += 1
                    entries.append(Entry(Kind.DELETE, key, seq=self._seq))
            if not entries:
                return answers
            try:
                self._journal_append(entries)
            except OSError as exc:
                raise from_oserror(exc, path=self.journal.path,
                                   action="journaling the deletes") from exc
            touched = {slot.shard for slot in map(self.index.get, (e.key for e in entries))
                       if slot is not None}
            for entry in entries:
                self._index.apply(entry)
            emptied = [self._shards[n] for n in sorted(touched)
                       if n in self._shards and not self._index.shards.get(n)]
            try:  # housekeeping: the deletes themselves are durable already
                self._drop_locked([s for s in emptied if self._droppable(s, empty_only=True)],
                                  None)
                self._maybe_compact_locked()
            except OSError as exc:
                log.warning("3fs: tidying up after deletes failed (retried later): %s", exc)
        return answers

    def evict(self, nbytes: int, on_evict: EvictionCallback | None = None) -> list[str]:
        self._check_writable()
        with self._lock:
            try:
                victims = self._evict_locked(nbytes, on_evict)
                self._maybe_compact_locked()
            except OSError as exc:
                raise from_oserror(exc, path=self.journal.path, action="evicting") from exc
            return victims

    def _droppable(self, shard: Shard, *, empty_only: bool = False) -> bool:
        if shard.inflight or shard.readers:
            return False
        keys = self._index.shards.get(shard.number, set())
        if empty_only:
            return not keys and shard is not self._active
        return not any(self._pins.is_pinned(k) for k in keys)

    def _evict_locked(self, nbytes: int, on_evict: EvictionCallback | None) -> list[str]:
        # Shards left empty first (they cost nothing to drop), then in policy order.
        order = sorted(self._shard_order, key=lambda n: bool(self._index.shards.get(n)))
        chosen, freed = [], 0
        for shard in (self._shards[number] for number in order):
            if freed >= nbytes:
                break
            if not self._droppable(shard):
                continue
            chosen.append(shard)
            freed += shard.end + sum(entry_size(k) for k in
                                     self._index.shards.get(shard.number, ()))
        return self._drop_locked(chosen, on_evict)

    def _drop_locked(self, shards: list[Shard], on_evict: EvictionCallback | None) -> list[str]:
        """Drop whole shards: journal it, tell ``on_evict``, then delete the files."""
        if not shards:
            return []
        entries = []
        for shard in shards:
            self._seq += 1
            entries.append(Entry(Kind.SHARD_DROP, shard=shard.number, seq=self._seq))
        self._journal_append(entries)
        victims = []
        for shard, entry in zip(shards, entries):
            victims.extend(self._index.apply(entry))
            if shard is self._active:
                self._active = None
            del self._shards[shard.number]
            self._shard_order.discard(shard.number)
            self._data_bytes -= shard.end
        if victims and on_evict is not None:
            on_evict(list(victims))  # before the files go: their bytes are still there
        for shard in shards:
            self.files.forget(shard.path)
            try:
                os.unlink(shard.path)
            except FileNotFoundError:
                pass
        return victims

    # -- check and repair -------------------------------------------------------------

    def check(self, repair: bool = False) -> CheckReport:
        self._check_checkable(repair)
        return check_node(self, repair)

    # What check.py needs of the node (its CheckedNode), and nothing else: these are not
    # part of the SDK contract.

    def findings(self) -> tuple[list[Finding], list[tuple[int, int]]]:
        with self._lock:
            return list(self._findings), list(self._journal_damage)

    def resolved(self, findings: Sequence[Finding]) -> None:
        with self._lock:
            self._findings = [f for f in self._findings if f not in findings]

    def indexed(self) -> list[tuple[str, Slot]]:
        return self.index.snapshot()

    def read_back(self, records: Sequence[tuple[str, Slot]]) -> list[ReadOutcome | None]:
        outcomes = self._read_own([key for key, _ in records],
                                  [memoryview(bytearray(slot.size)) for _, slot in records])
        return [outcomes.get(n) for n in range(len(records))]

    def set_aside(self, key: str, entry: Slot, reason: str) -> str | None:
        where = self.quarantine.copy_range(
            _shard_file(self.node_dir, entry), entry.offset, record_size(entry.size),
            reason=reason, key=key, seq=entry.seq, value_length=entry.size,
            value_crc32c=entry.checksum)
        self.forget(key, entry)
        return where

    def record_path(self, entry: Slot) -> str:
        return _shard_file(self.node_dir, entry)

    def rewrite_journal(self) -> None:
        with self._lock:
            self._compact_locked()
            self._journal_damage = []

    def forget(self, key: str, slot: Slot | None = None) -> bool:
        with self._lock:
            if slot is not None and self.index.get(key) is not slot:
                return False
            self._seq += 1
            entry = Entry(Kind.DELETE, key, seq=self._seq)
            self._journal_append([entry])
            self._index.apply(entry)
            return True

    def drop_shard(self, number: int) -> None:
        with self._lock:
            self._seq += 1
            self._journal_append([Entry(Kind.SHARD_DROP, shard=number, seq=self._seq)])

    def adopt_shard(self, number: int, path: str, records: Sequence[tuple[str, Slot]]) -> int:
        with self._lock:
            fresh = [(key, slot) for key, slot in records if key not in self.index]
            if not fresh:
                return 0
            self._seq += 1
            entries = [Entry(Kind.SHARD_OPEN, shard=number, seq=self._seq)]
            for key, slot in fresh:
                entries.append(Entry(Kind.PUT, key, number, slot.seq, slot.offset,
                                     slot.size, slot.write_ns, slot.checksum))
            self._journal_append(entries)
            for entry in entries:
                self._index.apply(entry)
            size = os.stat(path).st_size
            self._shards[number] = Shard(number, path, align_up(size))
            self._shard_order.add(number, None)
            self._next_shard = max(self._next_shard, number + 1)
            return len(fresh)

    def discard_shard_file(self, path: str, why: str) -> str:
        with self._lock:
            size = os.stat(path).st_size
            target = self.quarantine.move_aside(path, why)
            self._data_bytes -= align_up(size)
            return target


def _record(key: str, slot: Slot, node_dir: Path) -> ObjectRecord:
    """The record of an object of the node whose directory is ``node_dir``."""
    return ObjectRecord(key, slot.size, slot.checksum, slot_location(node_dir, slot),
                        slot.write_ns / 1e9, slot.seq)


def _shard_file(node_dir: Path, slot: Slot | None) -> str:
    """The shard file of ``slot`` (for messages, which must not fail on a gone slot)."""
    return str(shard_path(node_dir, slot.shard)) if slot is not None else str(node_dir)


def _cluster_markers(cluster_dir: Path) -> tuple[str, ...]:
    """The node directories of ``cluster_dir`` that hold a journal: what shows that a
    cluster directory whose stamp is lost belongs to 3fs."""
    try:
        return tuple(sorted(child.name for child in cluster_dir.iterdir()
                            if (child / JOURNAL_NAME).is_file()))
    except OSError:
        return ()


def _claim_shared(cluster_dir: Path, backend: str, layout: int, mode: OpenMode,
                  report: list) -> None:
    """:func:`claim_directory` for a directory that several nodes may create at once
    (so without a lock: each node locks its own directory).

    Two nodes starting together can find each other's half-made stamp (its temporary
    file makes the directory "not empty") or lose the rename of the shared temporary
    name. Both resolve within moments, so retry for a while before reporting them; a
    stamp that names another backend or layout is reported at once.
    """
    deadline = time.monotonic() + 5
    while True:
        try:
            claim_directory(cluster_dir, backend, layout, mode=mode, lock=False, report=report,
                            markers=_cluster_markers(cluster_dir))
            return
        except FileNotFoundError:
            pass  # the other node renamed the shared temporary file first
        except InvalidRequestError:
            if (cluster_dir / STAMP_NAME).exists():
                claim_directory(cluster_dir, backend, layout, mode=mode, lock=False,
                                report=report)
                return  # the real verdict
            if time.monotonic() > deadline:
                raise
        time.sleep(0.02)  # polled with a deadline: the other node is mid-rename

