"""``offset``: objects as records at allocator-chosen offsets of one preallocated volume,
evicted one object at a time. The ``nvmeof`` backend puts the same layout on a device.

Modules, one concept each:

- :mod:`.backend`: :class:`OffsetBackend`, the StorageBackend on a volume *file*;
- :mod:`.volume`: the offset layout as a StorageBackend on any volume (what ``offset`` and
  ``nvmeof`` share: placement, reads, deletes, eviction, formatting);
- :mod:`.layout`: the on-disk format: superblock, checkpoint slots, journal;
- :mod:`.journal`: the journal gate and the checkpoints of an open volume;
- :mod:`.recovery`: what happens at open (the last checkpoint, then the journal);
- :mod:`.check`: check and repair.

docs/format.md ("offset") has the byte layouts, versioning and crash behaviour.
"""

from kvstored.backends.offset.backend import OffsetBackend

__all__ = ["OffsetBackend"]
