"""Backends that survive a killed process but not a power cut: each is a correct
built-in with one durability step missing, the kind a real author drops because no
process-kill test can see it. The kit's power-loss checks must catch every one."""

from __future__ import annotations

import os
import threading

from kvstored.backends.bucket import BucketBackend
from kvstored.backends.file_per_key import FilePerKeyBackend
from kvstored.sdk.errors import CorruptionError
from kvstored.sdk.files import PRIVATE_FILE, fsync_dir, write_all
from kvstored.sdk.record import VALUE_OFFSET, ReadOutcome
from kvstored.sdk.types import ReadStatus


class SkipsFileFsync(FilePerKeyBackend):
    """Writes each record to ``tmp/`` and renames it into place, with the directory
    fsync'd, but never fsyncs the record itself: after a cut the name is there and the
    bytes are not."""

    #: Whether the header block and the file's size are fsync'd before the value.
    sync_header = False

    def _write_file(self, tmp, header, value):
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE)
        try:
            write_all(fd, header, 0)
            if self.sync_header:
                os.ftruncate(fd, VALUE_OFFSET + value.nbytes)
                os.fsync(fd)
            write_all(fd, value, VALUE_OFFSET)
            return os.fstat(fd).st_blocks * 512
        finally:
            os.close(fd)


class TrustsSyncedHeaders(SkipsFileFsync):
    """fsyncs each record's header and size but not its value, and believes a record
    whose header checks (its reads skip the value's checksum): after a cut it returns
    the zeros, or the torn half, that reached the disk."""

    sync_header = True

    def _read_record(self, key, entry, dest):
        outcome = super()._read_record(key, entry, dest)
        return ReadOutcome(entry.size) if outcome.status == ReadStatus.CORRUPT else outcome


class SkipsDirectoryFsync(FilePerKeyBackend):
    """fsyncs each record but never the directory it is renamed into: after a cut the
    file is gone (its name was never made durable)."""

    def _sync_folders(self, folders):
        pass


class DeletesLazily(FilePerKeyBackend):
    """Unlinks deleted records at once but fsyncs their directories only with the next
    write or at close (fewer syncs): a cut in between brings the deleted keys back."""

    def __init__(self, *args, **kwargs):
        self._unsynced_dirs: set[str] = set()
        self._unsynced_lock = threading.Lock()
        super().__init__(*args, **kwargs)

    def _unlink(self, entries):
        for entry in entries:
            try:
                os.unlink(entry.path)
            except FileNotFoundError:
                pass
            with self._unsynced_lock:
                self._unsynced_dirs.add(os.path.dirname(entry.path))

    def _sync_deletes(self):
        with self._unsynced_lock:
            folders, self._unsynced_dirs = self._unsynced_dirs, set()
        for folder in folders:
            fsync_dir(folder)

    def batch_write(self, items):
        self._sync_deletes()
        return super().batch_write(items)

    def _close(self):
        self._sync_deletes()
        super()._close()


class WritesLayoutUnsynced(FilePerKeyBackend):
    """Records its layout in a file of its own, fsyncing the directory but not the file,
    and (rightly) refuses to open a store whose layout file it cannot read: a cut right
    after the store was created leaves it unopenable."""

    LAYOUT = b"file-per-key layout 1\n"

    def __init__(self, path, **options):
        super().__init__(path, **options)
        layout = os.path.join(self.path, "LAYOUT")
        if os.path.exists(layout):
            with open(layout, "rb") as f:
                if f.read() != self.LAYOUT:
                    self._dir_lock.release()
                    raise CorruptionError("the layout file is unreadable; move the store "
                                          "aside", path=layout)
            return
        with open(layout, "wb") as f:
            f.write(self.LAYOUT)
        fsync_dir(self.path)  # the name is durable, its bytes are not


class _AcknowledgesFlushes:
    """An io engine whose fsync reports success without flushing anything."""

    def __init__(self, engine):
        self._engine = engine

    def fsync(self, files, *args, **kwargs):
        return [0] * len(files)

    def __getattr__(self, name):
        return getattr(self._engine, name)


class SkipsDataFlush(BucketBackend):
    """The bucket backend with its data files' fdatasync dropped (the index is still
    written atomically): with O_DIRECT the records bypass the page cache, but a drive's
    write cache still loses them without a flush, so the index points at nothing."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.engine = _AcknowledgesFlushes(self.engine)


class NotPersistent(FilePerKeyBackend):
    """Honest, but says its objects do not survive a reopen (as a RAM-only backend
    would): the power-loss checks must report themselves not applicable."""

    @property
    def capabilities(self):
        import dataclasses

        return dataclasses.replace(super().capabilities, persistent=False)
