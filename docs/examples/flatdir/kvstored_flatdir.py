"""flatdir: the kvstored SDK tutorial's example backend (docs/sdk.md).

Every object is one file in a single flat directory, named by the SHA-256 of its key.
A file holds a 16-byte header, the key and the value::

    0   4  magic  b"FLAT"
    4   4  key length
    8   4  CRC-32C of the value
    12  4  CRC-32C of bytes 0..11 and the key
    16  k  key (UTF-8)
    16+k   value

Writes go to a temporary name, are fsync'd, renamed and the directory fsync'd, so a
crash leaves an object whole or absent. A file's modification time, set to the write's
sequence number in nanoseconds, orders the objects: it is their ``seq`` and the FIFO
eviction order, and survives a reopen. A record whose value fails its CRC at open (a
file cut short, say) is left out, and check() reports it.
The directory and its files are private (0700, 0600), and locked while open, so that a
second process cannot open it too (kvstored.sdk.files, kvstored.sdk.lock).
"""

from __future__ import annotations

import hashlib
import os
import struct
import threading
import time
import uuid
from pathlib import Path

from crc32c import crc32c

from kvstored.sdk import (
    Capabilities,
    CapacityError,
    CheckReport,
    EvictionGranularity,
    Location,
    ObjectRecord,
    Problem,
    ProblemKind,
    ReadStatus,
    StorageBackend,
    Usage,
    WriteOutcome,
    WriteResult,
)
from kvstored.sdk.errors import from_oserror
from kvstored.sdk.files import PRIVATE_FILE, make_private_dirs
from kvstored.sdk.lock import LOCK_NAME, StoreLock

HEADER = struct.Struct("<4sIII")
MAGIC = b"FLAT"


class FlatDirBackend(StorageBackend):
    name = "flatdir"
    sdk_version = "1.0"

    def __init__(self, path, *, capacity=None, max_value_size=256 * 2**20, on_evict=None):
        super().__init__(path, capacity=capacity, max_value_size=max_value_size,
                         on_evict=on_evict)
        self.root = Path(path)
        make_private_dirs(self.root / "quarantine")
        # One process per store: a second open is refused with BackendBusyError (after
        # waiting up to 5 s for a holder that is exiting).
        self._dir_lock = StoreLock.acquire(self.root / LOCK_NAME, what="flatdir store",
                                           wait=5.0)
        self._lock = threading.Lock()
        # key -> (path, size, crc, disk, seq)
        self._index: dict[str, tuple[Path, int, int, int, int]] = {}
        self._seq = 0
        for tmp in self.root.glob("*.tmp"):
            tmp.unlink()  # an unfinished write: never acknowledged
        for path in sorted(self.root.glob("*.obj"), key=lambda p: p.stat().st_mtime_ns):
            entry = self._load(path)
            if entry is not None:
                self._index[entry[0]] = entry[1]
                self._seq = max(self._seq, entry[1][4])

    # Reading a file's header back, for open and for check().
    def _load(self, path: Path):
        try:
            with open(path, "rb") as f:
                head = f.read(HEADER.size)
                magic, key_len, value_crc, head_crc = HEADER.unpack(head)
                key_bytes = f.read(key_len)
            if magic != MAGIC or crc32c(key_bytes, crc32c(head[:12])) != head_crc:
                return None
            key = key_bytes.decode()
            if path.stem != hashlib.sha256(key_bytes).hexdigest():
                return None
            with open(path, "rb") as f:  # the whole value must be there and check
                f.seek(HEADER.size + key_len)
                if crc32c(f.read()) != value_crc:
                    return None
            st = path.stat()
            return key, (path, st.st_size - HEADER.size - key_len, value_crc, st.st_blocks * 512,
                         st.st_mtime_ns)
        except (OSError, struct.error, UnicodeDecodeError):
            return None

    def _close(self):
        self._index.clear()
        self._dir_lock.release()

    @property
    def capabilities(self):
        return Capabilities(shared=False, eviction=EvictionGranularity.OBJECT,
                            aligned_values=False, persistent=True,
                            max_value_size=self.max_value_size)

    def _used(self) -> int:
        return sum(entry[3] for entry in self._index.values())

    def batch_write(self, items):
        self._check_open()
        keys = self._check_value_sizes(items)  # raises before anything is written
        results = []
        with self._lock:  # one writer at a time keeps this example simple
            for (key, value), key_bytes in zip(items, keys):
                if key in self._index:
                    results.append(WriteResult(key, WriteOutcome.EXISTS))
                    continue
                value = memoryview(value).cast("B")
                need = HEADER.size + len(key_bytes) + value.nbytes + 4096
                if self.capacity is not None and need > self.capacity:
                    # It could never fit: fail it alone, without evicting anything for it.
                    results.append(WriteResult(key, WriteOutcome.FAILED, CapacityError(
                        f"the object needs {need} bytes, more than the capacity",
                        key=key, path=self.root)))
                    continue
                if self.capacity is not None and self._used() + need > self.capacity:
                    self._evict_locked(self._used() + need - self.capacity, self.on_evict)
                    if self._used() + need > self.capacity:
                        results.append(WriteResult(key, WriteOutcome.FAILED, CapacityError(
                            "no room left; evict or raise capacity", key=key, path=self.root)))
                        continue
                results.append(self._write_one(key, key_bytes, value))
        return results

    def _write_one(self, key, key_bytes, value):
        """Write one object; an I/O error (EIO, ENOSPC) fails this item alone, as the
        error the contract names for it, and leaves no file behind."""
        final = self.root / (hashlib.sha256(key_bytes).hexdigest() + ".obj")
        tmp = self.root / f"{uuid.uuid4().hex}.tmp"
        try:
            self._write_file(key, key_bytes, value, tmp, final)
        except OSError as exc:
            for leftover in (tmp, final):  # not acknowledged: nothing of it may stay
                try:
                    os.unlink(leftover)
                except OSError:
                    pass
            return WriteResult(key, WriteOutcome.FAILED,
                               from_oserror(exc, key=key, action="writing the object"))
        return WriteResult(key, WriteOutcome.WRITTEN)

    def _write_file(self, key, key_bytes, value, tmp, final):
        head = bytearray(HEADER.pack(MAGIC, len(key_bytes), crc32c(value), 0))
        struct.pack_into("<I", head, 12, crc32c(key_bytes, crc32c(head[:12])))
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE),
                       "wb") as f:
            f.write(head)
            f.write(key_bytes)
            f.write(value)
            f.flush()
            # The modification time is the seq: later than every earlier write's.
            self._seq = max(self._seq + 1, time.time_ns())
            os.utime(f.fileno(), ns=(self._seq, self._seq))
            os.fsync(f.fileno())
            disk = os.fstat(f.fileno()).st_blocks * 512
        os.rename(tmp, final)
        self._fsync_dir()
        self._index[key] = (final, value.nbytes, crc32c(value), disk, self._seq)

    def _fsync_dir(self):
        fd = os.open(self.root, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def batch_read(self, keys, buffers):
        self._check_open()
        self._check_read_buffers(keys, buffers)
        results = []
        for key, buf in zip(keys, buffers):
            with self._lock:
                entry = self._index.get(key)
            if entry is None:
                results.append(ReadStatus.MISSING)
                continue
            path, size, value_crc, _, _ = entry
            if len(buf) < size:
                results.append(ReadStatus.BUFFER_TOO_SMALL)
                continue
            with self.pin([key]):  # eviction leaves pinned keys alone
                try:
                    with open(path, "rb") as f:
                        f.seek(HEADER.size + len(key.encode()))
                        got = f.readinto(buf[:size])
                except FileNotFoundError:
                    results.append(ReadStatus.MISSING)
                    continue
            ok = got == size and crc32c(buf[:size]) == value_crc
            if not ok:
                buf[:size] = bytes(size)  # nothing that failed its check stays in the buffer
            results.append(size if ok else ReadStatus.CORRUPT)
        return results

    def batch_delete(self, keys):
        self._check_open()
        with self._lock:
            gone = [self._index.pop(key, None) for key in keys]
            for entry in gone:
                if entry is not None:
                    entry[0].unlink(missing_ok=True)
            self._fsync_dir()
        return [entry is not None for entry in gone]

    def batch_contains(self, keys):
        self._check_open()
        return [key in self._index for key in keys]

    def stat(self, key):
        self._check_open()
        entry = self._index.get(key)
        if entry is None:
            return None
        _, size, value_crc, _, seq = entry
        return ObjectRecord(key, size, value_crc, self._location(key, entry), seq / 1e9, seq)

    def _location(self, key, entry):
        path, size, _, _, _ = entry
        start = HEADER.size + len(key.encode())
        return Location(str(path), start, size, record_offset=0, record_length=start + size)

    def locate(self, key):
        self._check_open()
        entry = self._index.get(key)
        return None if entry is None else self._location(key, entry)

    def scan(self, *, verify=False):
        self._check_open()
        for key in list(self._index):
            record = self.stat(key)
            if record is None:
                continue
            if verify and self.batch_read([key], [memoryview(bytearray(record.size))])[0] < 0:
                continue
            yield record

    def usage(self):
        self._check_open()
        with self._lock:
            logical = sum(entry[1] for entry in self._index.values())
            return Usage(logical, self._used(), len(self._index), self.capacity)

    def evict(self, nbytes, on_evict=None):
        self._check_open()
        with self._lock:
            return self._evict_locked(nbytes, on_evict)

    def _evict_locked(self, nbytes, on_evict):
        victims, freed = [], 0
        for key, (_, _, _, disk, _) in list(self._index.items()):  # oldest first
            if freed >= nbytes:
                break
            if not self._pins.is_pinned(key):
                victims.append(key)
                freed += disk
        entries = [self._index.pop(key) for key in victims]
        if victims and on_evict:
            on_evict(victims)  # before the files go, so nobody points at reused space
        for path, *_ in entries:
            path.unlink(missing_ok=True)
        return victims

    def check(self, repair=False):
        self._check_open()
        report = CheckReport(repaired=repair)
        for path in sorted(self.root.glob("*.obj")):
            report.records_checked += 1
            entry = self._load(path)
            ok = entry is not None
            if ok:
                key, (_, _size, value_crc, _, _) = entry
                with open(path, "rb") as f:
                    f.seek(HEADER.size + len(key.encode()))
                    ok = crc32c(f.read()) == value_crc
            if ok:
                continue
            action = None
            if repair:
                with self._lock:
                    for key, item in list(self._index.items()):
                        if item[0] == path:
                            del self._index[key]
                target = self.root / "quarantine" / path.name
                os.replace(path, target)
                action = f"quarantined to {target}"
            report.problems.append(Problem(ProblemKind.CORRUPT_RECORD, "record fails its check",
                                           None, str(path), action))
        return report
