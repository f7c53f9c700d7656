"""Where a mount's entries come from: the contract both sources keep.

:class:`~kvstored.fuse.live.LiveSource` answers from a running cluster (the master's
``list``, ``stat`` and ``status`` ops, reads through the client library);
:class:`~kvstored.fuse.offline.OfflineSource` answers from a backend directory opened
without a daemon. The FUSE layer (:mod:`kvstored.fuse.ops`, :mod:`kvstored.fuse.tree`)
sees only this contract. Every method is a trio coroutine; blocking work runs in worker
threads, so one slow request never stalls the others.

Errors are mapped here, once, into the core's (:mod:`kvstored.errors`): whatever a
source calls (the client library, a backend, the file system), its methods raise
:class:`~kvstored.errors.NotFoundError` for an object that is not there,
:class:`~kvstored.errors.CorruptDataError` for bytes that failed their checksum, another
:class:`~kvstored.errors.StoreError` for anything else that went wrong (an unreachable
cluster, an I/O error), and ``KeyError`` for an attribute or statistics name they do not
have. The FUSE handlers catch that one family.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import trio

from kvstored.errors import CorruptDataError, NotFoundError, StoreError
from kvstored.fuse.names import ParsedName
from kvstored.sdk.errors import BackendError, CorruptionError, MissingStoreError

T = TypeVar("T")

#: Objects fetched per request while listing (the master's ``list`` page size).
PAGE = 1000

TIERS = ("dram", "ssd")


@dataclass(frozen=True, slots=True)
class Entry:
    """One object as a listing or a stat shows it."""

    key: str
    size: int
    #: Seconds since the epoch it was written, when the source knows it.
    mtime: float | None = None
    #: CRC-32C of the value, when the source knows it (a stat does; a listing not).
    checksum: int | None = None
    #: ``(node, tier)`` of each complete replica, when the source knows them.
    places: frozenset[tuple[str, str]] | None = None


@dataclass(frozen=True, slots=True)
class Space:
    """What ``statfs`` (``df``) shows."""

    capacity_bytes: int
    used_bytes: int
    objects: int


def as_store_error(exc: BackendError | OSError) -> StoreError:
    """The core's error for what a backend or the file system raised."""
    if isinstance(exc, CorruptionError):
        return CorruptDataError(str(exc))
    if isinstance(exc, MissingStoreError | FileNotFoundError):
        return NotFoundError(str(exc))
    return StoreError(str(exc))


class Source(abc.ABC):
    """The objects, statistics and attributes a mount shows."""

    #: Whether the mount has /nodes and /stats/nodes (a cluster does, a directory not).
    has_nodes: bool = False
    #: Whether :meth:`entries` resumes after a key (a sorted listing); if not, a
    #: directory read resumed at an old offset is listed again from the start.
    resumable: bool = False
    #: Names of the JSON files in /stats.
    stats_names: tuple[str, ...] = ()

    def __init__(self, threads: int = 8) -> None:
        self._limiter = trio.CapacityLimiter(threads)

    async def _blocking(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a blocking call in a worker thread (at most ``threads`` at once); what it
        raises comes out as the core's errors (see the module docstring)."""
        try:
            return await trio.to_thread.run_sync(fn, *args, limiter=self._limiter)
        except (BackendError, OSError) as exc:
            raise as_store_error(exc) from exc

    @abc.abstractmethod
    def entries(self, after: str | None = None, *, node: str | None = None,
                tier: str | None = None) -> AsyncIterator[Entry]:
        """Every object (or those with a replica on ``node`` in ``tier``), a page at a
        time; after the key ``after`` when the source is :attr:`resumable`."""

    @abc.abstractmethod
    async def stat(self, key: str) -> Entry | None:
        """The object now, or None if it is not there."""

    @abc.abstractmethod
    async def read_into(self, key: str, buffer: bytearray) -> int:
        """Read the whole value into ``buffer`` (at least its size); its length.
        Raises NotFoundError or CorruptDataError."""

    @abc.abstractmethod
    def xattr_names(self) -> tuple[str, ...]:
        """The extended attributes every object file has (without the ``user.`` part)."""

    @abc.abstractmethod
    async def xattr(self, key: str, name: str) -> bytes:
        """One attribute of ``key``. Raises NotFoundError, or KeyError for a name not in
        :meth:`xattr_names`."""

    @abc.abstractmethod
    async def find_hashed(self, parsed: ParsedName) -> str | None:
        """The key behind a hashed name that is not in the recent-names table."""

    @abc.abstractmethod
    async def stats_document(self, name: str) -> Any:
        """The JSON-able content of /stats/``name``."""

    @abc.abstractmethod
    async def space(self) -> Space:
        """Capacity and use, for ``statfs``."""

    async def nodes(self) -> list[str]:
        """The cluster's nodes (only when :attr:`has_nodes`)."""
        return []

    async def node_document(self, node: str) -> Any:
        """The JSON-able content of /stats/nodes/``node``.json; None for no such node."""
        return None

    @abc.abstractmethod
    async def aclose(self) -> None:
        """Release the connection or the backend."""
