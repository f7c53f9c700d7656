"""Block devices as the ``nvmeof`` backend meets them: the kernel's exclusive claim, the
device's size and its sector size.

Nothing here knows the offset layout; :mod:`.backend` puts it on the device.
"""

from __future__ import annotations

import fcntl
import os
import stat
import struct

from kvstored.sdk.errors import InvalidRequestError
from kvstored.sdk.record import ALIGN

#: ioctl numbers from <linux/fs.h>: the device size in bytes, its logical sector size.
BLKGETSIZE64 = 0x80081272
BLKSSZGET = 0x1268


class DeviceClaim:
    """An ``O_EXCL`` descriptor of a block device: the kernel's claim on it, held until
    :meth:`release`. Never given to the io engine."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def release(self) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)


def is_block_device(path: str) -> bool:
    try:
        return stat.S_ISBLK(os.stat(path).st_mode)
    except OSError:
        return False


def device_size(fd: int) -> int:
    """The size of the block device open as ``fd``, in bytes."""
    buf = bytearray(8)
    try:
        fcntl.ioctl(fd, BLKGETSIZE64, buf, True)
    except OSError:
        return os.lseek(fd, 0, os.SEEK_END)  # the same answer, where the ioctl is missing
    return struct.unpack("<Q", buf)[0]


def check_sector_size(fd: int, path: str) -> None:
    """Refuse devices whose logical sectors exceed the layout's 4 KiB alignment: O_DIRECT
    writes of 4 KiB blocks would fail on them."""
    buf = bytearray(4)
    try:
        fcntl.ioctl(fd, BLKSSZGET, buf, True)
    except OSError:
        return
    sector = struct.unpack("<i", buf)[0]
    if sector > ALIGN:
        raise InvalidRequestError(
            f"the device has {sector}-byte logical sectors; the offset layout needs "
            f"{ALIGN} or less", path=path)
