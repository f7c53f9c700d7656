"""``offset``: the offset layout in one preallocated file, with per-object eviction.

Layout under the backend directory::

    KVSTORED-BACKEND.json     the stamp (backend name, layout version)
    volume.kvo                the volume: superblock, two checkpoint slots, journal, data
    quarantine/               records copied out by check(repair=True)

``volume.kvo`` is created at its full size with ``posix_fallocate``, so a full file
system is found at open rather than in the middle of a write, and its blocks are
reserved; the volume's layout is in :mod:`.offset_layout` and docs/format.md, and the
backend itself in :mod:`.offset_core` (which ``nvmeof`` shares).

The volume's size is the ``capacity`` option, fixed when the volume is created (1 GiB
when none is given); reopening with another capacity is refused, not silently resized.
"""

from __future__ import annotations

import errno
import fcntl
import os
import time
from pathlib import Path

from kvstored.backends.offset_core import OffsetLayoutBackend, Volume
from kvstored.backends.offset_layout import LAYOUT_VERSION
from kvstored.backends.stamp import claim_directory, fsync_dir
from kvstored.native import IoFile
from kvstored.sdk.errors import InvalidRequestError, from_oserror

VOLUME_NAME = "volume.kvo"
#: Seconds to wait for the lock of a volume whose previous holder is exiting.
LOCK_WAIT = 5.0


class OffsetBackend(OffsetLayoutBackend):
    """One preallocated volume file under a stamped directory (see the module doc and
    :class:`~kvstored.backends.offset_core.OffsetLayoutBackend` for the options)."""

    name = "offset"

    @property
    def quarantine_dir(self) -> Path:
        return Path(self.path) / "quarantine"

    def _attach(self) -> Volume:
        root = Path(self.path)
        try:
            claim_directory(root, self.name, LAYOUT_VERSION)
            target = root / VOLUME_NAME
            if not target.exists():
                create_volume_file(target, self.capacity or self.DEFAULT_VOLUME_SIZE)
            file = self._engine.open(target, os.O_RDWR)
        except OSError as exc:
            raise from_oserror(exc, path=root, action="opening the offset volume") from exc
        lock_volume(file)
        return Volume(file, os.fstat(file.fd).st_size, device=False, owned=True)


def create_volume_file(target: Path, size: int) -> None:
    """Create ``target`` with ``size`` bytes allocated (not sparse), atomically: a crash
    leaves either no volume or a whole one."""
    tmp = target.with_name(f".{target.name}.tmp")
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.posix_fallocate(fd, 0, size)
        os.fsync(fd)
    except OSError:
        os.close(fd)
        os.unlink(tmp)
        raise
    os.close(fd)
    os.replace(tmp, target)
    fsync_dir(target.parent)


def lock_volume(file: IoFile, wait: float | None = None) -> None:
    """Take an exclusive lock on the volume: two processes writing one volume would
    corrupt it. The kernel drops the lock when the holder dies, but only once the dead
    process's io_uring has been torn down (asynchronously, after in-flight writes ended),
    so a busy lock is retried for ``wait`` seconds before giving up."""
    deadline = time.monotonic() + (LOCK_WAIT if wait is None else wait)
    while True:
        try:
            fcntl.flock(file.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except OSError as exc:
            busy = exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN)
            if busy and time.monotonic() < deadline:
                time.sleep(0.02)
                continue
            file.close()
            if busy:
                raise InvalidRequestError(
                    "the volume is open in another process (a running node, or a tool); "
                    "stop it first", path=file.path) from None
            raise from_oserror(exc, path=file.path, action="locking the volume") from exc
