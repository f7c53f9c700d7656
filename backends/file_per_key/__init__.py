"""``file-per-key``: one file per object, for debugging and as the SDK's worked example.

Modules, one concept each:

- :mod:`.backend`: :class:`FilePerKeyBackend`, the StorageBackend (options in its
  docstring);
- :mod:`.layout`: the directory layout and how an object's file is named;
- :mod:`.recovery`: what happens at open;
- :mod:`.check`: check and repair.

docs/format.md ("file-per-key") has the byte layout.
"""

from kvstored.backends.file_per_key.backend import FilePerKeyBackend

__all__ = ["FilePerKeyBackend"]
