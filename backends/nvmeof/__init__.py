"""``nvmeof``: the offset layout written directly on a block device (an NVMe-oF namespace,
a local NVMe namespace, a loop device) or on a file.

The bytes on the device are exactly an ``offset`` volume, and everything that reads and
writes them is offset's (:mod:`kvstored.backends.offset`: its layout, volume logic,
recovery and check). This package adds how a device is found and claimed:

- :mod:`.backend`: :class:`NvmeofBackend`, the StorageBackend (how a path or a ``device``
  option names the volume, and the directory that binds a device to its volume);
- :mod:`.device`: block devices: the exclusive claim, the size, the sector size.

docs/nvmeof.md is the operator's guide; docs/format.md ("nvmeof") the bytes.
"""

from kvstored.backends.nvmeof.backend import NvmeofBackend

__all__ = ["NvmeofBackend"]
