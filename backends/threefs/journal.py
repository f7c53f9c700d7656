"""The per-node journal of the ``3fs`` backend: which records of a node's shards are live.

Each node appends to ``<cluster>/<node>/journal.kvj`` and nothing else does; every other
node reads it to find that node's objects. It is an index, kept as a log so that a
reader on another machine can follow it by reading only the bytes appended since its last
look. The records themselves (sdk/record.py) stay in the shard files.

Layout (all integers little-endian)::

    header (32 bytes)
    0   4  magic        b"KV3J"
    4   2  version      JOURNAL_VERSION (1)
    6   2  reserved     0
    8   8  generation   bumped by every rewrite (compaction, repair)
    16  8  seq_floor    every sequence number this node uses from now on is larger
    24  4  shard_floor  every shard number this node creates from now on is larger
    28  4  header_crc   CRC-32C of bytes 0..27

    entry (56 bytes + key), repeated to the end of the file
    0   4  magic        b"KV3E"
    4   4  crc          CRC-32C of bytes 8 .. 56 + key_len
    8   1  kind         1 PUT, 2 DELETE, 3 SHARD_OPEN, 4 SHARD_DROP
    9   1  reserved     0
    10  2  key_len      0 for the shard kinds
    12  4  shard        the shard file number (PUT, SHARD_*)
    16  8  seq          the node's sequence number of this change
    24  8  offset       PUT: where the record starts in the shard
    32  8  value_len    PUT: the value's length
    40  8  write_ns     PUT: the record's write time
    48  4  value_crc    PUT: CRC-32C of the value
    52  4  reserved     0
    56  k  key          UTF-8 (PUT, DELETE)

Entries are appended in one ``pwrite`` per batch and fsync'd before the batch is
acknowledged. For any one key the file order is the order of its changes (a delete is
appended only after the put it deletes was, a re-put only after the delete), so replaying
in file order needs no sort.

A reader parses until the first entry that fails (:func:`parse`). If nothing valid follows,
that is the tail of an append in progress or torn by a crash, and the reader stops there.
If a valid entry follows, the bytes in between are damaged; the reader skips them and
reports the range, so one bad sector does not hide the rest of the index.
"""

from __future__ import annotations

import enum
import errno
import os
import struct
import threading
from dataclasses import dataclass
from pathlib import Path

from crc32c import crc32c

from kvstored.sdk.files import fsync_dir, write_all, write_atomically

JOURNAL_NAME = "journal.kvj"
JOURNAL_VERSION = 1
HEADER = struct.Struct("<4sHHQQI")
HEADER_CRC = struct.Struct("<I")
HEADER_SIZE = HEADER.size + HEADER_CRC.size  # 32
HEADER_MAGIC = b"KV3J"
ENTRY = struct.Struct("<4sIBBHIQQQQII")
ENTRY_SIZE = ENTRY.size  # 56
ENTRY_MAGIC = b"KV3E"
_CRC_FROM = 8  # the entry CRC covers everything after the magic and the CRC itself
assert HEADER_SIZE == 32 and ENTRY_SIZE == 56


class Kind(enum.IntEnum):
    PUT = 1
    DELETE = 2
    #: A shard file is about to be created; journaled first, so that every shard file
    #: kvstored made is named here and a file that is not is someone else's.
    SHARD_OPEN = 3
    #: A shard was evicted or emptied: none of its records are live any more.
    SHARD_DROP = 4


@dataclass(frozen=True, slots=True)
class Entry:
    kind: Kind
    key: str = ""
    shard: int = 0
    seq: int = 0
    offset: int = 0
    value_len: int = 0
    write_ns: int = 0
    value_crc: int = 0

    def encode(self) -> bytes:
        key = self.key.encode("utf-8")
        body = ENTRY.pack(ENTRY_MAGIC, 0, self.kind, 0, len(key), self.shard, self.seq,
                          self.offset, self.value_len, self.write_ns, self.value_crc, 0)
        crc = crc32c(key, crc32c(memoryview(body)[_CRC_FROM:]))
        return body[:4] + crc.to_bytes(4, "little") + body[8:] + key


def entry_size(key: str) -> int:
    """Bytes one entry about ``key`` takes (``""`` for the shard kinds)."""
    return ENTRY_SIZE + len(key.encode("utf-8"))


@dataclass(frozen=True, slots=True)
class Header:
    generation: int
    seq_floor: int
    shard_floor: int

    def encode(self) -> bytes:
        body = HEADER.pack(HEADER_MAGIC, JOURNAL_VERSION, 0, self.generation, self.seq_floor,
                           self.shard_floor)
        return body + HEADER_CRC.pack(crc32c(body))


class JournalFormatError(ValueError):
    """The journal header is not one this kvstored can read (message says why)."""


def decode_header(block: bytes | memoryview) -> Header:
    """Parse the 32-byte header; raise :class:`JournalFormatError` when it is not valid."""
    if len(block) < HEADER_SIZE:
        raise JournalFormatError(f"the journal header is truncated ({len(block)} bytes)")
    magic, version, _reserved, generation, seq_floor, shard_floor = HEADER.unpack_from(block)
    if magic != HEADER_MAGIC:
        raise JournalFormatError(f"bad journal magic {magic!r}")
    (stored,) = HEADER_CRC.unpack_from(block, HEADER.size)
    if stored != crc32c(memoryview(block)[:HEADER.size]):
        raise JournalFormatError("the journal header fails its checksum")
    if version != JOURNAL_VERSION:
        raise JournalFormatError(f"journal format version {version}; this kvstored reads "
                                 f"version {JOURNAL_VERSION}: upgrade kvstored to read it")
    return Header(generation, seq_floor, shard_floor)


def _entry_at(data: memoryview, pos: int) -> tuple[Entry, int] | None:
    """The valid entry starting at ``pos`` and its end, or None."""
    if pos + ENTRY_SIZE > len(data) or data[pos:pos + 4] != ENTRY_MAGIC:
        return None
    (_magic, crc, kind, _r1, key_len, shard, seq, offset, value_len, write_ns, value_crc,
     _r2) = ENTRY.unpack_from(data, pos)
    end = pos + ENTRY_SIZE + key_len
    if end > len(data) or crc != crc32c(data[pos + _CRC_FROM:end]):
        return None
    try:
        kind = Kind(kind)
        key = bytes(data[pos + ENTRY_SIZE:end]).decode("utf-8")
    except (ValueError, UnicodeDecodeError):
        return None  # a valid checksum over nonsense: treat it as damage
    if (kind in (Kind.PUT, Kind.DELETE)) != bool(key):
        return None
    return Entry(kind, key, shard, seq, offset, value_len, write_ns, value_crc), end


@dataclass
class Parsed:
    entries: list[Entry]
    #: The file offset where parsing stopped: everything before it is consumed; a torn
    #: or in-progress tail, if any, starts here.
    end: int
    #: ``(start, stop)`` file offsets skipped as damaged (valid entries follow them).
    damaged: list[tuple[int, int]]


def parse(data: bytes, base: int = HEADER_SIZE) -> Parsed:
    """Parse the entries in ``data``, which holds the file's bytes from offset ``base``."""
    data = bytes(data)
    view = memoryview(data)
    entries: list[Entry] = []
    damaged: list[tuple[int, int]] = []
    pos = 0
    while pos < len(data):
        found = _entry_at(view, pos)
        if found is not None:
            entries.append(found[0])
            pos = found[1]
            continue
        resume = _next_valid(data, view, pos + 1)
        if resume is None:
            break  # the tail: an append in progress, or one a crash tore
        damaged.append((base + pos, base + resume))
        pos = resume
    return Parsed(entries, base + pos, damaged)


def _next_valid(data: bytes, view: memoryview, pos: int) -> int | None:
    while True:
        pos = data.find(ENTRY_MAGIC, pos)
        if pos < 0:
            return None
        if _entry_at(view, pos) is not None:
            return pos
        pos += 1


def read_file(path: str | os.PathLike, start: int = HEADER_SIZE) -> tuple[Header, int, bytes]:
    """The header, and the bytes from ``start`` (at least HEADER_SIZE) to the end of the
    file with the offset they start at: ``parse(data, base)`` takes them as they come.

    Reads to end of file rather than trusting ``st_size``: on 3FS a file's length as
    another client sees it is updated lazily, so the bytes are the truth.
    """
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        header = decode_header(os.pread(fd, HEADER_SIZE, 0))
        chunks = []
        pos = max(start, HEADER_SIZE)
        while True:
            chunk = os.pread(fd, 4 << 20, pos)
            if not chunk:
                break
            chunks.append(chunk)
            pos += len(chunk)
    finally:
        os.close(fd)
    return header, max(start, HEADER_SIZE), b"".join(chunks)


class JournalWriter:
    """The owning node's handle on its journal: appends and rewrites, each made durable.

    Metadata, not data: it uses plain ``os`` calls. ``fsync`` rather than ``fdatasync``,
    because on 3FS the file length other nodes see is only published by a full sync.
    Thread-safe: appends are serialised, so one append's bytes are never interleaved
    with another's.
    """

    def __init__(self, path: Path, header: Header, size: int, *,
                 read_only: bool = False, fd: int | None = None) -> None:
        self.path = path
        self.header = header
        self.read_only = read_only
        self._lock = threading.Lock()
        self._size = size
        self._fd = fd if fd is not None else os.open(
            path, (os.O_RDONLY if read_only else os.O_RDWR) | os.O_CLOEXEC)

    @classmethod
    def create(cls, path: Path, header: Header) -> JournalWriter:
        write_atomically(path, header.encode(), tmp=_tmp_of(path))
        return cls(path, header, HEADER_SIZE)

    @classmethod
    def empty(cls, path: Path, header: Header) -> JournalWriter:
        """A read-only stand-in for a journal that does not exist (a node that never
        wrote): it holds nothing, takes no space and refuses to be written."""
        return cls(path, header, 0, read_only=True, fd=-1)

    def _check_writable(self) -> None:
        if self.read_only:
            raise OSError(errno.EROFS, f"the journal {self.path} was opened read-only")

    @property
    def size(self) -> int:
        return self._size

    def append(self, entries: list[Entry]) -> None:
        """Append ``entries`` and fsync. On failure the journal is cut back to where it
        was (so a torn entry never hides later ones) and the OSError propagates."""
        if not entries:
            return
        self._check_writable()
        data = b"".join(e.encode() for e in entries)
        with self._lock:
            start = self._size
            try:
                write_all(self._fd, data, start)
                os.fsync(self._fd)
            except OSError:
                try:
                    os.ftruncate(self._fd, start)
                    os.fsync(self._fd)
                except OSError as cut:
                    raise JournalStuckError(self.path, cut) from cut
                raise
            self._size = start + len(data)

    def truncate(self, size: int) -> None:
        """Cut a torn tail off (at open, before anything is appended)."""
        self._check_writable()
        with self._lock:
            os.ftruncate(self._fd, size)
            os.fsync(self._fd)
            self._size = size

    def rewrite(self, header: Header, entries: list[Entry]) -> None:
        """Replace the journal atomically by ``header`` and ``entries`` (compaction).

        Readers that have the old file open keep reading the old contents; the new
        generation in the header tells them to start over.
        """
        self._check_writable()
        data = header.encode() + b"".join(e.encode() for e in entries)
        with self._lock:
            write_atomically(self.path, data, tmp=_tmp_of(self.path))
            fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)
            os.close(self._fd)
            self._fd = fd
            self._size = len(data)
            self.header = header

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


class JournalStuckError(OSError):
    """An append failed and the torn bytes could not be cut off either. The journal may
    end in a partial entry, so nothing more may be appended until the backend is
    reopened (which cuts the tail at open)."""

    def __init__(self, path: Path, cause: OSError) -> None:
        super().__init__(cause.errno, f"the journal {path} could not be repaired after a "
                                      f"failed append ({cause.strerror}); reopen the backend")
        self.filename = str(path)


def _tmp_of(path: Path) -> Path:
    """The one temporary name of a journal rewrite (only its node writes it)."""
    return path.with_name(f".{path.name}.tmp")


def remove_stale_tmp(node_dir: Path) -> bool:
    """Remove a compaction's temporary file left by a crash (the old journal is intact)."""
    tmp = _tmp_of(node_dir / JOURNAL_NAME)
    try:
        tmp.unlink()
    except FileNotFoundError:
        return False
    fsync_dir(node_dir)
    return True
