"""The messages of a node's data server: how bytes get in and out of a node.

A put's values travel as the request's payload, back to back in key order; a get's as
the reply's payload, one item per key whose size is not negative. Which op carries which
message is in :mod:`kvstored.protocol.ops`.
"""

from __future__ import annotations

from dataclasses import field
from typing import Annotated

from kvstored.protocol.enums import PutStatus
from kvstored.protocol.messages import Message, message
from kvstored.protocol.shapes import Checksums, Int, Keys, List, Opt, Sizes

WantedVersions = Annotated[list[int | None] | None, Opt(List(Opt(Int(0, 2**32 - 1))))]


@message
class PutRequest(Message):
    """Objects to store (``put``, with the values as payload) or to make room for
    (``alloc``, for a same-host client that copies them into the segment itself)."""

    SAME_LENGTH = ("keys", "sizes", "checksums")

    keys: Keys
    sizes: Sizes
    checksums: Checksums


@message
class PutReply(Message):
    """Per key what the node did (``put`` and ``seal``)."""

    results: list[PutStatus]
    #: Why there was no room, when some result is NO_SPACE.
    no_space: str | None = None


@message
class AllocReply(Message):
    #: Per key, where to copy it in the segment; None: no room (or a put of it is in
    #: flight here).
    offsets: list[int | None]
    no_space: str | None = None


@message
class GetRequest(Message):
    SAME_LENGTH = ("keys", "checksums")

    keys: Keys
    #: The version wanted, per key (the master's checksum): a node never serves another
    #: version of a key (one removed and written again) in its place. None: any.
    checksums: WantedVersions = None


@message
class GetReply(Message):
    """Per key the size of its item in the payload; a negative size (see
    :class:`kvstored.sdk.ReadStatus`) means no item: the node does not have it."""

    sizes: list[int]
    #: The indexes of the items read from the node's SSD tier; the others came from DRAM.
    from_ssd: Sizes = field(default_factory=list)


@message
class ReportCorruptRequest(Message):
    SAME_LENGTH = ("keys", "checksums")

    keys: Keys
    #: The checksum each copy failed.
    checksums: Checksums


@message
class ReportCorruptReply(Message):
    #: Per key, whether this node's copy was bad (and is dropped now).
    corrupt: list[bool]


@message
class DramLocation(Message):
    segment: str
    offset: int
    size: int


@message
class SsdLocation(Message):
    path: str
    offset: int
    length: int
    record_offset: int | None = None
    #: ``path`` is a block device, not a file.
    device: bool = False


@message
class Location(Message):
    """Where one key's bytes are on a node (for debugging)."""

    dram: DramLocation | None = None
    ssd: SsdLocation | None = None


@message
class LocateReply(Message):
    locations: list[Location]

