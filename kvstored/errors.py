"""Errors the store reports to its users: the client library, the CLI and the wire.

::

    StoreError                  base; ``code`` is the wire name, ``key`` the object
    ├── NotFoundError           no such key
    ├── UnreachableError        master or node unreachable, or a timeout
    ├── CorruptDataError        a checksum failed or a frame is malformed
    ├── NoSpaceError            the tier or the disk is full
    ├── BadRequestError         the request is wrong: key too long, bad flag
    ├── UnauthorizedError       missing or wrong shared-secret token
    └── InternalError           a bug or an unexpected state on the server

Besides, :class:`ListenError` (an :class:`OSError`): the daemon cannot serve on an address.

On the wire an error is ``{"code": <code>, "message": <text>, "key": <key or nil>}``;
:func:`from_wire` turns it back into the matching class. Exit codes are the CLI's
business (:mod:`kvstored.cli.errors` maps these classes to them), not this module's.
"""

from __future__ import annotations

import errno
import socket
from typing import Any


class StoreError(Exception):
    code = "internal"

    def __init__(self, message: str, *, key: str | None = None):
        self.message = message
        self.key = key
        super().__init__(f"{message} (key {key!r})" if key is not None else message)

    def to_wire(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "key": self.key}


class NotFoundError(StoreError):
    code = "not_found"


class UnreachableError(StoreError):
    code = "unreachable"


class CorruptDataError(StoreError):
    code = "corrupt"


class NoSpaceError(StoreError):
    code = "no_space"


class BadRequestError(StoreError):
    code = "bad_request"


class UnauthorizedError(StoreError):
    code = "unauthorized"


class InternalError(StoreError):
    code = "internal"


_BY_CODE = {cls.code: cls for cls in (NotFoundError, UnreachableError, CorruptDataError,
                                      NoSpaceError, BadRequestError, UnauthorizedError,
                                      InternalError)}


def from_wire(error: dict[str, Any]) -> StoreError:
    cls = _BY_CODE.get(str(error.get("code")), InternalError)
    key = error.get("key")
    return cls(str(error.get("message", "unknown error")),
               key=key if isinstance(key, str) else None)


#: What to do when an address cannot be listened on, by errno.
_LISTEN_HINTS = {
    errno.EADDRINUSE: "another process listens there (see: ss -ltnp); stop it, or choose "
                      "another port (port 0 picks a free one)",
    errno.EADDRNOTAVAIL: "it is not an address of this host; give one of its addresses, "
                         "127.0.0.1 or 0.0.0.0",
    errno.EACCES: "ports below 1024 need privileges; choose a port above 1023",
}


class ListenError(OSError):
    """The daemon cannot listen on ``address`` (in use, not this host's, not allowed).

    ``errno`` is the operating system's code (``EADDRNOTAVAIL`` for a host name that does
    not resolve); the message names the address and what to do.
    """

    def __init__(self, address: tuple[str, int], cause: OSError, *, role: str = "serve"):
        self.address = (address[0], int(address[1]))
        code = errno.EADDRNOTAVAIL if isinstance(cause, socket.gaierror) else cause.errno
        reason = cause.strerror or str(cause)
        hint = _LISTEN_HINTS.get(code or 0, "choose another address")
        super().__init__(code, f"cannot {role} on {address[0]}:{address[1]} ({reason}); {hint}")

    def __str__(self) -> str:  # not OSError's "[Errno 98] ..." form
        return str(self.strerror)
