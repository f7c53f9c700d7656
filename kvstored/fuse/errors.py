"""The FUSE view's own errors; importing them needs nothing optional (no pyfuse3), so the
CLI's table can name them.

Everything a mount's sources raise is the core's (:mod:`kvstored.errors`, mapped once in
:mod:`kvstored.fuse.sources`); these two are what only a mount has.
"""

from __future__ import annotations


class MountError(Exception):
    """The kernel would not mount the file system (the message says what to check)."""


class InvalidName(ValueError):
    """A file name that no key encodes to (the mount answers ENOENT)."""
