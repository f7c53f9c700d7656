"""``file-per-key``: one file per object, for debugging and as the SDK's worked example.

The directory layout and file names are in :mod:`.layout`, open-time recovery in
:mod:`.recovery`, check and repair in :mod:`.check`.

Writes go to ``tmp/``, are fsync'd, renamed into place, and the shard directory is
fsync'd before the object becomes visible. Deletes unlink and fsync the directory before
they return, so a deleted key cannot come back. Two writers of one key are kept apart by
the SDK's :class:`~kvstored.sdk.claims.WriteClaims`; directories are created 0700 and
files 0600.

Opened read-only, the backend writes nothing: leftovers in ``tmp/`` stay (and ``check``
reports them), and no folder is created. Every open mode of the SDK is supported.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

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
from kvstored.sdk.backend import EvictionCallback, StorageBackend
from kvstored.sdk.claims import WriteClaims
from kvstored.sdk.errors import (
    BackendError,
    CapacityError,
    InvalidRequestError,
    from_oserror,
)
from kvstored.sdk.eviction import EvictionPolicy
from kvstored.sdk.files import PRIVATE_FILE, fsync_dir, make_private_dirs, write_all
from kvstored.sdk.quarantine import Quarantine
from kvstored.sdk.record import (
    VALUE_OFFSET,
    align_up,
    encode_header,
    value_checksum,
    verified_read,
)
from kvstored.sdk.types import (
    DEFAULT_MAX_VALUE_SIZE,
    Buffer,
    Capabilities,
    CheckReport,
    EvictionGranularity,
    Location,
    ObjectRecord,
    OpenMode,
    Problem,
    ReadStatus,
    Usage,
    WriteOutcome,
    WriteResult,
    encode_key,
)

log = logging.getLogger(__name__)

@dataclass(slots=True)
class _Staged:
    """An object written to ``tmp/`` and fsync'd, not yet renamed into place."""

    position: int
    key: str
    key_bytes: bytes
    tmp: str
    #: The room reserved for it (released when it is indexed, or fails).
    estimate: int
    entry: Entry


class FilePerKeyBackend(StorageBackend):
    """One file per object in a two-level hash-sharded tree.

    Options: ``policy`` is ``"fifo"`` (default: oldest write first) or ``"lru"`` (least
    recently read or written first); ``auto_evict`` (default True) lets a write that
    does not fit evict older objects instead of failing.
    """

    name = "file-per-key"
    open_modes = frozenset(OpenMode)
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
        self.quarantine_dir = self.root / QUARANTINE_DIR
        self.quarantine = Quarantine(self.quarantine_dir)
        #: Reads that failed their checksum since open (exported as a metric).
        self.corrupt_reads = 0

        self._lock = threading.Lock()
        self._index: dict[str, Entry] = {}
        # Eviction order: first is evicted first. FIFO keeps write order; LRU moves a
        # key to the end on every read.
        self._order: OrderedDict[str, None] = OrderedDict()
        self._claims = WriteClaims(self._lock)
        self._physical = 0
        self._logical = 0
        self._reserved = 0
        self._seq = 0

        #: What this open repaired (a rebuilt stamp), for the next check() to report.
        self.open_problems: list[Problem] = []
        self._dir_lock = claim_directory(self.root, self.name, LAYOUT_VERSION, mode=self.mode,
                                         markers=self.layout_markers,
                                         report=self.open_problems)
        try:
            if not self.read_only:
                for folder in (self.objects_dir, self.tmp_dir):
                    make_private_dirs(folder)
            self._recover()
        except BaseException as exc:
            self._dir_lock.release()
            if isinstance(exc, OSError) and not isinstance(exc, BackendError):
                raise from_oserror(exc, path=self.root, action="opening the backend") from exc
            raise

    # -- open-time recovery ------------------------------------------------------------

    def _recover(self) -> None:
        found = recover(self.objects_dir, self.tmp_dir, read_only=self.read_only)
        for key, entry in found:
            self._index[key] = entry
            self._order[key] = None
            self._physical += entry.physical
            self._logical += entry.size
            self._seq = max(self._seq, entry.seq)

    # -- lifecycle and capabilities ----------------------------------------------------

    def _close(self) -> None:
        with self._lock:
            self._index.clear()
            self._order.clear()
        self._dir_lock.release()

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(shared=False, eviction=EvictionGranularity.OBJECT,
                            aligned_values=True, persistent=True,
                            max_value_size=self.max_value_size, read_only_open=True)

    # -- writes ------------------------------------------------------------------------

    def batch_write(self, items: Sequence[tuple[str, Buffer]]) -> list[WriteResult]:
        self._check_writable()
        encoded = self._check_value_sizes(items)
        results: list[WriteResult | None] = [None] * len(items)

        def write(positions: list[int]) -> None:
            staged: list[_Staged] = []
            for i in positions:
                key, value = items[i]
                estimate = self._footprint(memoryview(value).nbytes)
                with self._lock:
                    problem = self._reserve_locked(key, estimate)
                if problem is not None:
                    results[i] = WriteResult(key, WriteOutcome.FAILED, problem)
                    continue
                try:
                    tmp, entry = self._write_tmp(key, encoded[i], value)
                except BackendError as exc:
                    self._unreserve(estimate)
                    results[i] = WriteResult(key, WriteOutcome.FAILED, exc)
                    continue
                staged.append(_Staged(i, key, encoded[i], tmp, estimate, entry))
            self._publish(staged, results)

        for i in self._claims.write_batch([key for key, _ in items],
                                          stored=self._index.__contains__, write=write):
            results[i] = WriteResult(items[i][0], WriteOutcome.EXISTS)
        return results  # type: ignore[return-value]

    def _footprint(self, size: int) -> int:
        return align_up(VALUE_OFFSET + size)

    def _reserve_locked(self, key: str, need: int) -> CapacityError | None:
        if self.capacity is None:
            self._reserved += need
            return None
        if need > self.capacity:
            return CapacityError(f"the object needs {need} bytes, more than the whole "
                                 f"capacity of {self.capacity}", key=key, path=self.root)
        shortfall = self._physical + self._reserved + need - self.capacity
        if shortfall > 0 and self.auto_evict:
            self._evict_locked(shortfall, self.on_evict)
            shortfall = self._physical + self._reserved + need - self.capacity
        if shortfall > 0:
            return CapacityError(
                f"no room: {self._physical + self._reserved} of {self.capacity} bytes in use "
                "and nothing evictable; delete objects or raise the capacity",
                key=key, path=self.root)
        self._reserved += need
        return None

    def _unreserve(self, amount: int) -> None:
        with self._lock:
            self._reserved -= amount

    def _write_tmp(self, key: str, key_bytes: bytes, value: Buffer) -> tuple[str, Entry]:
        view = memoryview(value).cast("B")
        checksum = value_checksum(view)
        with self._lock:
            self._seq += 1
            seq = self._seq
        write_ns = time.time_ns()
        header = encode_header(key_bytes, view.nbytes, seq, checksum, write_ns=write_ns)
        tmp = str(self.tmp_dir / f"{uuid.uuid4().hex}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC,
                         PRIVATE_FILE)
        except OSError as exc:
            raise from_oserror(exc, key=key, action="creating the object file") from exc
        try:
            write_all(fd, header, 0)
            write_all(fd, view, VALUE_OFFSET)
            os.fsync(fd)
            physical = os.fstat(fd).st_blocks * 512
        except OSError as exc:
            os.close(fd)
            os.unlink(tmp)
            raise from_oserror(exc, key=key, path=tmp, action="writing the object") from exc
        os.close(fd)
        return tmp, Entry("", view.nbytes, checksum, seq, write_ns, physical)

    def _publish(self, staged: list[_Staged], results: list) -> None:
        """Rename staged files into place, fsync their directories, then index them."""
        dirs: set[str] = set()
        placed: list[_Staged] = []
        for item in staged:
            shard, sub, name = object_name(item.key_bytes)
            folder = self.objects_dir / shard / sub
            try:
                make_private_dirs(folder)
                item.entry.path = str(folder / name)
                os.rename(item.tmp, item.entry.path)
            except OSError as exc:
                self._unreserve(item.estimate)
                try:
                    os.unlink(item.tmp)
                except OSError:
                    pass
                results[item.position] = WriteResult(
                    item.key, WriteOutcome.FAILED,
                    from_oserror(exc, key=item.key, action="placing the object"))
                continue
            dirs.add(str(folder))
            placed.append(item)
        try:
            for folder in dirs:
                fsync_dir(folder)
        except OSError as exc:
            failure = from_oserror(exc, action="syncing the object directory")
            for item in placed:
                os.unlink(item.entry.path)
                self._unreserve(item.estimate)
                results[item.position] = WriteResult(item.key, WriteOutcome.FAILED, failure)
            return
        with self._lock:
            for item in placed:
                self._reserved -= item.estimate
                self._adopt_locked(item.key, item.entry)
                results[item.position] = WriteResult(item.key, WriteOutcome.WRITTEN)

    # -- reads -------------------------------------------------------------------------

    def batch_read(self, keys: Sequence[str], buffers: Sequence[memoryview]) -> list[int]:
        self._check_open()
        if len(keys) != len(buffers):
            raise InvalidRequestError(f"{len(keys)} keys but {len(buffers)} buffers")
        results: list[int] = []
        for key, buf in zip(keys, buffers):
            with self._lock:
                entry = self._index.get(key)
                if entry is None:
                    results.append(ReadStatus.MISSING)
                    continue
                if len(buf) < entry.size:
                    results.append(ReadStatus.BUFFER_TOO_SMALL)
                    continue
                if self.policy.rule.moves_on_read:
                    self._order.move_to_end(key)
                self._pins.acquire([key])
            try:
                results.append(self._read_one(key, entry, buf))
            finally:
                self._pins.release([key])
        return results

    def _read_one(self, key: str, entry: Entry, buf: memoryview) -> int:
        head = bytearray(VALUE_OFFSET)
        target = memoryview(buf).cast("B")
        got, error = 0, None
        try:
            fd = os.open(entry.path, os.O_RDONLY)
        except FileNotFoundError:
            return ReadStatus.MISSING  # deleted by another thread since the lookup
        except OSError as exc:
            fd, error = -1, exc
        if fd >= 0:
            try:
                got = os.preadv(fd, [head, target[:entry.size]], 0)
                while VALUE_OFFSET <= got < VALUE_OFFSET + entry.size:
                    more = os.preadv(fd, [target[got - VALUE_OFFSET:entry.size]], got)
                    if more == 0:
                        break
                    got += more
            except OSError as exc:
                error = exc
            finally:
                os.close(fd)
        outcome = verified_read(target, head, None, key=key, size=entry.size, seq=entry.seq,
                                checksum=entry.checksum, error=error,
                                complete=got == VALUE_OFFSET + entry.size)
        if not outcome.ok:
            self.corrupt_reads += outcome.status == ReadStatus.CORRUPT
            log.warning("%s: key %r in %s failed (%s); reported as %s (run "
                        "check(repair=True) to quarantine it)", self.name, key, entry.path,
                        outcome.reason, ReadStatus(outcome.status).name)
        return outcome.status

    def batch_contains(self, keys: Sequence[str]) -> list[bool]:
        self._check_open()
        with self._lock:
            return [key in self._index for key in keys]

    def stat(self, key: str) -> ObjectRecord | None:
        self._check_open()
        with self._lock:
            entry = self._index.get(key)
        return None if entry is None else self._record(key, entry)

    def _record(self, key: str, entry: Entry) -> ObjectRecord:
        return ObjectRecord(key, entry.size, entry.checksum, self._location(entry),
                            entry.write_ns / 1e9, entry.seq)

    def _location(self, entry: Entry) -> Location:
        return Location(entry.path, VALUE_OFFSET, entry.size, 0, VALUE_OFFSET + entry.size)

    def locate(self, key: str) -> Location | None:
        self._check_open()
        with self._lock:
            entry = self._index.get(key)
        return None if entry is None else self._location(entry)

    def scan(self, *, verify: bool = False) -> Iterator[ObjectRecord]:
        self._check_open()
        with self._lock:
            snapshot = list(self._index.items())
        for key, entry in snapshot:
            if verify:
                buf = bytearray(entry.size)
                if self.batch_read([key], [memoryview(buf)])[0] != entry.size:
                    continue
            yield self._record(key, entry)

    def usage(self) -> Usage:
        self._check_open()
        with self._lock:
            return Usage(self._logical, self._physical, len(self._index), self.capacity)

    # -- deletes and eviction -------------------------------------------------------------

    def batch_delete(self, keys: Sequence[str]) -> list[bool]:
        self._check_writable()
        for key in keys:
            encode_key(key)
        with self._lock:
            removed = [self._forget_locked(key) for key in keys]
        self._unlink([entry for entry in removed if entry is not None])
        return [entry is not None for entry in removed]

    def _forget_locked(self, key: str) -> Entry | None:
        entry = self._index.pop(key, None)
        if entry is not None:
            del self._order[key]
            self._physical -= entry.physical
            self._logical -= entry.size
        return entry

    def _unlink(self, entries: list[Entry]) -> None:
        dirs = set()
        for entry in entries:
            try:
                os.unlink(entry.path)
            except FileNotFoundError:
                pass
            dirs.add(os.path.dirname(entry.path))
        for folder in dirs:
            fsync_dir(folder)

    def evict(self, nbytes: int, on_evict: EvictionCallback | None = None) -> list[str]:
        self._check_writable()
        with self._lock:
            return self._evict_locked(nbytes, on_evict)

    def _evict_locked(self, nbytes: int, on_evict: EvictionCallback | None) -> list[str]:
        victims: list[str] = []
        freed = 0
        for key in self._order:
            if freed >= nbytes:
                break
            if self._pins.is_pinned(key):
                continue
            victims.append(key)
            freed += self._index[key].physical
        entries = [self._forget_locked(key) for key in victims]
        if victims and on_evict is not None:
            on_evict(list(victims))  # before the files go: their space is not reused yet
        self._unlink([e for e in entries if e is not None])
        return victims

    # -- check and repair -------------------------------------------------------------

    def check(self, repair: bool = False) -> CheckReport:
        if repair:
            self._check_writable()
        else:
            self._check_open()
        return check_store(self, repair)

    # What check.py needs of the store (its CheckedFiles), and nothing else: these are
    # not part of the SDK contract.

    def indexed(self) -> dict[str, Entry]:
        with self._lock:
            return dict(self._index)

    def owner_of(self, path: Path) -> str | None:
        with self._lock:
            return next((k for k, e in self._index.items() if e.path == str(path)), None)

    def forget(self, key: str) -> None:
        with self._lock:
            self._forget_locked(key)

    def adopt(self, key: str, entry: Entry) -> None:
        with self._lock:
            self._adopt_locked(key, entry)

    def _adopt_locked(self, key: str, entry: Entry) -> None:
        if key in self._index:
            return
        self._index[key] = entry
        self._order[key] = None
        self._physical += entry.physical
        self._logical += entry.size
        self._seq = max(self._seq, entry.seq)
