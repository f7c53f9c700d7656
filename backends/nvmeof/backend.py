"""``nvmeof``: the offset layout written directly on a block device, or on a file.

Meant for an NVMe-oF namespace attached with ``nvme connect`` (docs/nvmeof.md), it works
on any block device (a local NVMe namespace, a loop device) and on a regular file. The
bytes on the device are exactly an ``offset`` volume (:mod:`kvstored.backends.offset.layout`): a
superblock at offset 0 (magic, version, size, checkpoint and journal locations, uuid,
CRC), two checkpoint slots, the journal, then records.

Naming the volume
    - ``path`` *is* the volume: a block device, or a regular file (created with
      ``capacity`` bytes, or 1 GiB, when missing).
    - ``path`` is a directory and the ``device`` option names the device (what a node
      does: its backend path is a directory). The directory holds the stamp,
      ``volume.json`` binding it to the volume's uuid, and ``quarantine/``. Device names
      such as ``/dev/nvme1n1`` change when targets reconnect in another order; a device
      holding a different volume is refused instead of being read as this one.
    - ``path`` is such a directory and no ``device`` is given: the device it was last
      bound to (in ``volume.json``) is used, which is how the offline tools open a
      node's directory.

Safety
    - Block devices are claimed with ``O_EXCL``: the kernel refuses while the device is
      mounted, part of an md/LVM/device-mapper device, or open by another kvstored. The
      claim is a descriptor of its own, never the one the io engine uses (an io_uring
      request may hold that file a moment past ``close``), so ``close`` releases it at
      once; a regular file is ``flock``'d the same way. A read-only open probes the
      claim (``O_RDONLY|O_EXCL``), so it never opens a volume a node is writing, then lets
      it go so that readers can share the device.
    - A device without a superblock is formatted only if its first MiB is blank (all
      zeros) or the ``format`` option is set; a device holding a file system is refused.
      A device that holds a kvstored volume is never reformatted: a damaged superblock
      is refused (repair mode rebuilds it from the checkpoint slots or the records).
    - A new volume *file* is created formatted, under a temporary name, before it is
      linked into place.
    - ``direct`` (O_DIRECT) defaults to on for block devices: the page cache would only
      duplicate the node's DRAM tier, and every record write is whole 4 KiB blocks.
    - The device size comes from ``ioctl(BLKGETSIZE64)``; ``capacity`` may use less
      than all of it, never more.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import stat
import time
from pathlib import Path
from typing import Any

from kvstored.backends.nvmeof.device import (
    DeviceClaim,
    check_sector_size,
    device_size,
    is_block_device,
)

# nvmeof is the offset layout on a device: the on-disk format, the volume logic, its
# recovery and check are all offset's; this package adds only how a device is attached.
from kvstored.backends.offset.layout import LAYOUT_VERSION, Geometry, MiB, peek_slot
from kvstored.backends.offset.recovery import read_exact
from kvstored.backends.offset.volume import OffsetLayoutBackend, Volume
from kvstored.backends.stamp import claim_directory
from kvstored.sdk.errors import (
    BackendBusyError,
    BackendError,
    CorruptionError,
    InvalidRequestError,
    MissingStoreError,
    from_oserror,
)
from kvstored.sdk.files import write_atomically
from kvstored.sdk.lock import StoreLock, openers_of
from kvstored.sdk.record import ALIGN
from kvstored.sdk.types import OpenMode

log = logging.getLogger(__name__)

#: Where a bare block device's quarantine goes when no quarantine_dir is given.
DEVICE_QUARANTINE_ROOT = Path("/var/lib/kvstored/quarantine")
#: How long to retry a device that is busy because its previous user is still exiting.
#: The kernel releases a block device's exclusive claim on the last ``fput``, which can
#: be deferred to a work queue; on a loaded machine that has been seen to take over 5 s.
BUSY_WAIT = 30.0
#: After this long busy, say once that we are waiting, so a slow start is explained.
BUSY_NOTICE = 1.0
BINDING_NAME = "volume.json"


class NvmeofBackend(OffsetLayoutBackend):
    """The offset layout on a block device or file (see the module doc).

    Options besides those of the offset layout: ``device`` (the device, when ``path`` is
    a directory), ``format`` (format a device whose first MiB is not blank),
    ``quarantine_dir`` (where check(repair=True) copies bad records).
    """

    name = "nvmeof"
    sdk_version = "1.2"
    #: What this backend keeps in its directory (how a store with a lost stamp is known).
    layout_markers = (BINDING_NAME,)

    def __init__(self, path: str | os.PathLike, *, device: str | None = None,
                 format: bool = False, quarantine_dir: str | None = None,
                 direct: bool | None = None, mode: OpenMode = OpenMode.READ_WRITE,
                 **options: Any) -> None:
        if device is None and os.path.isdir(path):
            device = _bound_device(Path(path))
        self.device_option = device
        self.format_allowed = format
        self._quarantine_option = quarantine_dir
        target = device if device is not None else os.fspath(path)
        if direct is None and is_block_device(target):
            direct = True
        super().__init__(path, direct=direct, mode=mode, **options)

    @property
    def quarantine_dir(self) -> Path:
        if self._quarantine_option:
            return Path(self._quarantine_option)
        if self.device_option is not None:
            return Path(self.path) / "quarantine"
        if self.device:
            return DEVICE_QUARANTINE_ROOT / Path(self.path).name
        return Path(f"{self.path}.quarantine")

    # -- attaching the device ------------------------------------------------------------

    def _attach(self) -> Volume:
        if self.device_option is not None:
            self._holds.append(claim_directory(Path(self.path), self.name, LAYOUT_VERSION,
                                               mode=self.mode, markers=self.layout_markers,
                                           report=self.open_problems))
            target = self.device_option
        else:
            target = self.path
            if os.path.isdir(target):
                raise InvalidRequestError(
                    "this is a directory: point the nvmeof backend at a block device or "
                    "a file, or set its device option (the directory then keeps its "
                    "stamp and quarantine)", path=target)
        try:
            info = os.stat(target)
        except FileNotFoundError:
            if self.device_option is not None:
                raise InvalidRequestError(
                    "the device does not exist; attach the NVMe-oF namespace first "
                    "(nvme connect …; `nvme list` shows it)", path=target) from None
            if self.read_only:
                raise MissingStoreError("no nvmeof volume here: the file does not exist",
                                        path=target) from None
            try:
                self._create_volume(Path(target), self.capacity or self.DEFAULT_VOLUME_SIZE)
                info = os.stat(target)
            except OSError as exc:
                if isinstance(exc, BackendError):
                    raise
                raise from_oserror(exc, path=target, action="creating the volume file") \
                    from exc
        block = stat.S_ISBLK(info.st_mode)
        if not block and not stat.S_ISREG(info.st_mode):
            raise InvalidRequestError("not a block device or a regular file", path=target)
        self._holds.append(self._claim_device(target) if block else
                           StoreLock.acquire(target, shared=self.read_only, create=False,
                                             what="nvmeof volume",
                                             wait=0 if self.read_only else BUSY_NOTICE))
        flags = os.O_RDONLY if self.read_only else os.O_RDWR
        try:
            file = self._engine.open(target, flags)
        except OSError as exc:
            raise from_oserror(exc, path=target, action="opening the volume") from exc
        try:
            size = device_size(file.fd) if block else os.fstat(file.fd).st_size
            if block:
                check_sector_size(file.fd, target)
        except BaseException:
            file.close()
            raise
        return Volume(file, size, device=block)

    def _claim_device(self, target: str) -> DeviceClaim:
        """Claim the device with ``O_EXCL`` on a descriptor of its own: no mounted or
        otherwise claimed device is ever written, nor read while a node writes it.
        Read-only, the claim is only probed and let go at once, so that several readers
        can share the device (in a node's directory its shared lock keeps a node from
        starting meanwhile)."""
        start = time.monotonic()
        deadline = start + (0 if self.read_only else BUSY_WAIT)
        noticed = False
        flags = (os.O_RDONLY if self.read_only else os.O_RDWR) | os.O_EXCL | os.O_CLOEXEC
        while True:
            try:
                claim = DeviceClaim(os.open(target, flags))
                if self.read_only:
                    claim.release()
                return claim
            except OSError as exc:
                if exc.errno != errno.EBUSY:
                    raise from_oserror(exc, path=target, action="opening the device") from exc
                if time.monotonic() >= deadline:
                    who = openers_of(target)
                    raise BackendBusyError(
                        "the device is in use: mounted, part of an md/LVM/device-mapper "
                        f"device, or open by {who or 'another kvstored'}; free it first "
                        "(lsblk and `fuser -v` show who holds it)", path=target,
                        holder=who) from None
                if not noticed and time.monotonic() - start >= BUSY_NOTICE:
                    noticed = True
                    log.warning("%s is busy (held exclusively by someone else); waiting up "
                                "to %.0f s for it to be released", target, BUSY_WAIT)
                time.sleep(0.05)  # polled with a deadline: the holder may be exiting

    def _may_format(self, volume: Volume, first_block) -> bool:
        head = read_exact(self._engine, self._file, 0, min(volume.size, 1 * MiB)
                          - min(volume.size, 1 * MiB) % ALIGN)
        if head == bytes(len(head)):
            return True
        if self.format_allowed:
            log.warning("%s: formatting it although its first MiB holds data (format=true)",
                        self._file.path)
            return True
        if peek_slot(head[ALIGN:2 * ALIGN]) is not None:
            raise CorruptionError(
                "this is a kvstored volume whose superblock does not check (its checkpoints "
                "are there), and kvstored never formats over data it cannot read: "
                f"{self._repair_hint()}; or, if its objects may go, open it with the "
                "option format=true", path=self._file.path)
        raise InvalidRequestError(
            "it holds data that is not a kvstored volume (a file system, a partition "
            "table, …); if it may be overwritten, wipe it (`wipefs --all`, `blkdiscard`) "
            "or open it with the option format=true", path=self._file.path)

    def _open_geometry(self, volume: Volume) -> Geometry:
        geometry = super()._open_geometry(volume)
        if volume.size > geometry.volume_size and volume.device:
            log.info("%s: the volume uses %d of the device's %d bytes (capacity)",
                     self._file.path, geometry.volume_size, volume.size)
        if self.device_option is not None:
            self._bind(geometry)
        return geometry

    def _bind(self, geometry: Geometry) -> None:
        """Check (or record) which volume the directory belongs to."""
        binding = Path(self.path) / BINDING_NAME
        mine = {"device": self.device_option, "uuid": geometry.uuid.hex()}
        try:
            known = json.loads(binding.read_text())
        except FileNotFoundError:
            known = None
        except (ValueError, UnicodeDecodeError):
            raise InvalidRequestError(f"{BINDING_NAME} is unreadable; restore it or remove "
                                      "it to adopt the device's volume", path=binding) from None
        if not isinstance(known, dict | None):
            raise InvalidRequestError(f"{BINDING_NAME} is unreadable; restore it or remove "
                                      "it to adopt the device's volume", path=binding)
        if known is not None and known.get("uuid") != mine["uuid"]:
            raise InvalidRequestError(
                f"{self.device_option} holds volume {mine['uuid']}, but this directory "
                f"belongs to volume {known.get('uuid')} (last seen at {known.get('device')}). "
                "Device names change when targets reconnect: point the device option at "
                "the right one (a /dev/disk/by-id/ name is stable)", path=self.path)
        if known != mine and not self.read_only:
            write_atomically(binding, json.dumps(mine).encode() + b"\n")


def _bound_device(directory: Path) -> str | None:
    """The device a store directory was last bound to (its ``volume.json``), if any."""
    try:
        known = json.loads((directory / BINDING_NAME).read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    device = known.get("device") if isinstance(known, dict) else None
    return device if isinstance(device, str) and device else None
