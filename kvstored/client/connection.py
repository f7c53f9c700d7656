"""One blocking connection to the master or a node: the blocking twin of
:class:`kvstored.rpc.RpcClient`.

Connecting and the hello are bounded by ``connect_timeout`` (a peer that accepts and
never answers, or answers something that is not kvstored, fails fast); every later call
by ``timeout``. A call whose exchange breaks off (the connection fails, times out, or the
peer answers something that is not the op's reply) closes the connection and raises
:class:`~kvstored.errors.UnreachableError`; an error the peer answered leaves it open.
"""

from __future__ import annotations

import functools
import socket
from collections.abc import Sequence

from kvstored.capabilities import probe_idle_halts
from kvstored.checksum import crc32c
from kvstored.errors import StoreError, UnauthorizedError
from kvstored.protocol import HELLO, Hello, HelloReply, OpSpec, Role
from kvstored.protocol.ops import Rep, Req, connect_failures, exchange_failures
from kvstored.security import ClientToken
from kvstored.wire import Buffer, FrameReader, Into, header_read_ahead, send_frame

#: How long a client polls for a reply before its thread blocks where an idle vCPU halts
#: at once (see :class:`~kvstored.wire.FrameReader`): about two loopback round trips of
#: a 64 KiB get.
REPLY_SPIN = 200e-6


@functools.cache
def default_reply_spin() -> float:
    """:data:`REPLY_SPIN` on a virtual machine whose idle vCPUs halt at once, else 0.

    Measured on a 2-vCPU VM whose ``guest_halt_poll_ns`` was 0, a single 64 KiB get from
    a node's DRAM: p50 190-260 us blocking at once, 120-170 us polling first. With the
    kernel's halt polling on (200 us) the same get took 87-89 us blocking and 115-118 us
    polling, so elsewhere a call blocks at once."""
    halts, _ = probe_idle_halts()
    return REPLY_SPIN if halts else 0.0


class Connection:
    def __init__(self, address: tuple[str, int], token: ClientToken, *, timeout: float,
                 connect_timeout: float, reply_spin: float = 0.0) -> None:
        self.address = address
        self.where = f"{address[0]}:{address[1]}"
        with connect_failures(self.where, connect_timeout):
            self.sock = socket.create_connection(address, timeout=connect_timeout)
        try:
            with exchange_failures(self.where, connect_timeout, self.close):
                self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self.reader = FrameReader(self.sock)
                send_frame(self.sock, HELLO.request_header(Hello(Role.CLIENT, token.token)))
                self.hello: HelloReply = HELLO.decode_reply(self.reader.recv_header())
        except UnauthorizedError as exc:
            raise token.explain(exc) from None
        self.timeout = timeout
        self.sock.settimeout(timeout)
        self.reader.spin = reply_spin

    @property
    def closed(self) -> bool:
        return self.sock.fileno() < 0

    def call(self, spec: OpSpec[Req, Rep], request: Req, payload: Sequence[Buffer] = (),
             into: Sequence[Into] | None = None, sums: list[int | None] | None = None) -> Rep:
        """Send ``request`` and return the reply (raising the error the peer answered).
        A reply payload is received into ``into`` (see :meth:`OpSpec.payload_items`),
        or discarded; ``sums[i]``, if given, is set to the CRC-32C of item ``i`` as it
        lands (while its bytes are still in the cache)."""
        reader = self.reader
        with exchange_failures(self.where, self.timeout, self.close, op=spec.name):
            send_frame(self.sock, spec.request_header(request), payload)
            header = reader.recv_header(header_read_ahead(into))
            try:
                reply = spec.decode_reply(header)
            except StoreError:
                reader.discard_payload()
                raise
            if into is not None:
                for i, views in spec.payload_items(reply, into):
                    crc = 0
                    for view in views:
                        reader.recv_payload_into(view)
                        if sums is not None:
                            crc = crc32c(view, crc)
                    if sums is not None:
                        sums[i] = crc
            if reader.payload_left:
                reader.discard_payload()
            if spec.trailer_follows(reply):
                reply = spec.with_trailer(reply, reader.recv_header())
            return reply

    def close(self) -> None:
        self.sock.close()
