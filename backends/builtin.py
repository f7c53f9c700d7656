"""What every built-in backend is, said once: :class:`BuiltinBackend`.

Every built-in backend keeps an in-memory index of its objects (an
:class:`~kvstored.sdk.index.IndexedBackend`), is persistent (an acknowledged object
survives a kill and a reopen), keeps its values 4 KiB-aligned in their files (O_DIRECT
reads need no bounce buffer; docs/format.md), and opens in every :class:`OpenMode`
(read-only for the offline tools, repair for ``kvstore recover --repair``). They differ,
as far as the daemon plans, in two things: what eviction takes at a time, and whether
every node can read their objects (3fs). Each says those two in class attributes.
"""

from __future__ import annotations

from typing import ClassVar

from kvstored.sdk.index import IndexedBackend
from kvstored.sdk.types import Capabilities, EvictionGranularity, OpenMode


class BuiltinBackend(IndexedBackend):
    """The base of the built-in backends: their capabilities, and their open modes."""

    open_modes: ClassVar[frozenset[OpenMode]] = frozenset(OpenMode)
    #: What eviction takes at a time.
    eviction_granularity: ClassVar[EvictionGranularity]
    #: Every node reads every object directly (a shared file system).
    shared_by_nodes: ClassVar[bool] = False

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(shared=self.shared_by_nodes, eviction=self.eviction_granularity,
                            aligned_values=True, persistent=True,
                            max_value_size=self.max_value_size,
                            read_only_open=OpenMode.READ_ONLY in self.open_modes)
