"""``file-per-key``: one file per object. The SDK's worked example: copy it to start a
backend of your own.

It is short because the SDK does the hard parts, and each is used here as a new backend
would use it:

- :class:`~kvstored.sdk.index.IndexedBackend` answers ``stat``, ``locate``,
  ``batch_contains`` and ``scan`` from the in-memory :class:`~kvstored.sdk.ObjectIndex`;
- :class:`~kvstored.sdk.claims.WriteClaims` keeps two writers of one key apart;
- :class:`~kvstored.sdk.EvictionOrder` knows which object a ``fifo`` or ``lru`` store
  evicts first;
- :func:`~kvstored.sdk.files.write_new_file` makes each object file durable, and
  :func:`~kvstored.sdk.record.verified_read` checks every read against the index;
- the record pass of ``check`` is :func:`kvstored.sdk.check.check_records`.

What is left is this backend's own: where a key's file goes (:mod:`.layout`), what an
open finds (:mod:`.recovery`), what ``check`` looks at beyond the indexed records
(:mod:`.check`), and room accounting.

Durability: a write goes to ``tmp/``, is fsync'd and renamed into place, and the shard
directory is fsync'd before the object is indexed (visible). A delete unlinks and fsyncs
the directory before it returns, so a deleted key cannot come back. Directories are
0700, files 0600. Opened read-only, the backend writes nothing: leftovers in ``tmp/``
stay (``check`` reports them) and no folder is created.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import cast

from kvstored.backends.builtin import BuiltinBackend
from kvstored.backends.file_per_key.check import check_store
from kvstored.backends.file_per_key.layout import (
    LAYOUT_VERSION,
    OBJECTS_DIR,
    QUARANTINE_DIR,
    TMP_DIR,
    object_name,
)
from kvstored.backends.file_per_key.recovery import Entry, recover
from kvstored.backends.stamp import claim_directory
from kvstored.sdk.backend import EvictionCallback
from kvstored.sdk.claims import WriteClaims
from kvstored.sdk.errors import BackendError, CapacityError, from_oserror
from kvstored.sdk.eviction import EvictionOrder, EvictionPolicy
from kvstored.sdk.files import fsync_dir, make_private_dirs, write_new_file
from kvstored.sdk.index import ObjectIndex
from kvstored.sdk.quarantine import Quarantine
from kvstored.sdk.record import (
    VALUE_OFFSET,
    ReadOutcome,
    align_up,
    encode_header,
    value_checksum,
    verified_read,
)
from kvstored.sdk.types import (
    DEFAULT_MAX_VALUE_SIZE,
    Buffer,
    CheckReport,
    EvictionGranularity,
    Location,
    OpenMode,
    Problem,
    ReadStatus,
    Usage,
    WriteOutcome,
    WriteResult,
    encode_key,
)

log = logging.getLogger(__name__)


class FilePerKeyBackend(BuiltinBackend):
    """One file per object in a two-level hash-sharded tree.

    Options: ``policy`` (:class:`~kvstored.sdk.EvictionPolicy`, default ``fifo``: oldest
    write first; ``lru``: least recently read or written first); ``auto_evict`` (default
    True) lets a write that does not fit evict older objects instead of failing.
    """

    name = "file-per-key"
    sdk_version = "1.0"
    eviction_granularity = EvictionGranularity.OBJECT
    #: What this backend keeps in its directory (how a store with a lost stamp is known).
    layout_markers = (OBJECTS_DIR, TMP_DIR)

    def __init__(self, path: str | os.PathLike, *, capacity: int | None = None,
                 max_value_size: int = DEFAULT_MAX_VALUE_SIZE,
                 on_evict: EvictionCallback | None = None,
                 mode: OpenMode = OpenMode.READ_WRITE,
                 policy: EvictionPolicy = EvictionPolicy.FIFO, auto_evict: bool = True) -> None:
        super().__init__(path, capacity=capacity, max_value_size=max_value_size,
                         on_evict=on_evict, mode=mode)
        self.policy = EvictionPolicy.parse(policy)
        self.auto_evict = auto_evict
        self.root = Path(self.path)
        self.objects_dir = self.root / OBJECTS_DIR
        self.tmp_dir = self.root / TMP_DIR
        self.quarantine = Quarantine(self.root / QUARANTINE_DIR)

        # One lock guards the index, the eviction order, the claims and the counters.
        self._lock = threading.Lock()
        self.index: ObjectIndex[Entry] = ObjectIndex(_location, self._lock)
        self._order: EvictionOrder[str, None] = EvictionOrder(self.policy)
        self._claims = WriteClaims(self._lock)
        self._physical = 0  # bytes the indexed files occupy on disk
        self._reserved = 0  # room promised to writes in flight
        self._seq = 0

        #: What this open repaired (a rebuilt stamp), for the next check() to report.
        self.open_problems: list[Problem] = []
        dir_lock = claim_directory(self.root, self.name, LAYOUT_VERSION, mode=self.mode,
                                   markers=self.layout_markers, report=self.open_problems)
        assert dir_lock is not None  # with lock=True (the default) there always is one
        self._dir_lock = dir_lock
        try:
            if not self.read_only:
                for folder in (self.objects_dir, self.tmp_dir):
                    make_private_dirs(folder)
            for key, entry in recover(self.objects_dir, self.tmp_dir,
                                      read_only=self.read_only):
                self._index_locked(key, entry)
        except BaseException as exc:
            self._dir_lock.release()
            if isinstance(exc, OSError) and not isinstance(exc, BackendError):
                raise from_oserror(exc, path=self.root, action="opening the backend") from exc
            raise

    def _close(self) -> None:
        with self._lock:
            self.index.clear()
            self._order.clear()
        self._dir_lock.release()

    def usage(self) -> Usage:
        self._check_open()
        with self._lock:
            return Usage(self.index.logical_bytes, self._physical, len(self.index),
                         self.capacity)

    # -- writes ------------------------------------------------------------------------

    def batch_write(self, items: Sequence[tuple[str, Buffer]]) -> list[WriteResult]:
        self._check_writable()
        encoded = self._check_value_sizes(items)
        results: list[WriteResult | None] = [None] * len(items)

        def write(positions: list[int]) -> None:
            # Stage every file in tmp/ (written and fsync'd), rename them all into
            # place, fsync their folders once, and only then index (acknowledge) them: a
            # crash leaves either staged files, which the next open removes, or records
            # that were completely written.
            staged: list[tuple[int, str, Entry, int]] = []
            for i in positions:
                key, value = items[i]
                room = align_up(VALUE_OFFSET + memoryview(value).nbytes)
                with self._lock:
                    no_room = self._reserve_locked(key, room)
                if no_room is not None:
                    results[i] = WriteResult(key, WriteOutcome.FAILED, no_room)
                    continue
                try:
                    staged.append((i, *self._stage(key, encoded[i], value), room))
                except BackendError as exc:
                    self._release(room)
                    results[i] = WriteResult(key, WriteOutcome.FAILED, exc)
            placed: list[tuple[int, Entry, int]] = []
            for i, tmp, entry, room in staged:
                try:
                    make_private_dirs(os.path.dirname(entry.path))
                    os.rename(tmp, entry.path)
                    placed.append((i, entry, room))
                except OSError as exc:
                    _remove(tmp)
                    self._release(room)
                    results[i] = WriteResult(items[i][0], WriteOutcome.FAILED, from_oserror(
                        exc, key=items[i][0], path=entry.path, action="placing the object"))
            try:
                self._sync_folders({os.path.dirname(entry.path) for _, entry, _ in placed})
            except OSError as exc:
                failure = from_oserror(exc, action="syncing the object directory")
                for i, entry, room in placed:
                    _remove(entry.path)  # never acknowledged: it must not come back
                    self._release(room)
                    results[i] = WriteResult(items[i][0], WriteOutcome.FAILED, failure)
                return
            with self._lock:
                for i, entry, room in placed:
                    self._reserved -= room
                    self._index_locked(items[i][0], entry)
                    results[i] = WriteResult(items[i][0], WriteOutcome.WRITTEN)

        for i in self._claims.write_batch([key for key, _ in items],
                                          stored=self.index.__contains__, write=write):
            results[i] = WriteResult(items[i][0], WriteOutcome.EXISTS)
        return cast("list[WriteResult]", results)  # every position is filled by now

    def _stage(self, key: str, key_bytes: bytes, value: Buffer) -> tuple[str, Entry]:
        """Write one record to a new file in tmp/, durably; returns that file and the
        entry for the record's final name."""
        view = memoryview(value).cast("B")
        checksum = value_checksum(view)
        with self._lock:
            self._seq += 1
            seq = self._seq
        write_ns = time.time_ns()
        header = encode_header(key_bytes, view.nbytes, seq, checksum, write_ns=write_ns)
        shard, sub, name = object_name(key_bytes)
        tmp = str(self.tmp_dir / f"{uuid.uuid4().hex}.tmp")
        try:
            physical = self._write_file(tmp, header, view)
        except OSError as exc:
            raise from_oserror(exc, key=key, path=tmp, action="writing the object") from exc
        return tmp, Entry(str(self.objects_dir / shard / sub / name), view.nbytes, checksum,
                          seq, write_ns, physical)

    def _write_file(self, tmp: str, header: Buffer, value: memoryview) -> int:
        """Create ``tmp`` holding the record (``header``, then ``value``), fsync'd, and
        removed again if that fails; returns the bytes it occupies on disk. A method of
        its own so that a subclass can change how the bytes reach the disk and nothing
        else (the SDK's tests break it on purpose, to see that the kit notices)."""
        return write_new_file(tmp, [header, value]).st_blocks * 512

    def _reserve_locked(self, key: str, need: int) -> CapacityError | None:
        """Promise ``need`` bytes to a write, evicting first if allowed; or say why not."""
        if self.capacity is not None and need > self.capacity:
            return CapacityError(f"the object needs {need} bytes, more than the whole "
                                 f"capacity of {self.capacity}", key=key, path=self.root)
        shortfall = self._shortfall_locked(need)
        if shortfall > 0 and self.auto_evict:
            self._evict_locked(shortfall, self.on_evict)
            shortfall = self._shortfall_locked(need)
        if shortfall > 0:
            return CapacityError(
                f"no room: {self._physical + self._reserved} of {self.capacity} bytes in use "
                "and nothing evictable; delete objects or raise the capacity",
                key=key, path=self.root)
        self._reserved += need
        return None

    def _shortfall_locked(self, need: int) -> int:
        if self.capacity is None:
            return 0
        return self._physical + self._reserved + need - self.capacity

    def _release(self, room: int) -> None:
        with self._lock:
            self._reserved -= room

    # -- reads -------------------------------------------------------------------------

    def batch_read(self, keys: Sequence[str], buffers: Sequence[memoryview]) -> list[int]:
        self._check_open()
        self._check_read_buffers(keys, buffers)
        results: list[int] = []
        for key, buf in zip(keys, buffers):
            with self._lock:
                entry = self.index.get(key)
                if entry is None or len(buf) < entry.size:
                    results.append(ReadStatus.MISSING if entry is None
                                   else ReadStatus.BUFFER_TOO_SMALL)
                    continue
                self._order.touch(key)
                self._pins.acquire([key])  # eviction leaves its file alone meanwhile
            try:
                outcome = self._read_record(key, entry, memoryview(buf).cast("B"))
            finally:
                self._pins.release([key])
            if not outcome.ok and outcome.status != ReadStatus.MISSING:
                self._note_failed_read(key, entry.path, outcome)
            results.append(outcome.status)
        return results

    def _read_record(self, key: str, entry: Entry, dest: memoryview) -> ReadOutcome:
        """Read ``key``'s file: the header into scratch, the value straight into ``dest``;
        then the SDK's one verification against ``entry``."""
        head = bytearray(VALUE_OFFSET)
        got, error = 0, None
        try:
            fd = os.open(entry.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return ReadOutcome(ReadStatus.MISSING, "its file is missing")
        except OSError as exc:
            return verified_read(dest, head, None, key=key, size=entry.size, seq=entry.seq,
                                 checksum=entry.checksum, error=exc)
        try:
            got = os.preadv(fd, [head, dest[:entry.size]], 0)
            while VALUE_OFFSET <= got < VALUE_OFFSET + entry.size:  # a short read
                more = os.preadv(fd, [dest[got - VALUE_OFFSET:entry.size]], got)
                if more == 0:
                    break
                got += more
        except OSError as exc:
            error = exc
        finally:
            os.close(fd)
        return verified_read(dest, head, None, key=key, size=entry.size, seq=entry.seq,
                             checksum=entry.checksum, error=error,
                             complete=got == VALUE_OFFSET + entry.size)

    # -- deletes and eviction -------------------------------------------------------------

    def batch_delete(self, keys: Sequence[str]) -> list[bool]:
        self._check_writable()
        for key in keys:
            encode_key(key)
        with self._lock:
            removed = [self._unindex_locked(key) for key in keys]
        self._unlink([entry for entry in removed if entry is not None])
        return [entry is not None for entry in removed]

    def evict(self, nbytes: int, on_evict: EvictionCallback | None = None) -> list[str]:
        self._check_writable()
        with self._lock:
            return self._evict_locked(nbytes, on_evict)

    def _evict_locked(self, nbytes: int, on_evict: EvictionCallback | None) -> list[str]:
        victims: list[str] = []
        freed = 0
        for key in self._order:  # first to be evicted first, by the policy
            if freed >= nbytes:
                break
            if not self._pins.is_pinned(key):  # being read: its file must stay
                victims.append(key)
                freed += self.index[key].physical
        entries = [self._unindex_locked(key) for key in victims]
        if victims and on_evict is not None:
            on_evict(list(victims))  # before the files go: their space is not reused yet
        self._unlink([entry for entry in entries if entry is not None])
        return victims

    def _unlink(self, entries: list[Entry]) -> None:
        """Remove the files of unindexed entries, durably."""
        folders = set()
        for entry in entries:
            try:
                os.unlink(entry.path)
            except FileNotFoundError:
                pass
            folders.add(os.path.dirname(entry.path))
        self._sync_folders(folders)

    def _sync_folders(self, folders: set[str]) -> None:
        """Make the names just created or removed in ``folders`` durable."""
        for folder in folders:
            fsync_dir(folder)

    # -- the index (the caller holds the lock) ----------------------------------------------

    def _index_locked(self, key: str, entry: Entry) -> None:
        if self.index.add(key, entry) is not None:
            raise AssertionError(f"{key!r} indexed twice")  # claims make this impossible
        self._order.add(key, None)
        self._physical += entry.physical
        self._seq = max(self._seq, entry.seq)

    def _unindex_locked(self, key: str) -> Entry | None:
        entry = self.index.pop(key)
        if entry is not None:
            self._order.discard(key)
            self._physical -= entry.physical
        return entry

    # -- check and repair -------------------------------------------------------------

    def check(self, repair: bool = False) -> CheckReport:
        self._check_checkable(repair)
        return check_store(self, repair)

    # What check.py needs of the store (its CheckedFiles), and nothing else: these are
    # not part of the SDK contract.

    def indexed(self) -> list[tuple[str, Entry]]:
        return self.index.snapshot()

    def read_back(self, records: Sequence[tuple[str, Entry]]) -> list[ReadOutcome | None]:
        outcomes: list[ReadOutcome | None] = []
        for key, entry in records:
            outcome = self._read_record(key, entry, memoryview(bytearray(entry.size)))
            # A file that went because its key was deleted or evicted meanwhile is no
            # finding.
            gone = not outcome.ok and not self.index.is_current(key, entry)
            outcomes.append(None if gone else outcome)
        return outcomes

    def set_aside(self, key: str, entry: Entry, reason: str) -> str | None:
        with self._lock:
            if self.index.get(key) is not entry:
                return None  # deleted or rewritten since it was read
            self._unindex_locked(key)
        if not os.path.lexists(entry.path):
            return None
        return self.quarantine.move_aside(entry.path, reason)

    def record_path(self, entry: Entry) -> str:
        return entry.path

    def adopt(self, key: str, entry: Entry) -> bool:
        """Index a valid record nobody indexed; False if ``key`` is indexed by now."""
        with self._lock:
            if key in self.index:
                return False
            self._index_locked(key, entry)
            return True


def _location(entry: Entry) -> Location:
    return Location(entry.path, VALUE_OFFSET, entry.size, 0, VALUE_OFFSET + entry.size)


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
