"""Where a bucket store keeps its files, and how to tell them apart.

::

    KVSTORED-BACKEND.json            the stamp: {"backend": "bucket", "layout": 1}
    KVSTORED-LOCK                    flock'd while the store is open (kvstored.sdk.lock)
    buckets/<id>.data                a bucket's records, back to back
    buckets/<id>.idx                 its index (backends/bucket/index.py)
    buckets/.<id>.idx.tmp            an index being written
    quarantine/                      what check(repair=True) and recovery moved aside

``<id>`` is the bucket's sequence number as 16 lower-case hex digits, so that names sort
in write order. Names are made only from numbers: no key ever becomes part of a path.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

LAYOUT_VERSION = 1
BUCKETS_DIR = "buckets"
QUARANTINE_DIR = "quarantine"

_NAME = re.compile(r"^(\.)?([0-9a-f]{16})\.(data|idx)(\.tmp)?$")


def data_name(bucket_id: int) -> str:
    return f"{bucket_id:016x}.data"


def index_name(bucket_id: int) -> str:
    return f"{bucket_id:016x}.idx"


def tmp_index_name(bucket_id: int) -> str:
    return f".{bucket_id:016x}.idx.tmp"


@dataclass
class Listing:
    """The files of a ``buckets/`` folder, sorted by kind. Values are ``os.DirEntry``."""

    data: dict[int, os.DirEntry] = field(default_factory=dict)
    index: dict[int, os.DirEntry] = field(default_factory=dict)
    #: Temporary index files: ``(bucket id, entry)``.
    tmp: list[tuple[int, os.DirEntry]] = field(default_factory=list)
    #: Anything else: kvstored did not write it.
    unknown: list[os.DirEntry] = field(default_factory=list)

    @property
    def highest_id(self) -> int:
        ids = [*self.data, *self.index, *(i for i, _ in self.tmp)]
        return max(ids, default=0)


def list_buckets(directory: str) -> Listing:
    """Classify the entries of ``directory`` (one ``scandir``, no ``stat``)."""
    listing = Listing()
    with os.scandir(directory) as entries:
        for entry in entries:
            match = _NAME.match(entry.name)
            hidden, hex_id, kind, tmp = match.groups() if match else (None, None, None, None)
            if match is None or bool(hidden) != bool(tmp) or (tmp and kind != "idx"):
                listing.unknown.append(entry)
                continue
            bucket_id = int(hex_id, 16)
            if tmp:
                listing.tmp.append((bucket_id, entry))
            elif kind == "data":
                listing.data[bucket_id] = entry
            else:
                listing.index[bucket_id] = entry
    return listing
