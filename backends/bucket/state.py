"""The in-memory picture of a bucket store: buckets and the record slots they hold.

The backend keeps one :class:`Slot` per record of every loaded bucket, and a key map
from each visible key to its slot. A bucket's slots mirror its index file exactly, so
rewriting the index (after a delete or a quarantine) is a matter of re-encoding them.
Everything here is guarded by the backend's lock; the classes hold no locks of their
own except :attr:`Bucket.meta_lock`, which serialises rewrites of one index file.
"""

from __future__ import annotations

import os
import threading

from kvstored.backends.bucket.index import (
    FLAGS_GONE,
    IndexEntry,
    encode_index,
    index_size,
)
from kvstored.backends.bucket.layout import data_name, index_name, tmp_index_name
from kvstored.native import IoFile
from kvstored.sdk.record import VALUE_OFFSET, record_size
from kvstored.sdk.types import Location


class Slot:
    """One record in a bucket's data file, and whether its key is still visible."""

    __slots__ = ("bucket", "checksum", "flags", "key", "offset", "seq", "size", "write_ns")

    def __init__(self, bucket: Bucket, key: str, offset: int, size: int, seq: int,
                 write_ns: int, checksum: int, flags: int = 0) -> None:
        self.bucket = bucket
        self.key = key
        self.offset = offset
        self.size = size
        self.seq = seq
        self.write_ns = write_ns
        #: CRC-32C of the value.
        self.checksum = checksum
        self.flags = flags

    @property
    def live(self) -> bool:
        return not self.flags & FLAGS_GONE

    @property
    def length(self) -> int:
        """Bytes of the whole record: header block, value and padding."""
        return record_size(self.size)

    def entry(self) -> IndexEntry:
        return IndexEntry(self.key, self.offset, self.size, self.seq, self.write_ns,
                          self.checksum, self.flags)

    def location(self) -> Location:
        return Location(self.bucket.data_path, self.offset + VALUE_OFFSET, self.size,
                        self.offset, self.length)


class Bucket:
    """A data file and its index: records written together and evicted together."""

    __slots__ = ("created_ns", "data_len", "data_path", "directory", "file", "files_gone",
                 "id", "index_path", "live", "logical", "meta_lock", "physical", "readers",
                 "retired", "slots")

    def __init__(self, directory: str, bucket_id: int, data_len: int,
                 created_ns: int) -> None:
        self.directory = directory
        self.id = bucket_id
        self.data_path = os.path.join(directory, data_name(bucket_id))
        self.index_path = os.path.join(directory, index_name(bucket_id))
        self.data_len = data_len
        self.created_ns = created_ns
        self.slots: list[Slot] = []
        #: Visible keys, and the sum of their value sizes.
        self.live = 0
        self.logical = 0
        #: Bytes on disk (st_blocks) of the data file plus the index file.
        self.physical = 0
        #: Reads (and checks) in progress: eviction skips the bucket, and its cached file
        #: is not closed and its space not counted free until they end.
        self.readers = 0
        #: An open read handle, cached by the backend (see ``BucketBackend._file_of``).
        self.file: IoFile | None = None
        #: Taken while the index file is rewritten or the bucket's files are removed.
        self.meta_lock = threading.Lock()
        #: No longer part of the store (evicted, or every key deleted).
        self.retired = False
        #: Its files are unlinked, durably; an index rewrite must not bring them back.
        self.files_gone = False

    @property
    def tmp_index_name(self) -> str:
        return tmp_index_name(self.id)

    @property
    def index_name(self) -> str:
        return index_name(self.id)

    def add(self, slot: Slot) -> None:
        self.slots.append(slot)
        if slot.live:
            self.live += 1
            self.logical += slot.size

    def forget(self, slot: Slot, flag: int) -> None:
        """Mark ``slot`` gone (deleted or quarantined); it stays in the index, flagged."""
        if slot.live:
            self.live -= 1
            self.logical -= slot.size
        slot.flags |= flag

    def live_slots(self) -> list[Slot]:
        return [slot for slot in self.slots if slot.live]

    def index_bytes(self) -> bytes:
        return encode_index(self.id, self.data_len, self.created_ns,
                            [slot.entry() for slot in self.slots])

    def index_length(self) -> int:
        return index_size(len(self.slots), sum(len(s.key.encode()) for s in self.slots))

    def __repr__(self) -> str:
        return (f"<Bucket {self.id:016x}: {self.live}/{len(self.slots)} live, "
                f"{self.data_len} bytes>")
