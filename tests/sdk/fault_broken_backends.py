"""Backends that pass every check of a healthy disk but mishandle a failing one: each is a
correct built-in with one error path a real author gets wrong because nothing tests it.
The kit's fault checks (sdk/testing/checks/faults.py) must catch every one."""

from __future__ import annotations

import errno
import os

from kvstored.backends.bucket import BucketBackend
from kvstored.backends.file_per_key import FilePerKeyBackend
from kvstored.backends.file_per_key.layout import object_name
from kvstored.sdk.errors import BackendIOError, CapacityError
from kvstored.sdk.files import PRIVATE_FILE, make_private_dirs, write_all
from kvstored.sdk.record import VALUE_OFFSET, decode_header
from kvstored.sdk.types import WriteOutcome


class _WritesRecords(FilePerKeyBackend):
    """file-per-key's record write with its two error-path steps as methods, for the
    defects below to get wrong: the record's sync, and what is done with the file when
    the write fails."""

    def _sync_record(self, fd: int) -> None:
        os.fsync(fd)

    def _discard(self, tmp: str, header) -> None:
        os.unlink(tmp)

    def _write_file(self, tmp, header, value):
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE)
        try:
            write_all(fd, header, 0)
            write_all(fd, value, VALUE_OFFSET)
            self._sync_record(fd)
            physical = os.fstat(fd).st_blocks * 512
        except OSError:
            os.close(fd)  # first: the file may be renamed or unlinked next
            self._discard(tmp, header)
            raise
        os.close(fd)
        return physical


class IgnoresFsyncErrors(_WritesRecords):
    """Treats a failing fsync as advisory ("the data is written, the sync is only a
    hint"): it reports WRITTEN for objects that never reached stable storage."""

    def _sync_record(self, fd: int) -> None:
        try:
            os.fsync(fd)
        except OSError:
            pass  # the bytes are in the page cache; the sync is only a hint


class RaisesWriteErrors(FilePerKeyBackend):
    """Fails fast: the first item that fails raises its error out of batch_write, so the
    caller learns nothing of the other items (and the ones written are unreported)."""

    def batch_write(self, items):
        results = super().batch_write(items)
        for result in results:
            if result.outcome is WriteOutcome.FAILED:
                raise result.error
        return results


class ENOSPCAsIOError(FilePerKeyBackend):
    """Wraps every OSError as a BackendIOError with its errno, ENOSPC included, so a full
    file system looks like a broken disk (the node then fails the device instead of
    evicting)."""

    def _stage(self, key, key_bytes, value):
        try:
            return super()._stage(key, key_bytes, value)
        except CapacityError as exc:
            raise BackendIOError("writing the object", errno=errno.ENOSPC, key=key,
                                 path=exc.path) from exc


class EvictsSilentlyWhenFull(FilePerKeyBackend):
    """Makes room when the file system says ENOSPC by evicting everything, without
    calling on_evict: objects acknowledged before the fault are gone and nobody was
    told."""

    def _stage(self, key, key_bytes, value):
        try:
            return super()._stage(key, key_bytes, value)
        except CapacityError:
            with self._lock:
                self._evict_locked(self._physical, None)
            raise


class LeavesFailedObjects(_WritesRecords):
    """When a record's write or fsync fails it reports the item FAILED but keeps the
    file, moved into place ("a retry need not rewrite it"): a reopen finds an object the
    caller was told was not written."""

    def _discard(self, tmp: str, header) -> None:
        shard, sub, name = object_name(decode_header(header).key.encode())
        folder = self.objects_dir / shard / sub
        try:
            make_private_dirs(folder)
            os.rename(tmp, folder / name)  # kept for a retry
        except OSError:
            os.unlink(tmp)


class _IgnoresFlushErrors:
    """An io engine wrapper whose fsync flushes but reports success whatever the engine
    said (an author who checks the results of writes only)."""

    def __init__(self, engine):
        self._engine = engine

    def fsync(self, files, *args, **kwargs):
        self._engine.fsync(files, *args, **kwargs)
        return [0] * len(files)

    def __getattr__(self, name):
        return getattr(self._engine, name)


class IgnoresFlushErrors(BucketBackend):
    """The bucket backend with its data files' fdatasync results unread: an IoError the
    io engine (posix or io_uring, O_DIRECT or not) returns for the flush is dropped, and
    the bucket is acknowledged."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.engine = _IgnoresFlushErrors(self.engine)
