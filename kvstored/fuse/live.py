"""The live source: a running cluster, through the blocking client library.

Nothing is cached here: objects are immutable, but a removed key must vanish, so every
stat, listing page and read asks the cluster. The kernel caches what it may (attributes
for a second, pages of unchanged objects; see :mod:`kvstored.fuse.ops`).
"""

from __future__ import annotations

import functools
import json
from collections.abc import AsyncIterator
from typing import Any

from kvstored.client import Client
from kvstored.errors import NotFoundError
from kvstored.fuse.names import ParsedName, digest
from kvstored.fuse.sources import PAGE, Entry, Source, Space
from kvstored.protocol import ReplicaState, Tier

_XATTRS = ("key", "tier", "size", "checksum", "replicas", "location", "reads")


class LiveSource(Source):
    """Objects, nodes and statistics of the cluster whose master is at ``master``."""

    has_nodes = True
    resumable = True
    stats_names = ("cluster.json",)

    def __init__(self, client: Client, *, threads: int = 8) -> None:
        super().__init__(threads)
        self.client = client

    async def _call(self, op: str, **args: Any) -> dict[str, Any]:
        return await self._blocking(functools.partial(self.client.call, op, **args))

    # -- objects -----------------------------------------------------------------------

    async def entries(self, after: str | None = None, *, node: str | None = None,
                      tier: str | None = None) -> AsyncIterator[Entry]:
        cursor = after
        while True:
            reply = await self._call("list", prefix="", after=cursor, limit=PAGE,
                                     node=node, tier=tier)
            for key, size in zip(reply["keys"], reply["sizes"]):
                yield Entry(key, size)
            if not reply["more"]:
                return
            # A filtered page may hold no object yet have more to come: the master says
            # where it stopped looking.
            cursor = reply.get("after") or reply["keys"][-1]

    async def _stat(self, key: str) -> dict[str, Any]:
        return (await self._call("stat", key=key))["object"]

    async def stat(self, key: str) -> Entry | None:
        try:
            obj = await self._stat(key)
        except NotFoundError:
            return None
        places = frozenset((r["node"], r["tier"]) for r in obj["replicas"]
                           if r["state"] == ReplicaState.COMPLETE)
        if not places:
            return None
        return Entry(key, obj["size"], checksum=obj["checksum"], places=places)

    async def read_into(self, key: str, buffer: bytearray) -> int:
        # A checksum failure is a miss in the cluster (the node quarantines the record),
        # so a corrupt object reads as gone, never as bad bytes.
        size = await self._blocking(self.client.get_into, key, buffer)
        if size < 0:
            raise NotFoundError("no object", key=key)
        return size

    # -- attributes --------------------------------------------------------------------

    def xattr_names(self) -> tuple[str, ...]:
        return _XATTRS

    async def xattr(self, key: str, name: str) -> bytes:
        if name not in _XATTRS:
            raise KeyError(name)
        if name == "key":
            return key.encode("utf-8")
        if name == "location":
            where = await self._blocking(self.client.locate, key)
            if not where:
                raise NotFoundError("no object", key=key)
            return _json(where)
        obj = await self._stat(key)
        complete = [r for r in obj["replicas"] if r["state"] == ReplicaState.COMPLETE]
        if name == "tier":
            tiers = sorted({r["tier"] for r in complete}, key=list(Tier).index)
            return ",".join(tiers).encode()
        if name == "size":
            return str(obj["size"]).encode()
        if name == "checksum":
            return f"{obj['checksum']:08x}".encode()
        if name == "reads":
            return str(obj["reads"]).encode()
        return _json([{"node": r["node"], "tier": r["tier"], "state": r["state"]}
                      for r in obj["replicas"]])

    async def find_hashed(self, parsed: ParsedName) -> str | None:
        # The readable part of a hashed name is a prefix of its key: list just those.
        after = None
        while True:
            reply = await self._call("list", prefix=parsed.prefix, after=after, limit=PAGE)
            for key in reply["keys"]:
                if digest(key) == parsed.digest:
                    return key
            if not reply["more"] or not reply["keys"]:
                return None
            after = reply["keys"][-1]

    # -- cluster -----------------------------------------------------------------------

    async def _status(self) -> dict[str, Any]:
        reply = await self._call("status")
        reply.pop("ok", None)
        return reply

    async def nodes(self) -> list[str]:
        return sorted(n["node"] for n in (await self._status())["nodes"])

    async def stats_document(self, name: str) -> Any:
        if name != "cluster.json":
            raise KeyError(name)
        return await self._status()

    async def node_document(self, node: str) -> Any:
        for entry in (await self._status())["nodes"]:
            if entry["node"] == node:
                return entry
        return None

    async def space(self) -> Space:
        status = await self._status()
        tiers = status["tiers"].values()
        return Space(sum(t["capacity_bytes"] for t in tiers),
                     sum(t["used_bytes"] for t in tiers), status["objects"])

    async def aclose(self) -> None:
        self.client.close()


def _json(document: Any) -> bytes:
    return json.dumps(document, sort_keys=True).encode()
