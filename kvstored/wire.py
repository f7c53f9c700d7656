"""The wire format shared by the master, the nodes and the clients, and its one codec.

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
``ok`` and either results or ``error`` (see kvstored.errors and kvstored.protocol).

msgpack is decoded with every length bounded (``max_*_len``) and ``strict_map_key``,
so a hostile peer cannot make a receiver allocate more than the frame it sent, which is
itself bounded: both limits are the receiver's, checked on the prefix before anything
else is read (a server keeps them small until the peer has authenticated). A malformed
frame raises :class:`FrameError`; servers answer it (when they can) and close the
connection.

The codec does no I/O. :class:`FrameDecoder` reads frames out of a byte stream through a
read-ahead buffer (one ``recv_into`` brings in a whole small frame; a large payload still
goes straight into its destination), and :class:`Outgoing` plans the ``sendmsg`` calls
of one frame. A *shell* moves the bytes: it asks the decoder's :meth:`~FrameDecoder.room`
where to receive next and reports what came in with :meth:`~FrameDecoder.received` until
``room`` is None, and hands ``sendmsg`` what :meth:`Outgoing.pieces` gives. Shells:
:class:`FrameReader` and :func:`send_frame` here (blocking sockets), and
:class:`AsyncFrames` here for any event loop whose socket reads and writes are
coroutines: ``FramedSocket`` in :mod:`kvstored.rpc` (trio) and the connections of
:mod:`kvstored.asyncio` are it over their own sockets.
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Sequence
from typing import Any

import msgpack

MAGIC = b"KVW1"
PREFIX = struct.Struct("<4sIQ")
#: Headers carry keys and per-item metadata: a 4096-key batch of 1 KiB keys fits.
MAX_HEADER = 8 * 1024 * 1024
#: Default payload bound for one frame (a batch of values).
DEFAULT_MAX_PAYLOAD = 4 * 1024**3
#: Bytes a connection reads ahead: a whole small response (prefix, header and a small
#: payload) arrives in one system call instead of three.
READ_AHEAD = 64 * 1024
#: Pieces per sendmsg (IOV_MAX is 1024 on Linux).
MAX_PIECES = 512
#: The read-ahead of a header followed by a large item bound for the caller's buffer
#: (see :func:`header_read_ahead`): the prefix and a header of a few dozen keys.
SMALL_READ_AHEAD = 1024
#: An item at least this large is received straight into its buffer: one more system
#: call costs less than copying it out of the read-ahead.
DIRECT_ITEM = 16 * 1024

Buffer = memoryview | bytes | bytearray


class Parts:
    """One item's bytes held in several buffers, back to back, in order: what a put
    gathers from and a get scatters into (scatter/gather objects), so that an object laid
    out in pieces of an engine's memory never needs a joined copy. ``views`` are flat
    byte views (the client checks and casts them)."""

    __slots__ = ("nbytes", "views")

    def __init__(self, views: Sequence[memoryview]) -> None:
        self.views = list(views)
        self.nbytes = sum(v.nbytes for v in self.views)

    def __len__(self) -> int:
        return self.nbytes

    def head(self, size: int) -> list[memoryview]:
        """Views of the first ``size`` bytes, piece by piece (empty pieces left out)."""
        out: list[memoryview] = []
        for view in self.views:
            if size <= 0:
                break
            if view.nbytes:
                out.append(view[:size] if view.nbytes > size else view)
                size -= view.nbytes
        return out


#: Where an item of a reply's payload is received: one buffer, or the pieces of one.
Into = memoryview | Parts


class FrameError(Exception):
    """The peer sent something that is not a valid frame; close the connection."""


class ConnectionClosed(Exception):
    """The peer closed the connection (cleanly, between frames, or in the middle)."""


def pack_header(header: dict[str, Any], payload_len: int = 0) -> bytes:
    body = msgpack.packb(header, use_bin_type=True)
    assert body is not None, "packb returns None only when given a stream to write to"
    if len(body) > MAX_HEADER:
        raise FrameError(f"header of {len(body)} bytes exceeds {MAX_HEADER}; split the batch")
    return PREFIX.pack(MAGIC, len(body), payload_len) + body


def parse_prefix(prefix: bytes | memoryview, max_payload: int,
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


def unpack_header(body: bytes | memoryview) -> dict[str, Any]:
    size = len(body)
    try:
        header = msgpack.unpackb(
            body, raw=False, strict_map_key=True, use_list=True,
            max_str_len=size, max_bin_len=size, max_array_len=size,
            max_map_len=size, max_ext_len=0)
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise FrameError(f"undecodable header: {exc}") from None
    if not isinstance(header, dict):
        raise FrameError("a frame header must be a map")
    return header


# -- reading -------------------------------------------------------------------------------

_HEADER, _PAYLOAD, _SKIP = "header", "payload", "skip"


class FrameDecoder:
    """Frames out of a byte stream, without I/O (see the module docstring).

    One read at a time: :meth:`read_header`, :meth:`read_payload` (into the caller's
    view) or :meth:`skip_payload` starts it; the shell then loops ``while (room :=
    decoder.room()) is not None: decoder.received(recv_into(room))``, and
    :meth:`header` gives the header read. ``max_header`` and ``max_payload`` bound what
    the next frame may declare (a server lifts them once the peer has authenticated);
    ``payload_left`` counts the unread bytes of the current frame's payload.
    """

    def __init__(self, max_payload: int = DEFAULT_MAX_PAYLOAD, *,
                 max_header: int = MAX_HEADER, read_ahead: int = READ_AHEAD) -> None:
        self.max_payload = max_payload
        self.max_header = max_header
        self.payload_left = 0
        self._ahead = memoryview(bytearray(read_ahead))
        self._pos = self._end = 0
        self._goal: str | None = None
        #: A header larger than the read-ahead, or the payload destination, being filled.
        self._target: memoryview | None = None
        self._filled = 0
        self._header_len = 0
        self._header: dict[str, Any] | None = None
        #: How far the reads of the current header may reach (None: the read-ahead's end).
        self._reach: int | None = None

    # -- the read-ahead buffer ------------------------------------------------------------

    @property
    def buffered(self) -> int:
        """Bytes received and not yet consumed."""
        return self._end - self._pos

    @property
    def read_ahead(self) -> int:
        """Capacity: the most bytes one ``recv_into`` of the read-ahead brings in."""
        return len(self._ahead)

    def grow(self, size: int) -> None:
        """Make the read-ahead ``size`` bytes (if larger), keeping what is buffered. A
        server reads an unauthenticated peer through a small buffer and grows it later."""
        if size <= len(self._ahead):
            return
        left = self.buffered
        view = memoryview(bytearray(size))
        view[:left] = self._ahead[self._pos:self._end]
        self._ahead, self._pos, self._end = view, 0, left

    def _take(self, view: memoryview) -> int:
        """Copy buffered bytes, up to ``len(view)``, into ``view``; returns the count."""
        n = min(len(view), self._end - self._pos)
        if n:
            view[:n] = self._ahead[self._pos:self._pos + n]
            self._pos += n
        return n

    def _consume(self, n: int) -> memoryview:
        data = self._ahead[self._pos:self._pos + n]
        self._pos += n
        return data

    def _free_room(self) -> memoryview:
        """The free end of the read-ahead, after moving unread bytes to the front (up to
        the reach of the header being read, but never short of the header)."""
        if self._pos:
            left = self._end - self._pos
            self._ahead[:left] = self._ahead[self._pos:self._end]
            self._pos, self._end = 0, left
        if self._reach is None:
            return self._ahead[self._end:]
        return self._ahead[self._end:max(self._reach, self._header_len, self._end + 1)]

    # -- reads ------------------------------------------------------------------------------

    def read_header(self, reach: int | None = None) -> None:
        """Start reading the next frame's prefix and header. Whatever is left of the
        current frame's payload must have been read or skipped. With ``reach``, reads
        bring in at most that many bytes of the frame beyond what the header needs (see
        :func:`header_read_ahead`)."""
        if self.payload_left:
            raise FrameError(f"{self.payload_left} bytes of the last payload are unread")
        self._goal, self._target, self._header_len, self._header = _HEADER, None, 0, None
        self._reach = reach

    def header(self) -> dict[str, Any]:
        """The header :meth:`read_header` started to read (once ``room`` is None)."""
        assert self._header is not None, "the header has not arrived yet"
        return self._header

    def read_payload(self, view: memoryview) -> None:
        """Start filling ``view`` with the next ``len(view)`` payload bytes: what the
        read-ahead holds is copied, the rest is received straight into ``view``."""
        if len(view) > self.payload_left:
            raise FrameError(f"payload is {self.payload_left} bytes, {len(view)} wanted")
        taken = self._take(view)
        self.payload_left -= taken
        self._goal, self._target, self._filled = _PAYLOAD, view, taken

    def skip_payload(self) -> None:
        """Start dropping what is left of the current frame's payload."""
        taken = min(self.payload_left, self.buffered)
        self._pos += taken
        self.payload_left -= taken
        self._goal, self._target = _SKIP, None

    def room(self) -> memoryview | None:
        """Where the next ``recv_into`` should write, or None: the read is complete."""
        goal = self._goal
        if goal == _HEADER:
            if self._advance_header():
                return None
            if self._target is not None:
                return self._target[self._filled:]
            return self._free_room()
        if goal == _PAYLOAD:
            target = self._target
            assert target is not None
            return target[self._filled:] if self._filled < len(target) else None
        if goal == _SKIP:
            if not self.payload_left:
                return None
            if self._target is None:
                self._target = memoryview(bytearray(min(self.payload_left, 1 << 20)))
            return self._target[:min(self.payload_left, len(self._target))]
        return None

    def received(self, n: int) -> None:
        """``n`` bytes arrived in the last :meth:`room`; 0 means the peer closed."""
        goal = self._goal
        if n == 0:
            if goal == _HEADER and not self._header_len and not self.buffered:
                raise ConnectionClosed("closed between frames")
            raise ConnectionClosed("the peer closed the connection mid-frame")
        if goal == _HEADER and self._target is None:
            self._end += n
        elif goal == _SKIP:
            self.payload_left -= n
        else:
            self._filled += n
            if goal == _PAYLOAD:
                self.payload_left -= n

    def _advance_header(self) -> bool:
        """Parse what has arrived of the prefix and header; True once the header is in."""
        if self._header is not None:
            return True
        if not self._header_len:
            if self.buffered < PREFIX.size:
                return False
            self._header_len, self.payload_left = parse_prefix(
                self._consume(PREFIX.size), self.max_payload, self.max_header)
            if self._header_len > len(self._ahead):
                big = memoryview(bytearray(self._header_len))
                self._target, self._filled = big, self._take(big)
        if self._target is not None:
            if self._filled < self._header_len:
                return False
            self._header = unpack_header(self._target)
            self._target = None
        elif self.buffered >= self._header_len:
            self._header = unpack_header(self._consume(self._header_len))
        else:
            return False
        self._goal = None
        return True


def header_read_ahead(into: Sequence[Into] | None) -> int | None:
    """The reach of the header read of a reply whose items land in ``into``: short when
    the first is large, so that its bytes are received into its buffer, not copied out
    of the read-ahead (on a single 64 KiB get, that copy is a tenth of the client's
    time); None (the whole read-ahead) otherwise, for small items arrive with the header
    in one system call."""
    if into and len(into[0]) >= DIRECT_ITEM:
        return SMALL_READ_AHEAD
    return None


# -- sending -------------------------------------------------------------------------------

class Outgoing:
    """The ``sendmsg`` calls of one frame: its prefix and header, then the payload pieces
    back to back, never joined. The shell loops ``while (pieces := out.pieces()):
    out.sent(sendmsg(pieces))``.

    A frame may be sent in parts: ``payload_len`` announces more payload than
    ``payload`` holds, and the rest follows as ``Outgoing(None, more)`` (no prefix or
    header), as many times as it takes to send exactly that many bytes."""

    __slots__ = ("_cursor", "_pieces", "left")

    def __init__(self, header: dict[str, Any] | None, payload: Sequence[Buffer] = (),
                 payload_len: int | None = None) -> None:
        views = [memoryview(p).cast("B") for p in payload if len(p)]
        if header is None:
            self._pieces = views
        else:
            length = sum(v.nbytes for v in views) if payload_len is None else payload_len
            self._pieces = [memoryview(pack_header(header, length)), *views]
        self._cursor = 0
        #: Bytes not sent yet (of this part of the frame).
        self.left = sum(v.nbytes for v in self._pieces)

    def pieces(self) -> list[memoryview]:
        """What to send next (at most MAX_PIECES pieces); empty once all is sent."""
        return self._pieces[self._cursor:self._cursor + MAX_PIECES]

    def sent(self, n: int) -> None:
        """``n`` bytes of :meth:`pieces` went out."""
        self.left -= n
        pieces = self._pieces
        while n:
            head = pieces[self._cursor]
            if n >= head.nbytes:
                n -= head.nbytes
                self._cursor += 1
            else:
                pieces[self._cursor] = head[n:]
                n = 0


# -- the async shell (trio and asyncio) ---------------------------------------------------

class AsyncFrames:
    """Frames over a socket whose ``recv_into(view) -> int`` and ``sendmsg(pieces) ->
    int`` are coroutines: the two loops of the module docstring, once for every event
    loop (trio's socket methods are such coroutines; :mod:`kvstored.asyncio` makes
    them for asyncio). A subclass may bound each send by overriding :meth:`_send`."""

    def __init__(self, sock: Any, max_payload: int = DEFAULT_MAX_PAYLOAD, *,
                 max_header: int = MAX_HEADER, read_ahead: int = READ_AHEAD) -> None:
        self.sock = sock
        self.decoder = FrameDecoder(max_payload, max_header=max_header, read_ahead=read_ahead)

    @property
    def payload_left(self) -> int:
        """Unread bytes of the current frame's payload."""
        return self.decoder.payload_left

    async def _pump(self) -> None:
        decoder, recv_into = self.decoder, self.sock.recv_into
        while (room := decoder.room()) is not None:
            decoder.received(await recv_into(room))

    async def recv_header(self, reach: int | None = None) -> dict[str, Any]:
        self.decoder.read_header(reach)
        await self._pump()
        return self.decoder.header()

    async def recv_payload_into(self, view: memoryview) -> None:
        self.decoder.read_payload(view)
        await self._pump()

    async def discard_payload(self) -> None:
        if self.decoder.payload_left:
            self.decoder.skip_payload()
            await self._pump()

    async def _send(self, pieces: list[memoryview]) -> int:
        return await self.sock.sendmsg(pieces)

    async def send_frame(self, header: dict[str, Any] | None, payload: Sequence[Buffer] = (),
                         payload_len: int | None = None) -> None:
        """Send a frame, or a part of one (see :class:`Outgoing`): ``header`` None sends
        more of the payload a header announced with ``payload_len``."""
        out = Outgoing(header, payload, payload_len)
        while pieces := out.pieces():
            out.sent(await self._send(pieces))


# -- the blocking shell (the client library) ----------------------------------------------------

class FrameReader:
    """Reads frames from a blocking socket (see :class:`FrameDecoder`).

    With ``spin`` (seconds), a header that has not arrived is polled for without
    sleeping, that long, before the reader blocks: a thread that blocks lets its vCPU
    go idle, and where an idle vCPU halts at once, waking it again when the reply lands
    costs more than a loopback round trip (the client's ``reply_spin``, docs/client.md)."""

    def __init__(self, sock: socket.socket, max_payload: int = DEFAULT_MAX_PAYLOAD, *,
                 spin: float = 0.0) -> None:
        self.sock = sock
        self.decoder = FrameDecoder(max_payload)
        self.spin = spin

    @property
    def payload_left(self) -> int:
        """Unread bytes of the current frame's payload."""
        return self.decoder.payload_left

    def _pump(self) -> None:
        decoder, recv_into = self.decoder, self.sock.recv_into
        while (room := decoder.room()) is not None:
            decoder.received(recv_into(room))

    def recv_header(self, reach: int | None = None) -> dict[str, Any]:
        """Read the next frame's prefix and header (skipping what is left of the last
        frame's payload); then read its ``payload_left``. ``reach``: see
        :meth:`FrameDecoder.read_header`."""
        decoder = self.decoder
        if decoder.payload_left:
            self.discard_payload()
        decoder.read_header(reach)
        if self.spin > 0.0:
            self._spin_for(decoder)
        recv_into = self.sock.recv_into
        while (room := decoder.room()) is not None:
            decoder.received(recv_into(room))
        return decoder.header()

    def _spin_for(self, decoder: FrameDecoder) -> None:
        """Receive what has arrived of the header without blocking, for up to
        ``spin`` seconds; the caller blocks for the rest."""
        sock = self.sock
        timeout = sock.gettimeout()
        sock.settimeout(0.0)  # a socket with a timeout polls before every receive
        try:
            deadline = time.perf_counter() + self.spin
            while (room := decoder.room()) is not None:
                try:
                    got = sock.recv_into(room)
                except BlockingIOError:
                    if time.perf_counter() >= deadline:
                        return
                    continue
                decoder.received(got)
        finally:
            sock.settimeout(timeout)

    def recv_payload_into(self, view: memoryview) -> None:
        decoder = self.decoder
        decoder.read_payload(view)
        recv_into = self.sock.recv_into
        while (room := decoder.room()) is not None:
            decoder.received(recv_into(room))

    def discard_payload(self) -> None:
        self.decoder.skip_payload()
        self._pump()


def send_frame(sock: socket.socket, header: dict[str, Any],
               payload: Sequence[Buffer] = ()) -> None:
    """Send a frame over a blocking socket; ``payload`` pieces go out back to back
    without being joined."""
    if not payload:
        sock.sendall(pack_header(header))  # a request's usual case: no scatter list
        return
    out = Outgoing(header, payload)
    while pieces := out.pieces():
        out.sent(sock.sendmsg(pieces))


def recv_exactly_into(sock: socket.socket, view: memoryview) -> None:
    """Fill ``view`` from a blocking ``sock`` (no frames: the raw-socket peers of the
    benchmarks); ConnectionClosed if the peer goes away first."""
    got, total = 0, len(view)
    while got < total:
        n = sock.recv_into(view[got:], total - got)
        if n == 0:
            raise ConnectionClosed("the peer closed the connection mid-frame")
        got += n
