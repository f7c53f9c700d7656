"""Deliberately broken backends: the conformance kit must catch each of them."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from kvstored.backends.file_per_key import FilePerKeyBackend
from kvstored.backends.file_per_key.layout import OBJECTS_DIR, TMP_DIR, object_name
from kvstored.backends.file_per_key.recovery import Entry, leftovers, read_entry, record_files
from kvstored.backends.threefs import ThreeFsBackend
from kvstored.sdk import (
    DEFAULT_MAX_VALUE_SIZE,
    InvalidRequestError,
    OpenMode,
    ReadStatus,
    Usage,
    WriteOutcome,
    encode_key,
)
from kvstored.sdk.errors import CorruptionError
from kvstored.sdk.pins import ReadPins
from kvstored.sdk.quarantine import Quarantine
from kvstored.sdk.record import VALUE_OFFSET, ReadOutcome, decode_header


class SkipsChecksum(FilePerKeyBackend):
    """Returns whatever bytes are on disk, without verifying the CRC."""

    def _read_record(self, key, entry, dest):
        with open(entry.path, "rb") as f:
            f.seek(VALUE_OFFSET)
            data = f.read(entry.size)
        dest[:len(data)] = data
        return ReadOutcome(len(data))


class _ReadCache(FilePerKeyBackend):
    """Keeps the bytes each key last read and serves them to the next read of the key
    (where :meth:`_serves` says so) instead of the file's: the defects below are in when
    the cache is emptied."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._cache: dict[str, bytes] = {}

    def _serves(self, cached: bytes, size: int) -> bool:
        return True

    def batch_read(self, keys, buffers):
        results = super().batch_read(keys, buffers)
        for i, (key, buf) in enumerate(zip(keys, buffers)):
            if results[i] < 0:
                continue
            cached = self._cache.get(key)
            if cached is not None and self._serves(cached, results[i]):
                buf[:len(cached)] = cached
                results[i] = len(cached)
            else:
                self._cache[key] = bytes(buf[:results[i]])
        return results


class StaleCache(_ReadCache):
    """Serves reads from a cache that deletes never invalidate: stale bytes."""


class ResurrectsDeletes(FilePerKeyBackend):
    """Forgets deleted keys in memory but leaves their files: they return on reopen."""

    def _unlink(self, entries):
        pass


class IgnoresCapacity(FilePerKeyBackend):
    """Never evicts and never refuses: it grows past its capacity."""

    def _reserve_locked(self, key, need):
        self._reserved += need
        return None


class LosesAcknowledgedWrites(FilePerKeyBackend):
    """Acknowledges writes but only keeps them in memory."""

    def batch_write(self, items):
        results = super().batch_write(items)
        for result in results:
            if result.outcome is WriteOutcome.WRITTEN:
                os.unlink(self.index.location(result.key).path)
        return results


class ClaimsKeyByKey(FilePerKeyBackend):
    """Claims the keys of a batch one at a time, waiting for another writer's claim
    while holding its own (file-per-key and offset before issue 9): two batches naming
    the same keys in opposite orders deadlock."""

    def batch_write(self, items):
        import threading

        from kvstored.sdk import WriteOutcome, WriteResult

        self._check_writable()
        self._check_value_sizes(items)
        results = []
        mine: dict[str, threading.Event] = {}
        pending = self.__dict__.setdefault("_old_pending", {})
        try:
            for key, _value in items:
                while True:
                    with self._lock:
                        if key in self.index or key in mine:
                            results.append(WriteResult(key, WriteOutcome.EXISTS))
                            break
                        other = pending.get(key)
                        if other is None:
                            mine[key] = pending[key] = threading.Event()
                            results.append(None)
                            break
                    other.wait()  # holding every claim taken so far: the defect
            todo = [(i, item) for i, (item, r) in enumerate(zip(items, results)) if r is None]
            written = super().batch_write([item for _, item in todo])
            for (i, _), result in zip(todo, written):
                results[i] = result
        finally:
            with self._lock:
                for key, event in mine.items():
                    del pending[key]
                    event.set()
        return results


class TidiesWhenReadOnly(FilePerKeyBackend):
    """Claims read-only opens but still runs the read-write recovery: it removes the
    unfinished writes a crash left, which a read-only open must leave alone."""

    def __init__(self, path, **options):
        for leftover in leftovers(Path(path) / TMP_DIR):
            leftover.unlink()
        super().__init__(path, **options)


class TakesNoLock(FilePerKeyBackend):
    """Never locks its directory: a second process opens (and writes) it too."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._dir_lock.release()


# -- one realistic defect per contract clause (issue 11) ---------------------------------


class ChecksumFirstReadOnly(FilePerKeyBackend):
    """Integrity: verifies a key's checksum on its first read and trusts it afterwards
    (a "verified" flag kept to save CPU)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._verified: set[str] = set()

    def _read_record(self, key, entry, dest):
        if key in self._verified:
            fd = os.open(entry.path, os.O_RDONLY)
            try:
                os.preadv(fd, [dest[:entry.size]], VALUE_OFFSET)
            finally:
                os.close(fd)
            return ReadOutcome(entry.size)
        outcome = super()._read_record(key, entry, dest)
        if outcome.ok:
            self._verified.add(key)
        return outcome


class CacheKeptOnEviction(_ReadCache):
    """Deletes: a read cache that deletes invalidate but evictions do not, so a key
    evicted and written again with new bytes of the same size reads the old ones."""

    def _serves(self, cached, size):
        return len(cached) == size

    def batch_delete(self, keys):
        for key in keys:
            self._cache.pop(key, None)
        return super().batch_delete(keys)


class TruncatedFileNames(FilePerKeyBackend):
    """Keys: names a key's file after its first 200 bytes (to stay under NAME_MAX), so
    two long keys sharing a prefix land in one file."""

    def _stage(self, key, key_bytes, value):
        tmp, entry = super()._stage(key, key_bytes, value)
        shard, sub, name = object_name(key_bytes[:200])
        entry.path = str(self.objects_dir / shard / sub / name)
        return tmp, entry


class LazyDeletes(FilePerKeyBackend):
    """Deletes: forgets deleted and evicted keys at once but unlinks their files only at
    close, so a process killed before then brings them back."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._doomed: list = []

    def _unlink(self, entries):
        self._doomed.extend(entries)

    def _close(self):
        FilePerKeyBackend._unlink(self, self._doomed)
        super()._close()


class PinsIgnoredWhenFull(FilePerKeyBackend):
    """Pins: evict() skips pinned keys, but the eviction a write does to make room does
    not look at the pins."""

    def _reserve_locked(self, key, need):
        pins, self._pins = self._pins, ReadPins()
        try:
            return super()._reserve_locked(key, need)
        finally:
            self._pins = pins


class UncountedHeaders(FilePerKeyBackend):
    """Capacity: counts a value's bytes as its disk use, without the 4 KiB header block
    and the padding, so the files outgrow the capacity."""

    def _stage(self, key, key_bytes, value):
        tmp, entry = super()._stage(key, key_bytes, value)
        entry.physical = entry.size
        return tmp, entry


class LogicalDriftsOnEviction(FilePerKeyBackend):
    """Usage: the eviction path drops objects without taking their bytes off
    logical_bytes (deletes do it right)."""

    def _evict_locked(self, nbytes, on_evict):
        logical = self.index.logical_bytes
        victims = super()._evict_locked(nbytes, on_evict)
        self.index.logical_bytes = logical
        return victims


class EvictsEverything(FilePerKeyBackend):
    """Eviction: evict(n) ignores n and empties the store."""

    def evict(self, nbytes, on_evict=None):
        return super().evict(10**18, on_evict)


class EvictsOneObject(FilePerKeyBackend):
    """Eviction: evict(n) removes one object, whatever n, and reports success."""

    def _evict_locked(self, nbytes, on_evict):
        return super()._evict_locked(1, on_evict)


class AdmitsShortRecords(FilePerKeyBackend):
    """Records that check: the open trusts the header's length without comparing it with
    the file's, so a record cut short at the tail is indexed, admitted and scanned."""

    def __init__(self, path, **options):
        super().__init__(path, **options)
        indexed = {entry.path for _, entry in self.index.snapshot()}
        for record in record_files(self.objects_dir):
            if str(record) in indexed:
                continue
            with open(record, "rb", buffering=0) as f:
                st = os.fstat(f.fileno())
                try:
                    header = decode_header(f.read(VALUE_OFFSET), path=str(record))
                except CorruptionError:
                    continue
            with self._lock:
                self._index_locked(header.key, Entry(
                    str(record), header.value_len, header.value_crc, header.seq,
                    header.write_ns, st.st_blocks * 512))


class DropsShortRecordsSilently(FilePerKeyBackend):
    """Check and repair: the open deletes the records that do not check, so check()
    afterwards finds nothing and reports the store clean."""

    def __init__(self, path, **options):
        if options.get("mode", OpenMode.READ_WRITE) is OpenMode.READ_WRITE:
            for record in list(record_files(Path(path) / OBJECTS_DIR)):
                try:
                    read_entry(record)
                except (CorruptionError, OSError):
                    record.unlink()
        super().__init__(path, **options)


class RepairDeletesEvidence(FilePerKeyBackend):
    """Check and repair: repair deletes the bad record's file instead of moving it to
    the quarantine."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.quarantine = _Shredder(self.quarantine.folder)


class _Shredder(Quarantine):
    """A quarantine that deletes what it is given."""

    def move_aside(self, path, why):
        os.unlink(path)
        return f"deleted {path}"


class StatAfterClose(FilePerKeyBackend):
    """After close: stat() and locate() forgot their closed check (they answer None)."""

    def stat(self, key):
        return self.index.stat(key)

    def locate(self, key):
        return self.index.location(key)


class UsageStatsFiles(FilePerKeyBackend):
    """Blocking: usage() sums st_blocks over the object files (exact, but disk I/O on the
    node's event loop)."""

    def usage(self):
        self._check_open()
        with self._lock:
            entries = [entry for _, entry in self.index.items()]
        physical = sum(os.stat(e.path).st_blocks * 512 for e in entries)
        return Usage(sum(e.size for e in entries), physical, len(entries), self.capacity)


class StatReadsHeader(FilePerKeyBackend):
    """Blocking: stat() re-reads the record header to report fresh figures."""

    def stat(self, key):
        record = super().stat(key)
        if record is not None:
            with open(record.location.path, "rb", buffering=0) as f:
                f.read(64)
        return record


class FailsWholeBatch(FilePerKeyBackend):
    """Batch failures: when one item of a batch fails, it fails (and removes) them all."""

    def batch_write(self, items):
        from kvstored.sdk import WriteOutcome, WriteResult

        results = super().batch_write(items)
        failed = next((r for r in results if r.outcome is WriteOutcome.FAILED), None)
        if failed is None:
            return results
        self.batch_delete([r.key for r in results if r.outcome is WriteOutcome.WRITTEN])
        return [WriteResult(key, WriteOutcome.FAILED, failed.error) for key, _ in items]


class TooLargeOnlyAlone(FilePerKeyBackend):
    """Errors: checks max_value_size only for a batch of one."""

    def _check_value_sizes(self, items):
        if len(items) == 1:
            return super()._check_value_sizes(items)
        return [encode_key(key) for key, _ in items]


class KeepsWriteBuffers(FilePerKeyBackend):
    """Buffers: keeps a zero-copy view of each written value as a read cache, so a
    caller reusing its buffer changes what reads return."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._views: dict[str, memoryview] = {}

    def batch_write(self, items):
        results = super().batch_write(items)
        for (key, value), result in zip(items, results):
            if result.outcome.value == "written":
                self._views[key] = memoryview(value)
        return results

    def batch_read(self, keys, buffers):
        results = super().batch_read(keys, buffers)
        for i, key in enumerate(keys):
            view = self._views.get(key)
            if results[i] >= 0 and view is not None:
                buffers[i][:view.nbytes] = view
        return results


class ReadOnlyBufferUnchecked(FilePerKeyBackend):
    """Buffers: checks only the number of read buffers, so a read-only buffer fails
    inside the I/O with a BufferError."""

    def _check_read_buffers(self, keys, buffers):
        if len(keys) != len(buffers):
            raise InvalidRequestError(f"{len(keys)} keys but {len(buffers)} buffers")


class LeavesCorruptBytes(FilePerKeyBackend):
    """Buffers: a read that fails its checksum leaves the bad bytes in the buffer."""

    def _read_record(self, key, entry, dest):
        outcome = super()._read_record(key, entry, dest)
        if outcome.status == ReadStatus.CORRUPT:
            fd = os.open(entry.path, os.O_RDONLY)
            try:
                os.preadv(fd, [dest[:entry.size]], VALUE_OFFSET)
            finally:
                os.close(fd)
        return outcome


class SeqRestartsAtOpen(FilePerKeyBackend):
    """Sequence numbers: the counter restarts at 0 at every open."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._seq = 0


class ScanPagesByPosition(FilePerKeyBackend):
    """Scan: pages through the index by position, re-reading it per page, so a delete
    during the scan shifts later keys out of the next page (missed) or into it twice."""

    def scan(self, *, verify=False):
        self._check_open()
        start = 0
        while True:
            with self._lock:
                page = self.index.items()[start:start + 32]
            if not page:
                return
            for key, entry in page:
                yield self.index.record(key, entry)
            start += len(page)


class NoSdkVersion(FilePerKeyBackend):
    """Versions: declares no SDK version."""

    sdk_version = None


class TargetsNextMajor(FilePerKeyBackend):
    """Versions: declares an SDK major version this SDK is not."""

    sdk_version = "2.0"


class OverwritesExisting(FilePerKeyBackend):
    """Write-once: a write of an existing key deletes the old object and writes anew."""

    def batch_write(self, items):
        present = [key for key, hit in zip([k for k, _ in items],
                                           self.batch_contains([k for k, _ in items])) if hit]
        if present:
            self.batch_delete(present)
        return super().batch_write(items)


class IgnoresMaxValueOption(FilePerKeyBackend):
    """Capabilities: reports the default max_value_size, not the one it was opened with."""

    @property
    def capabilities(self):
        return replace(super().capabilities, max_value_size=DEFAULT_MAX_VALUE_SIZE)


class SharedLocationOffByHeader(ThreeFsBackend):
    """Sharing: locate() gives the record's offset, not the value's, so another node
    reading there gets the header."""

    def locate(self, key):
        where = super().locate(key)
        return None if where is None else replace(where, offset=where.record_offset)


class ClaimsNotPersistent(FilePerKeyBackend):
    """Not defective: says it is not persistent, so the checks that need persistence
    must be reported not applicable (and the rest must pass)."""

    @property
    def capabilities(self):
        return replace(super().capabilities, persistent=False)


class StreamRepeatsIndex(FilePerKeyBackend):
    """Its read stream hands out the first item a second time at the end."""

    def _stream_reads(self, keys, buffers):
        items = list(super()._stream_reads(keys, buffers))
        yield from items
        if items:
            yield items[0]


class StreamBadIndex(FilePerKeyBackend):
    """Its read stream numbers items from 1 (an off-by-one): the last index is one past
    the keys, and index 0 never comes."""

    def _stream_reads(self, keys, buffers):
        for index, result in super()._stream_reads(keys, buffers):
            yield index + 1, result


class StreamLeaksPins(FilePerKeyBackend):
    """Its read stream pins every key at the start and releases the pins only when it
    runs to its end: a stream closed early leaves them pinned for good."""

    def _stream_reads(self, keys, buffers):
        pinned = self._pins.acquire(keys)
        yield from super()._stream_reads(keys, buffers)
        self._pins.release(pinned)


class StreamSkipsChecksum(FilePerKeyBackend):
    """Its read stream copies each value from its file without checking the CRC."""

    def _stream_reads(self, keys, buffers):
        for index, (key, buf) in enumerate(zip(keys, buffers)):
            entry = self.index.get(key)
            if entry is None:
                yield index, ReadStatus.MISSING
                continue
            with open(entry.path, "rb") as f:
                f.seek(VALUE_OFFSET)
                data = f.read(entry.size)
            buf[:len(data)] = data
            yield index, len(data)


def make_file_per_key(path, **options):
    """A module-level factory: what check_backend takes, importable by a child."""
    return FilePerKeyBackend(path, **options)
