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
from kvstored.protocol.shapes import Checksums, Int, Keys, List, Name, Opt, Size, Sizes

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
    #: The indexes of the items this node would serve to ``get_held`` too (a DRAM copy
    #: a client put here, not revoked): where a client may read them next time without
    #: asking the master first.
    held: Sizes = field(default_factory=list)
    #: A :class:`GetTrailer` frame follows the payload. The node then sent this header
    #: before its SSD reads finished, so that each item goes out as soon as it is read:
    #: ``sizes`` are what it planned to send, and an item whose read failed (a checksum,
    #: a record gone) travels as zeros and is a miss in the trailer.
    trailer: bool = False


@message
class GetTrailer(Message):
    """After a ``get`` reply's payload when the reply says ``trailer``: the final size of
    every item. Each equals the reply's, or is negative (a :class:`kvstored.sdk.
    ReadStatus`) for an item read from SSD whose bytes in the payload are not the
    object's and must not be used."""

    sizes: list[int]


@message
class HeldGetRequest(Message):
    """``get_held``: the keys, each with the version (the object's checksum) the client
    read or wrote before. The node serves a key only from a DRAM copy of that version
    that a client put here and that the master has not revoked (see ``revoke``); any
    other key is answered missing (the client asks the master then)."""

    SAME_LENGTH = ("keys", "checksums")

    keys: Keys
    checksums: Checksums


@message
class RevokeRequest(Message):
    """The master removed these keys: no copy of them this node holds now may be served
    to ``get_held`` again (their bytes stay for leased readers until their drop)."""

    keys: Keys


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



# -- registered host memory (a same-host client's KV pool, moved by the node itself) ------

#: Per key, its pieces in a registered region: ``[offset, length, offset, length, ...]``.
Extents = Annotated[list[list[int]], List(List(Int(0, 2**63 - 1)))]


@message
class RegisterMemoryRequest(Message):
    """A same-host client's shared-memory file (a ``/dev/shm`` file or a memfd), open in
    its process ``pid`` as descriptor ``fd``: the node opens ``/proc/PID/fd/FD`` itself
    and checks it is the file ``device``/``inode`` on tmpfs (or hugetlbfs), and that
    ``pid`` holds this very connection."""

    pid: Annotated[int, Int(1, 2**31 - 1)]
    fd: Annotated[int, Int(0, 2**31 - 1)]
    device: Annotated[int, Int(0, 2**64 - 1)]
    inode: Annotated[int, Int(0, 2**64 - 1)]
    size: Size
    host_id: str


@message
class RegisterMemoryReply(Message):
    #: The region's number on this node, and the secret every copy must name.
    region: int
    token: str


@message
class RegionRequest(Message):
    """Objects to move between a registered region and the segment: ``copy_in`` reads
    each from its extents into the room an ``alloc`` made, checks it and commits it (the
    ``seal`` of the region path); ``copy_out`` writes each DRAM object (of the wanted
    version) to its extents."""

    SAME_LENGTH = ("keys", "extents")

    keys: Keys
    region: Annotated[int, Int(0, 2**31 - 1)]
    token: Annotated[str, Name(64)]
    extents: Extents
    checksums: WantedVersions = None


@message
class CopyOutReply(Message):
    """Per key the bytes written to its extents; a negative size: not in DRAM here (ask
    over TCP)."""

    sizes: list[int]
