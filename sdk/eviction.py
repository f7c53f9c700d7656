"""Eviction policies: which objects (or buckets, or shards) a full backend removes first.

One table, :data:`EVICTION_POLICY`, says what each policy does; :class:`EvictionOrder`
keeps a backend's items in the order its policy evicts them, so that no backend decides
"is this LRU?" on its own. A backend takes the policy as its ``policy`` option, typed
:class:`EvictionPolicy` (the command line's ``policy=lru`` is parsed to it by the
registry, and the text ``"lru"`` is accepted from Python too).

What an item is depends on the backend: a key (file-per-key, offset), a bucket id
(bucket), a shard number (3fs). The order itself lives in memory only: after a reopen,
LRU starts again from write order.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from collections.abc import ItemsView, Iterator, ValuesView
from dataclasses import dataclass
from typing import Generic, TypeVar

from kvstored.sdk.errors import InvalidRequestError


class EvictionPolicy(enum.Enum):
    """The ``policy`` option of the built-in backends."""

    FIFO = "fifo"
    LRU = "lru"

    @classmethod
    def parse(cls, value: EvictionPolicy | str) -> EvictionPolicy:
        """The policy named by ``value``; InvalidRequestError names the choices."""
        try:
            return cls(value.lower() if isinstance(value, str) else value)
        except ValueError:
            raise InvalidRequestError(
                f"policy must be one of {', '.join(p.value for p in cls)}, not {value!r}"
            ) from None

    @property
    def rule(self) -> PolicyRule:
        return EVICTION_POLICY[self]


@dataclass(frozen=True, slots=True)
class PolicyRule:
    """What one policy does."""

    #: Which item goes first, in words (for docs and messages).
    evicts_first: str
    #: Whether reading an item sends it to the back of the line.
    moves_on_read: bool


#: Every policy, and what it does: the one place the difference between them is written.
EVICTION_POLICY: dict[EvictionPolicy, PolicyRule] = {
    EvictionPolicy.FIFO: PolicyRule("the oldest written", moves_on_read=False),
    EvictionPolicy.LRU: PolicyRule("the least recently read or written", moves_on_read=True),
}

K = TypeVar("K")
V = TypeVar("V")


class EvictionOrder(Generic[K, V]):
    """Items, each with a value (its entry, its bucket, or None), in the order eviction
    takes them: the first is evicted first. New items join at the back; under a policy
    whose rule moves items on read, :meth:`touch` sends an item to the back again.

    Not thread-safe: its owner guards it with the lock that guards its index.
    """

    def __init__(self, policy: EvictionPolicy | str) -> None:
        self.policy = EvictionPolicy.parse(policy)
        self._moves_on_read = self.policy.rule.moves_on_read
        self._items: OrderedDict[K, V] = OrderedDict()

    def add(self, item: K, value: V) -> None:
        """Put ``item`` at the back of the line (newly written)."""
        self._items[item] = value
        self._items.move_to_end(item)

    @property
    def moves_on_read(self) -> bool:
        """Whether :meth:`touch` does anything (a read path may skip calling it)."""
        return self._moves_on_read

    def touch(self, item: K) -> None:
        """``item`` was read: move it to the back if the policy says so."""
        if self._moves_on_read and item in self._items:
            self._items.move_to_end(item)

    def discard(self, item: K) -> V | None:
        """Take ``item`` out of the line (evicted, deleted); its value, or None."""
        return self._items.pop(item, None)

    def get(self, item: K) -> V | None:
        return self._items.get(item)

    def values(self) -> ValuesView[V]:
        """The items' values, first to be evicted first (a live view: do not change the
        order while going through it)."""
        return self._items.values()

    def items(self) -> ItemsView[K, V]:
        """``(item, value)`` pairs, first to be evicted first (a live view)."""
        return self._items.items()

    def clear(self) -> None:
        self._items.clear()

    def __iter__(self) -> Iterator[K]:
        return iter(self._items)

    def __contains__(self, item: object) -> bool:
        return item in self._items

    def __len__(self) -> int:
        return len(self._items)
