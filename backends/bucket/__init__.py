"""``bucket``: the default SSD backend. Objects are written in sealed buckets, one data
file and one index file each, and evicted a whole bucket at a time.

Modules, one concept each:

- :mod:`.backend`: :class:`BucketBackend`, the StorageBackend (options in its docstring);
- :mod:`.layout`: the directory layout and file names;
- :mod:`.index`: the index file format;
- :mod:`.state`: buckets and record slots in memory;
- :mod:`.records`: record I/O through the io engine (aligned writes, verified batched reads);
- :mod:`.recovery`: what happens at open;
- :mod:`.check`: check and repair (bad bytes go to the SDK's
  :class:`~kvstored.sdk.quarantine.Quarantine`).

docs/format.md ("bucket") has the byte layouts, versioning and crash behaviour.
"""

from kvstored.backends.bucket.backend import BucketBackend

__all__ = ["BucketBackend"]
