"""One blocking connection to the master or a node: the blocking twin of
:class:`kvstored.rpc.RpcClient`.

Connecting and the hello are bounded by ``connect_timeout`` (a peer that accepts and
never answers, or answers something that is not kvstored, fails fast); every later call
by ``timeout``. A call whose exchange breaks off (the connection fails, times out, or the
peer answers something that is not the op's reply) closes the connection and raises
:class:`~kvstored.errors.UnreachableError`; an error the peer answered leaves it open.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence

from kvstored.errors import StoreError, UnauthorizedError, UnreachableError
from kvstored.protocol import HELLO, Hello, HelloReply, OpSpec, Role
from kvstored.protocol.ops import Rep, Req, lost_connection
from kvstored.security import ClientToken
from kvstored.wire import Buffer, ConnectionClosed, FrameError, FrameReader, Into, send_frame

_BROKEN = (OSError, ConnectionClosed, FrameError)


class Connection:
    def __init__(self, address: tuple[str, int], token: ClientToken, *, timeout: float,
                 connect_timeout: float) -> None:
        self.address = address
        self.where = f"{address[0]}:{address[1]}"
        try:
            self.sock = socket.create_connection(address, timeout=connect_timeout)
        except OSError as exc:
            raise UnreachableError(f"cannot reach {self.where} ({exc.strerror or exc}); "
                                   "is kvstored running?") from None
        try:
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.reader = FrameReader(self.sock)
            send_frame(self.sock, HELLO.request_header(Hello(Role.CLIENT, token.token)))
            self.hello: HelloReply = HELLO.decode_reply(self.reader.recv_header())
        except _BROKEN as exc:
            self.close()
            raise UnreachableError(f"{self.where} did not answer as kvstored does within "
                                   f"{connect_timeout:g} s ({str(exc) or type(exc).__name__}); "
                                   "is that a kvstored master's or node's address?") from None
        except UnauthorizedError as exc:
            self.close()
            raise token.explain(exc) from None
        except BaseException:  # refused (another protocol version), or interrupted
            self.close()  # nothing stays open when the hello fails
            raise
        self.sock.settimeout(timeout)

    @property
    def closed(self) -> bool:
        return self.sock.fileno() < 0

    def call(self, spec: OpSpec[Req, Rep], request: Req, payload: Sequence[Buffer] = (),
             into: Sequence[Into] | None = None) -> Rep:
        """Send ``request`` and return the reply (raising the error the peer answered).
        A reply payload is received into ``into`` (see :meth:`OpSpec.payload_views`),
        or discarded."""
        try:
            send_frame(self.sock, spec.request_header(request), payload)
            header = self.reader.recv_header()
            try:
                reply = spec.decode_reply(header)
            except StoreError:
                self.reader.discard_payload()
                raise
            if into is not None:
                for view in spec.payload_views(reply, into):
                    self.reader.recv_payload_into(view)
            self.reader.discard_payload()
            return reply
        except _BROKEN as exc:
            self.close()
            raise lost_connection(spec.name, self.where, exc) from None
        except StoreError:
            raise
        except BaseException:
            self.close()  # interrupted mid-call: the stream is out of step now
            raise

    def close(self) -> None:
        self.sock.close()
