"""Inode numbers: stable for each entry, remembered while the kernel holds them.

An entry is named by an *identity*, a tuple such as ``("object", key)`` or
``("tier", node, "ssd")``. Its inode number is derived from a hash of the identity, so
it is the same every time the entry is looked up, for the life of the mount and across
mounts: tools that remember ``st_ino`` (``find``, ``tar``, ``du``) see a stable tree
without the table having to keep every key it ever listed.

The table maps numbers back to identities only while the kernel knows them: each
``lookup`` reply and each accepted ``readdir`` entry adds one to the entry's lookup
count, ``forget`` takes them away, and at zero the entry is dropped. Fixed entries (the
root and the fixed directories) are never dropped.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import pyfuse3

Identity = tuple[str, ...]

#: Hashed inode numbers live in [2**62, 2**63): far above the fixed ones, and still
#: positive as a signed 64-bit ``ino_t``.
_HASHED_BASE = 1 << 62


@dataclass(slots=True)
class _Entry:
    identity: Identity
    lookups: int = 0
    #: What the file showed when last opened (size, checksum): a different value at the
    #: next open means the key was removed and written again, and cached pages are stale.
    version: Any = None


class InodeTable:
    """Identity <-> inode number, with the kernel's lookup counts."""

    def __init__(self, fixed: dict[Identity, int]) -> None:
        if pyfuse3.ROOT_INODE not in fixed.values():
            raise ValueError("the fixed entries must include the root inode")
        self._fixed = dict(fixed)
        self._by_inode: dict[int, _Entry] = {ino: _Entry(ident) for ident, ino in fixed.items()}
        self._by_identity: dict[Identity, int] = dict(fixed)

    def __len__(self) -> int:
        return len(self._by_inode)

    def inode_of(self, identity: Identity) -> int:
        """The inode number of ``identity``, registering it (with no lookups yet)."""
        inode = self._by_identity.get(identity)
        if inode is not None:
            return inode
        inode = _hashed(identity)
        # A 62-bit collision between two live entries is astronomically rare, but it
        # must not alias them: probe for a free number.
        while inode in self._by_inode:
            inode = _HASHED_BASE + (inode + 1 - _HASHED_BASE) % _HASHED_BASE
        self._by_inode[inode] = _Entry(identity)
        self._by_identity[identity] = inode
        return inode

    def identity(self, inode: int) -> Identity | None:
        entry = self._by_inode.get(inode)
        return None if entry is None else entry.identity

    def remember(self, inode: int) -> None:
        """The kernel was handed ``inode`` (a lookup reply or an accepted readdir entry)."""
        self._by_inode[inode].lookups += 1

    def forget(self, inode: int, nlookup: int) -> None:
        entry = self._by_inode.get(inode)
        if entry is None:
            return
        entry.lookups = max(0, entry.lookups - nlookup)
        if entry.lookups == 0:
            self.discard_unreferenced(inode)

    def discard_unreferenced(self, inode: int) -> None:
        """Drop ``inode`` if the kernel holds no reference to it (and it is not fixed)."""
        entry = self._by_inode.get(inode)
        if entry is None or entry.lookups or entry.identity in self._fixed:
            return
        del self._by_inode[inode]
        del self._by_identity[entry.identity]

    def swap_version(self, inode: int, version: Any) -> Any:
        """Record what ``inode`` shows now; return what it showed before."""
        entry = self._by_inode[inode]
        previous, entry.version = entry.version, version
        return previous


def _hashed(identity: Identity) -> int:
    # repr() of a tuple of str is unambiguous whatever the strings hold (NUL, quotes).
    raw = hashlib.blake2b(repr(identity).encode("utf-8", "surrogatepass"),
                          digest_size=8).digest()
    return _HASHED_BASE + int.from_bytes(raw, "little") % _HASHED_BASE
