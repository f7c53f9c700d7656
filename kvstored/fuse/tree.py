"""The layout of a mount: which directories exist, what each one lists, what a name
in each one means. Pure namespace logic over a :class:`~kvstored.fuse.sources.Source`;
inode numbers and FUSE replies are :mod:`kvstored.fuse.ops`' business.

::

    /keys/<name>                    every object (names: kvstored.fuse.names)
    /nodes/<node>/<dram|ssd>/<name> the objects with a replica on that node and tier (live)
    /stats/cluster.json             the master's status (live)
    /stats/nodes/<node>.json        one node's part of it (live)
    /stats/backend.json             the backend's usage and capabilities (offline)

Entries are named by identities (tuples): ``("object", key)`` is the same file wherever
it is listed, so its inode, attributes and cached pages are shared.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import pyfuse3

from kvstored.fuse.errors import InvalidName
from kvstored.fuse.inodes import Identity
from kvstored.fuse.names import HashedNames, key_to_name, parse_name
from kvstored.fuse.sources import TIERS, Entry, Source

ROOT: Identity = ("root",)
KEYS: Identity = ("keys",)
NODES: Identity = ("nodes",)
STATS: Identity = ("stats",)
STATS_NODES: Identity = ("stats-nodes",)

#: The directories every mount of a kind has, with fixed inode numbers.
FIXED: dict[Identity, int] = {ROOT: pyfuse3.ROOT_INODE, KEYS: 2, NODES: 3, STATS: 4,
                              STATS_NODES: 5}

_DIRECTORY_KINDS = {"root", "keys", "nodes", "stats", "stats-nodes", "node", "tier"}


@dataclass(frozen=True, slots=True)
class Child:
    """One directory entry: its name, what it is, and (for objects) what it holds."""

    name: bytes
    identity: Identity
    #: The object, for object files: its size and time.
    entry: Entry | None = None
    #: Where a listing that stopped after this child resumes (objects: the key).
    cursor: str | None = None


def is_directory(identity: Identity) -> bool:
    return identity[0] in _DIRECTORY_KINDS


def is_object(identity: Identity) -> bool:
    return identity[0] == "object"


class Tree:
    """Names and listings of one mount over ``source``."""

    def __init__(self, source: Source) -> None:
        self.source = source
        self.hashed = HashedNames()

    def fixed(self) -> dict[Identity, int]:
        if self.source.has_nodes:
            return dict(FIXED)
        return {ident: ino for ident, ino in FIXED.items() if ident not in (NODES, STATS_NODES)}

    # -- names -------------------------------------------------------------------------

    def object_child(self, entry: Entry) -> Child:
        name = key_to_name(entry.key)
        self.hashed.note(entry.key, name)
        return Child(name, ("object", entry.key), entry, cursor=entry.key)

    async def _resolve_key(self, name: bytes) -> str | None:
        try:
            parsed = parse_name(name)
        except InvalidName:
            return None
        key = self.hashed.get(parsed)
        if key is None and parsed.digest is not None:
            key = await self.source.find_hashed(parsed)
        # The name must be exactly the key's own name (one name per key).
        if key is None or key_to_name(key) != name:
            return None
        return key

    async def _node_named(self, name: bytes, suffix: bytes = b"") -> str | None:
        if not name.endswith(suffix):
            return None
        try:
            node = parse_name(name[:len(name) - len(suffix)]).key
        except InvalidName:
            return None
        return node if node in await self.source.nodes() else None

    async def lookup(self, parent: Identity, name: bytes) -> Child | None:
        """The entry ``name`` in the directory ``parent``, or None."""
        kind = parent[0]
        if kind == "root":
            wanted = {b"keys": KEYS, b"stats": STATS}
            if self.source.has_nodes:
                wanted[b"nodes"] = NODES
            return Child(name, wanted[name]) if name in wanted else None
        if kind in ("keys", "tier"):
            key = await self._resolve_key(name)
            entry = None if key is None else await self.source.stat(key)
            if entry is None:
                return None
            if kind == "tier" and entry.places is not None and \
                    (parent[1], parent[2]) not in entry.places:
                return None
            return self.object_child(entry)
        if kind == "nodes":
            node = await self._node_named(name)
            return None if node is None else Child(name, ("node", node))
        if kind == "node":
            tier = name.decode("ascii", "replace")
            return Child(name, ("tier", parent[1], tier)) if tier in TIERS else None
        if kind == "stats":
            if name == b"nodes" and self.source.has_nodes:
                return Child(name, STATS_NODES)
            doc = name.decode("utf-8", "replace")
            return Child(name, ("doc", doc)) if doc in self.source.stats_names else None
        if kind == "stats-nodes":
            node = await self._node_named(name, b".json")
            return None if node is None else Child(name, ("node-doc", node))
        return None

    # -- listings ----------------------------------------------------------------------

    def resumable(self, directory: Identity) -> bool:
        """Whether :meth:`children` of ``directory`` resumes after a cursor."""
        return directory[0] in ("keys", "tier") and self.source.resumable

    async def children(self, directory: Identity,
                       after: str | None = None) -> AsyncIterator[Child]:
        """The entries of ``directory`` in listing order (after ``after``, a cursor, when
        :meth:`resumable`). Object listings stream a page at a time."""
        kind = directory[0]
        if kind in ("keys", "tier"):
            scope = {} if kind == "keys" else {"node": directory[1], "tier": directory[2]}
            entries = self.source.entries(after, **scope)
            try:
                async for entry in entries:
                    yield self.object_child(entry)
            finally:
                await entries.aclose()
            return
        for child in await self._small_listing(directory):
            yield child

    async def _small_listing(self, directory: Identity) -> list[Child]:
        kind = directory[0]
        if kind == "root":
            names = [(b"keys", KEYS)]
            if self.source.has_nodes:
                names.append((b"nodes", NODES))
            names.append((b"stats", STATS))
            return [Child(n, i) for n, i in names]
        if kind == "nodes":
            return [Child(key_to_name(n), ("node", n)) for n in await self.source.nodes()]
        if kind == "node":
            return [Child(t.encode(), ("tier", directory[1], t)) for t in TIERS]
        if kind == "stats":
            out = [Child(n.encode(), ("doc", n)) for n in self.source.stats_names]
            if self.source.has_nodes:
                out.append(Child(b"nodes", STATS_NODES))
            return out
        if kind == "stats-nodes":
            return [Child(key_to_name(n) + b".json", ("node-doc", n))
                    for n in await self.source.nodes()]
        return []

    # -- current state -----------------------------------------------------------------

    async def current(self, identity: Identity) -> Entry | bool | None:
        """For ``getattr``: an object's entry now (None if it is gone); True for any
        other entry that exists."""
        if is_object(identity):
            return await self.source.stat(identity[1])
        return True

    async def document(self, identity: Identity) -> object:
        """The JSON-able content of a statistics file, or None if it no longer exists."""
        if identity[0] == "doc":
            return await self.source.stats_document(identity[1])
        if identity[0] == "node-doc":
            return await self.source.node_document(identity[1])
        raise ValueError(f"{identity!r} is not a statistics file")
