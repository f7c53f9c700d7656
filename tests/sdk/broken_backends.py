"""Deliberately broken backends: the conformance kit must catch each of them."""

from __future__ import annotations

import os
from pathlib import Path

from kvstored.backends.file_per_key import FilePerKeyBackend
from kvstored.backends.file_per_key.layout import TMP_DIR
from kvstored.backends.file_per_key.recovery import leftovers
from kvstored.sdk import WriteOutcome
from kvstored.sdk.record import VALUE_OFFSET, ReadOutcome


class SkipsChecksum(FilePerKeyBackend):
    """Returns whatever bytes are on disk, without verifying the CRC."""

    def _read_record(self, key, entry, dest):
        with open(entry.path, "rb") as f:
            f.seek(VALUE_OFFSET)
            data = f.read(entry.size)
        dest[:len(data)] = data
        return ReadOutcome(len(data))


class StaleCache(FilePerKeyBackend):
    """Serves reads from a cache that deletes never invalidate: stale bytes."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._cache: dict[str, bytes] = {}

    def batch_read(self, keys, buffers):
        results = super().batch_read(keys, buffers)
        for i, (key, buf) in enumerate(zip(keys, buffers)):
            if key in self._cache and results[i] >= 0:
                cached = self._cache[key]
                buf[:len(cached)] = cached
                results[i] = len(cached)
            elif results[i] >= 0:
                self._cache[key] = bytes(buf[:results[i]])
        return results


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
