"""One node's index in the ``3fs`` backend: its journal replayed, and the names of its files.

The owning node and every node that reads it build the same :class:`NodeIndex` by
applying the same journal entries in file order, so what a reader believes about a node
is exactly what that node believes, as of the bytes the reader has seen.
"""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass, field
from pathlib import Path

from kvstored.backends.record import record_size
from kvstored.backends.threefs_journal import Entry, Kind, entry_size
from kvstored.sdk.errors import InvalidRequestError

SHARD_PREFIX = "shard-"
SHARD_SUFFIX = ".dat"
#: Node and cluster names become directory names: keep them to a portable alphabet.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def check_name(kind: str, name: str) -> str:
    """Return ``name`` if it is a usable cluster or node name, else raise a clear error."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise InvalidRequestError(
            f"{kind} {name!r} is not a valid name: use 1 to 128 letters, digits, '.', '_' "
            f"or '-', starting with a letter or digit (it becomes a directory name)")
    return name


def default_node_id() -> str:
    """The host name, which is unique per machine in any sane cluster."""
    name = socket.gethostname() or "localhost"
    try:
        return check_name("node_id", name)
    except InvalidRequestError:
        raise InvalidRequestError(
            f"the host name {name!r} cannot serve as the node id; pass node_id=…") from None


def shard_name(number: int) -> str:
    return f"{SHARD_PREFIX}{number:08d}{SHARD_SUFFIX}"


def shard_number(name: str) -> int | None:
    """The number in a shard file name, or None if ``name`` is not one."""
    if not (name.startswith(SHARD_PREFIX) and name.endswith(SHARD_SUFFIX)):
        return None
    digits = name[len(SHARD_PREFIX):-len(SHARD_SUFFIX)]
    return int(digits) if digits.isdigit() else None


def shard_path(node_dir: Path, number: int) -> Path:
    return node_dir / shard_name(number)


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


@dataclass
class NodeIndex:
    """A node's live objects and shards, built by :meth:`apply`-ing journal entries."""

    objects: dict[str, Slot] = field(default_factory=dict)
    #: Announced, not dropped, shards and the live keys in each.
    shards: dict[int, set[str]] = field(default_factory=dict)
    dropped: set[int] = field(default_factory=set)
    logical_bytes: int = 0
    #: Sum of the journal entry sizes of the live objects: what their put entries take,
    #: and what deleting them all would append.
    key_meta: int = 0
    max_seq: int = 0
    max_shard: int = 0
    #: Entries in the journal that no longer describe anything live (compaction hint).
    dead_entries: int = 0

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
            self.objects[entry.key] = slot
            self.shards.setdefault(entry.shard, set()).add(entry.key)
            self.logical_bytes += slot.size
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
            self._forget(key, self.objects[key])
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
        del self.objects[key]
        keys = self.shards.get(slot.shard)
        if keys is not None:
            keys.discard(key)
        self.logical_bytes -= slot.size
        self.key_meta -= entry_size(key)

    def live_entries(self) -> list[Entry]:
        """The entries a compacted journal needs: every live shard, then every object."""
        out = [Entry(Kind.SHARD_OPEN, shard=n) for n in sorted(self.shards)]
        for key, slot in sorted(self.objects.items(), key=lambda item: item[1].seq):
            out.append(Entry(Kind.PUT, key, slot.shard, slot.seq, slot.offset, slot.size,
                             slot.write_ns, slot.checksum))
        return out
