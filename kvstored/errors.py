"""The core's errors: what the store, its configuration and this machine report.

This is the taxonomy of the core layer (docs/architecture.md, "Errors, layer by layer"):
the client library, the master and the nodes raise these, and the wire carries the
store's ones. Classes are by what went wrong, so a caller can act on the type::

    StoreError                  a request to the store failed; ``code`` is its wire name
    ├── NotFoundError           no such key
    ├── UnreachableError        master or node unreachable, or a timeout
    ├── CorruptDataError        a checksum failed or a frame is malformed
    ├── NoSpaceError            the tier or the disk is full
    ├── BadRequestError         the request is wrong: key too long, bad flag
    ├── UnauthorizedError       missing or wrong shared-secret token
    └── InternalError           a bug or an unexpected state on the server
    ConfigError                 the configuration (a file, a variable, a flag, a token
                                file) cannot be used (also a ValueError)
    ListenError                 the daemon cannot serve on an address (an OSError)
    UnavailableError            a capability this machine lacks: FUSE, io_uring, an
                                optional package

On the wire a store error is ``{"code": <code>, "message": <text>, "key": <key or nil>}``;
:func:`from_wire` turns it back into the matching class. Exit codes are the CLI's
business (:mod:`kvstored.cli.errors` maps these classes to them), not this module's.
The backend SDK (:mod:`kvstored.sdk.errors`), the io engine (:mod:`kvstored.native.errors`)
and the simulator (:mod:`kvstored.tools.errors`) have taxonomies of their own.
"""

from __future__ import annotations

import errno
import socket
from typing import Any, ClassVar


class StoreError(Exception):
    """A request to the store failed. ``message`` says what and what to do; ``key`` is
    the object concerned, when there is one."""

    code: ClassVar[str] = "internal"

    def __init__(self, message: str, *, key: str | None = None):
        self.message = message
        self.key = key
        super().__init__(f"{message} (key {key!r})" if key is not None else message)

    def to_wire(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "key": self.key}


class NotFoundError(StoreError):
    """No object has the key (never written, removed, or lost with its last replica)."""

    code = "not_found"


class UnreachableError(StoreError):
    """The master or a node could not be reached, or did not answer in time."""

    code = "unreachable"


class CorruptDataError(StoreError):
    """Bytes failed their checksum, or a peer sent a malformed frame; the bytes are never
    handed out."""

    code = "corrupt"


class NoSpaceError(StoreError):
    """The object does not fit: the DRAM tier, the backend or the disk is full."""

    code = "no_space"


class BadRequestError(StoreError):
    """The request itself is wrong (a key too long, an unknown flag): the caller's
    fault, and sending it again fails again."""

    code = "bad_request"


class UnauthorizedError(StoreError):
    """The connection's token is missing, wrong, or not allowed the operation."""

    code = "unauthorized"


class InternalError(StoreError):
    """A bug, or a state the server did not expect; its log says more."""

    code = "internal"


_BY_CODE = {cls.code: cls for cls in (NotFoundError, UnreachableError, CorruptDataError,
                                      NoSpaceError, BadRequestError, UnauthorizedError,
                                      InternalError)}


def from_wire(error: dict[str, Any]) -> StoreError:
    cls = _BY_CODE.get(str(error.get("code")), InternalError)
    key = error.get("key")
    return cls(str(error.get("message", "unknown error")),
               key=key if isinstance(key, str) else None)


class ConfigError(ValueError):
    """The configuration cannot be used: a bad file, variable or flag value, or a token
    file that is missing, unreadable or empty. ``problems`` lists each one; the message
    says what to fix."""

    def __init__(self, problems: str | list[str]):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        if len(self.problems) == 1:
            message = self.problems[0]
        else:
            message = f"{len(self.problems)} problems in the configuration:\n" + "\n".join(
                f"  - {problem}" for problem in self.problems)
        super().__init__(message)


class UnavailableError(Exception):
    """A capability the request needs is absent on this machine (FUSE, io_uring, RDMA, a
    compiled core, an optional package); the message says what is missing and how to
    get it."""


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
