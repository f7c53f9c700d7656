"""One node's index in the ``3fs`` backend: its journal replayed, and its shard files.

The owning node and every node that reads it build the same :class:`NodeIndex` by
applying the same journal entries in file order, so what a reader believes about a node
is exactly what that node believes, as of the bytes the reader has seen.
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass
from pathlib import Path

from kvstored.backends.threefs.journal import Entry, Kind, entry_size
from kvstored.backends.threefs.layout import shard_path
from kvstored.sdk.index import ObjectIndex
from kvstored.sdk.record import VALUE_OFFSET, record_size
from kvstored.sdk.types import Location


@dataclass(slots=True)
class Slot:
    """Where one live object's record is: shard file, record offset, and what to expect."""

    shard: int
    offset: int
    size: int
    checksum: int
    seq: int
    write_ns: int

    @property
    def record_end(self) -> int:
        return self.offset + record_size(self.size)


def slot_location(node_dir: Path, slot: Slot) -> Location:
    """Where the record of ``slot``, of the node whose directory is ``node_dir``, is."""
    return Location(str(shard_path(node_dir, slot.shard)), slot.offset + VALUE_OFFSET,
                    slot.size, slot.offset, record_size(slot.size))


class NodeIndex:
    """A node's live objects and shards, built by :meth:`apply`-ing journal entries.

    ``objects`` is an :class:`~kvstored.sdk.index.ObjectIndex` guarded by ``lock`` (the
    owning backend's lock for its own node, a lock of its own for another node's view).
    """

    def __init__(self, node_dir: Path,
                 lock: threading.Lock | threading.RLock | None = None) -> None:
        self.node_dir = node_dir
        self.objects: ObjectIndex[Slot] = ObjectIndex(
            functools.partial(slot_location, node_dir), lock)
        #: Announced, not dropped, shards and the live keys in each.
        self.shards: dict[int, set[str]] = {}
        self.dropped: set[int] = set()
        #: Sum of the journal entry sizes of the live objects: what their put entries
        #: take, and what deleting them all would append.
        self.key_meta = 0
        self.max_seq = 0
        self.max_shard = 0
        #: Entries in the journal that no longer describe anything live (compaction hint).
        self.dead_entries = 0

    def apply(self, entry: Entry) -> list[str]:
        """Apply one entry; return the keys it made invisible (for SHARD_DROP)."""
        self.max_seq = max(self.max_seq, entry.seq)
        kind = entry.kind
        if kind is Kind.PUT:
            self.max_shard = max(self.max_shard, entry.shard)
            if entry.shard in self.dropped:
                self.dead_entries += 1
                return []
            old = self.objects.get(entry.key)
            if old is not None:  # cannot happen in a journal kvstored wrote; stay sane
                self._forget(entry.key, old)
                self.dead_entries += 1
            slot = Slot(entry.shard, entry.offset, entry.value_len, entry.value_crc,
                        entry.seq, entry.write_ns)
            self.objects.add(entry.key, slot)
            self.shards.setdefault(entry.shard, set()).add(entry.key)
            self.key_meta += entry_size(entry.key)
            return []
        if kind is Kind.DELETE:
            old = self.objects.get(entry.key)
            if old is not None and old.seq < entry.seq:
                self._forget(entry.key, old)
                self.dead_entries += 2
            else:
                self.dead_entries += 1
            return []
        if kind is Kind.SHARD_OPEN:
            self.max_shard = max(self.max_shard, entry.shard)
            if entry.shard not in self.dropped:
                self.shards.setdefault(entry.shard, set())
            return []
        # SHARD_DROP
        self.max_shard = max(self.max_shard, entry.shard)
        keys = sorted(self.shards.pop(entry.shard, set()))
        for key in keys:
            slot = self.objects.get(key)
            if slot is not None:
                self._forget(key, slot)
        self.dropped.add(entry.shard)
        self.dead_entries += len(keys) + 2
        return keys

    def remove(self, key: str) -> Slot | None:
        """Forget ``key`` without a journal entry (an object found unreadable at open)."""
        slot = self.objects.get(key)
        if slot is not None:
            self._forget(key, slot)
        return slot

    def _forget(self, key: str, slot: Slot) -> None:
        self.objects.pop(key)
        keys = self.shards.get(slot.shard)
        if keys is not None:
            keys.discard(key)
        self.key_meta -= entry_size(key)

    def live_entries(self) -> list[Entry]:
        """The entries a compacted journal needs: every live shard, then every object."""
        out = [Entry(Kind.SHARD_OPEN, shard=n) for n in sorted(self.shards)]
        for key, slot in sorted(self.objects.items(), key=lambda item: item[1].seq):
            out.append(Entry(Kind.PUT, key, slot.shard, slot.seq, slot.offset, slot.size,
                             slot.write_ns, slot.checksum))
        return out


@dataclass(slots=True)
class Shard:
    """One of this node's shard files, as the writer tracks it."""

    number: int
    path: str
    #: Bytes allocated: the next record goes here.
    end: int
    #: Write batches with records placed here and not yet published.
    inflight: int = 0
    #: Reads in progress: the file must outlive them.
    readers: int = 0
    #: The file was extended to ``shard_bytes`` ahead of the data (see
    #: ``ThreeFsBackend._rotate_locked``) and still has to be cut back to ``end``.
    sized_ahead: bool = False
