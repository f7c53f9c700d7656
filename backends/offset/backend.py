"""``offset``: the offset layout in one preallocated file, with per-object eviction.

Layout under the backend directory::

    KVSTORED-BACKEND.json     the stamp (backend name, layout version)
    KVSTORED-LOCK             flock'd while the store is open (kvstored.sdk.lock)
    volume.kvo                the volume: superblock, two checkpoint slots, journal, data
    quarantine/               records copied out by check(repair=True)

``volume.kvo`` is created at its full size with ``posix_fallocate``, and formatted, under
a temporary name before it is linked into place, so a full file system is found at open
(a CapacityError naming the sizes) rather than in the middle of a write, and a volume
file that exists has always been formatted: one that does not read is refused, never
formatted again. The volume's layout is in :mod:`.layout` and docs/format.md, and
the rest of the backend in :mod:`.volume` (which ``nvmeof`` shares).

The volume's size is the ``capacity`` option, fixed when the volume is created (1 GiB
when none is given); reopening with another capacity is refused, not silently resized.
"""

from __future__ import annotations

import os
from pathlib import Path

from kvstored.backends.offset.layout import LAYOUT_VERSION
from kvstored.backends.offset.volume import OffsetLayoutBackend, Volume
from kvstored.backends.stamp import claim_directory
from kvstored.sdk.errors import BackendError, MissingStoreError, from_oserror

VOLUME_NAME = "volume.kvo"


class OffsetBackend(OffsetLayoutBackend):
    """One preallocated volume file under a stamped directory (see the module doc and
    :class:`~kvstored.backends.offset.volume.OffsetLayoutBackend` for the options)."""

    name = "offset"
    sdk_version = "1.2"
    #: What this backend keeps in its directory (how a store with a lost stamp is known).
    layout_markers = (VOLUME_NAME,)

    @property
    def quarantine_dir(self) -> Path:
        return Path(self.path) / "quarantine"

    def _attach(self) -> Volume:
        root = Path(self.path)
        self._holds.append(claim_directory(root, self.name, LAYOUT_VERSION, mode=self.mode,
                                           markers=self.layout_markers,
                                           report=self.open_problems))
        target = root / VOLUME_NAME
        try:
            if not self.read_only:
                for stale in root.glob(f".{VOLUME_NAME}.*.tmp"):
                    stale.unlink()  # a creation a crash interrupted; we hold the lock
                if target.exists() and target.stat().st_size == 0:
                    target.unlink()  # an empty file is no volume: make a real one
                if not target.exists():
                    self._create_volume(target, self.capacity or self.DEFAULT_VOLUME_SIZE)
            elif not target.exists():
                raise MissingStoreError(f"the store has no volume file {VOLUME_NAME}",
                                        path=target)
            file = self._engine.open(target, os.O_RDONLY if self.read_only else os.O_RDWR)
        except OSError as exc:
            if isinstance(exc, BackendError):
                raise
            raise from_oserror(exc, path=root, action="opening the offset volume") from exc
        return Volume(file, os.fstat(file.fd).st_size, device=False)
