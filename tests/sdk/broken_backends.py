"""Deliberately broken backends: the conformance kit must catch each of them."""

from __future__ import annotations

import os

from kvstored.backends.file_per_key import FilePerKeyBackend
from kvstored.sdk import ReadStatus


class SkipsChecksum(FilePerKeyBackend):
    """Returns whatever bytes are on disk, without verifying the CRC."""

    def _corrupt(self, key, entry, part):
        return entry.size


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

    def _publish(self, staged, results):
        super()._publish(staged, results)
        for _i, _key, _kb, _tmp, _est, _phys, entry in staged:
            if os.path.exists(entry.path):
                os.unlink(entry.path)

    def batch_read(self, keys, buffers):
        results = super().batch_read(keys, buffers)
        return [ReadStatus.MISSING if r == ReadStatus.MISSING else r for r in results]
