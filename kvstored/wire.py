"""The wire format shared by the master, the nodes and the clients.

A frame is a fixed prefix, a msgpack header, and an optional raw payload::

    offset  size  field
    0       4     magic        b"KVW1"
    4       4     header_len   u32, at most the receiver's header limit (MAX_HEADER)
    8       8     payload_len  u64, at most the receiver's payload limit
    16      h     header       a msgpack map with str keys
    16+h    p     payload      raw bytes (object values, back to back)

Control data travels in the header; bulk bytes travel as the payload, so a receiver can
``recv_into`` the destination buffer directly instead of copying out of a msgpack
object. A request header holds ``op`` and its arguments; a response header holds
``ok`` and either results or ``error`` (see kvstored.errors).

msgpack is decoded with every length bounded (``max_*_len``) and ``strict_map_key``,
so a hostile peer cannot make a receiver allocate more than the frame it sent, which is
itself bounded: both limits are the receiver's, checked on the prefix before anything
else is read (a server keeps them small until the peer has authenticated). A malformed
frame raises :class:`FrameError`; servers answer it (when they can) and close the
connection.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Sequence
from typing import Any

import msgpack

MAGIC = b"KVW1"
PREFIX = struct.Struct("<4sIQ")
#: Headers carry keys and per-item metadata: a 4096-key batch of 1 KiB keys fits.
MAX_HEADER = 8 * 1024 * 1024
#: Default payload bound for one frame (a batch of values).
DEFAULT_MAX_PAYLOAD = 4 * 1024**3


class FrameError(Exception):
    """The peer sent something that is not a valid frame; close the connection."""


class ConnectionClosed(Exception):
    """The peer closed the connection (cleanly, between frames, or in the middle)."""


def pack_header(header: dict[str, Any], payload_len: int = 0) -> bytes:
    body = msgpack.packb(header, use_bin_type=True)
    if len(body) > MAX_HEADER:
        raise FrameError(f"header of {len(body)} bytes exceeds {MAX_HEADER}; split the batch")
    return PREFIX.pack(MAGIC, len(body), payload_len) + body


def parse_prefix(prefix: bytes, max_payload: int,
                 max_header: int = MAX_HEADER) -> tuple[int, int]:
    """``(header_len, payload_len)`` of a frame's 16-byte prefix, checked against the
    receiver's limits; FrameError for a bad magic, an empty or oversized header, or an
    oversized payload."""
    magic, header_len, payload_len = PREFIX.unpack(prefix)
    if magic != MAGIC:
        raise FrameError(f"bad frame magic {magic!r}: not a kvstored peer")
    if header_len == 0:
        raise FrameError("empty header: a frame header is a msgpack map")
    if header_len > max_header:
        raise FrameError(f"header length {header_len} exceeds {max_header}")
    if payload_len > max_payload:
        raise FrameError(f"payload length {payload_len} exceeds the limit {max_payload}")
    return header_len, payload_len


def unpack_header(body: bytes) -> dict[str, Any]:
    try:
        header = msgpack.unpackb(
            body, raw=False, strict_map_key=True, use_list=True,
            max_str_len=len(body), max_bin_len=len(body), max_array_len=len(body),
            max_map_len=len(body), max_ext_len=0)
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise FrameError(f"undecodable header: {exc}") from None
    if not isinstance(header, dict):
        raise FrameError("a frame header must be a map")
    return header


# -- blocking sockets (the client library) ---------------------------------------------

#: Bytes a connection reads ahead: a whole small response (prefix, header and a small
#: payload) arrives in one system call instead of three.
READ_AHEAD = 64 * 1024


class ReadAhead:
    """The read-ahead buffer of a frame reader, without any I/O (both the blocking
    :class:`FrameReader` and the trio ``FramedSocket`` keep one): bytes received from
    the socket and not yet consumed, between ``_pos`` and ``_end``."""

    def __init__(self, size: int = READ_AHEAD) -> None:
        self._view = memoryview(bytearray(size))
        self._pos = self._end = 0

    @property
    def size(self) -> int:
        """Capacity: the most bytes one ``recv_into`` can bring in."""
        return len(self._view)

    def grow(self, size: int) -> None:
        """Make the capacity ``size`` (if larger), keeping what is buffered. A server
        reads an unauthenticated peer through a small buffer and grows it afterwards."""
        if size <= len(self._view):
            return
        left = self._end - self._pos
        view = memoryview(bytearray(size))
        view[:left] = self._view[self._pos:self._end]
        self._view, self._pos, self._end = view, 0, left

    @property
    def buffered(self) -> int:
        """Bytes received and not yet consumed."""
        return self._end - self._pos

    def room(self) -> memoryview:
        """Where the next ``recv_into`` goes, after moving the unread bytes to the front
        so that the whole buffer can fill."""
        if self._pos:
            left = self._end - self._pos
            self._view[:left] = self._view[self._pos:self._end]
            self._pos, self._end = 0, left
        return self._view[self._end:]

    def received(self, n: int) -> None:
        """``n`` bytes were just received into :meth:`room`."""
        self._end += n

    def consume(self, n: int) -> bytes:
        """The next ``n`` (<= :attr:`buffered`) bytes."""
        data = bytes(self._view[self._pos:self._pos + n])
        self._pos += n
        return data

    def take(self, view: memoryview) -> int:
        """Copy what is buffered, up to ``len(view)``, into ``view``; returns the count."""
        n = min(len(view), self._end - self._pos)
        if n:
            view[:n] = self._view[self._pos:self._pos + n]
            self._pos += n
        return n


def recv_exactly_into(sock: socket.socket, view: memoryview) -> None:
    """Fill ``view`` from ``sock``; ConnectionClosed if the peer goes away first."""
    got = 0
    total = len(view)
    while got < total:
        n = sock.recv_into(view[got:], total - got)
        if n == 0:
            raise ConnectionClosed("the peer closed the connection mid-frame")
        got += n


class FrameReader:
    """Reads frames from a blocking socket through a small read-ahead buffer.

    Large payloads still go straight into the caller's buffer with ``recv_into``; only
    what the read-ahead already holds is copied.
    """

    def __init__(self, sock: socket.socket, max_payload: int = DEFAULT_MAX_PAYLOAD) -> None:
        self.sock = sock
        self.max_payload = max_payload
        self._ahead = ReadAhead()
        #: Unread bytes of the current frame's payload.
        self.payload_left = 0

    def _fill(self, need: int) -> None:
        """Have at least ``need`` (<= the read-ahead's size) bytes buffered."""
        ahead = self._ahead
        while ahead.buffered < need:
            n = self.sock.recv_into(ahead.room())
            if n == 0:
                raise ConnectionClosed("the peer closed the connection mid-frame")
            ahead.received(n)

    def recv_header(self) -> dict[str, Any]:
        """Read the next frame's prefix and header; then read its ``payload_left``."""
        if self.payload_left:
            self.discard_payload()
        self._fill(PREFIX.size)
        header_len, payload_len = parse_prefix(self._ahead.consume(PREFIX.size),
                                               self.max_payload)
        if header_len <= self._ahead.size:
            self._fill(header_len)
            body = self._ahead.consume(header_len)
        else:
            big = memoryview(bytearray(header_len))
            recv_exactly_into(self.sock, big[self._ahead.take(big):])
            body = bytes(big)
        self.payload_left = payload_len
        return unpack_header(body)

    def recv_payload_into(self, view: memoryview) -> None:
        if len(view) > self.payload_left:
            raise FrameError(f"payload is {self.payload_left} bytes, {len(view)} wanted")
        taken = self._ahead.take(view)
        if taken < len(view):
            recv_exactly_into(self.sock, view[taken:])
        self.payload_left -= len(view)

    def discard_payload(self) -> None:
        scratch = memoryview(bytearray(min(self.payload_left, 1 << 20) or 1))
        while self.payload_left:
            self.recv_payload_into(scratch[:min(self.payload_left, len(scratch))])


def recv_header(sock: socket.socket, max_payload: int = DEFAULT_MAX_PAYLOAD
                ) -> tuple[dict[str, Any], int]:
    """Read one frame's prefix and header without read-ahead (nothing of the payload is
    consumed); the caller then reads ``payload_len`` bytes. Prefer :class:`FrameReader`."""
    prefix = bytearray(PREFIX.size)
    recv_exactly_into(sock, memoryview(prefix))
    header_len, payload_len = parse_prefix(bytes(prefix), max_payload)
    body = bytearray(header_len)
    recv_exactly_into(sock, memoryview(body))
    return unpack_header(bytes(body)), payload_len


def send_frame(sock: socket.socket, header: dict[str, Any],
               payload: Sequence[memoryview | bytes | bytearray] = ()) -> None:
    """Send a frame; ``payload`` pieces go out back to back without being joined."""
    views = [memoryview(p).cast("B") for p in payload if len(p)]
    total = sum(v.nbytes for v in views)
    pieces = [memoryview(pack_header(header, total)), *views]
    while pieces:
        sent = sock.sendmsg(pieces[:512])  # IOV_MAX is 1024 on Linux
        while sent:
            if sent >= pieces[0].nbytes:
                sent -= pieces[0].nbytes
                pieces.pop(0)
            else:
                pieces[0] = pieces[0][sent:]
                sent = 0


def discard(sock: socket.socket, nbytes: int) -> None:
    scratch = memoryview(bytearray(min(nbytes, 1 << 20) or 1))
    while nbytes:
        chunk = scratch[:min(nbytes, len(scratch))]
        recv_exactly_into(sock, chunk)
        nbytes -= len(chunk)
