"""Errors the store reports to its users: the client library, the CLI and the wire.

::

    StoreError                  base; ``code`` is the wire name, ``key`` the object
    ├── NotFoundError           no such key (exit 3)
    ├── UnreachableError        master or node unreachable, or a timeout (exit 4)
    ├── CorruptDataError        a checksum failed or a frame is malformed (exit 5)
    ├── NoSpaceError            the tier or the disk is full (exit 6)
    ├── BadRequestError         the request is wrong: key too long, bad flag (exit 2)
    ├── UnauthorizedError       missing or wrong shared-secret token (exit 2)
    └── InternalError           a bug or an unexpected state on the server (exit 1)

On the wire an error is ``{"code": <code>, "message": <text>, "key": <key or nil>}``;
:func:`from_wire` turns it back into the matching class.
"""

from __future__ import annotations

from typing import Any

from kvstored.cli.exitcodes import ExitCode


class StoreError(Exception):
    code = "internal"
    exit_code = ExitCode.FAILURE

    def __init__(self, message: str, *, key: str | None = None):
        self.message = message
        self.key = key
        super().__init__(f"{message} (key {key!r})" if key is not None else message)

    def to_wire(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "key": self.key}


class NotFoundError(StoreError):
    code = "not_found"
    exit_code = ExitCode.NOT_FOUND


class UnreachableError(StoreError):
    code = "unreachable"
    exit_code = ExitCode.UNREACHABLE


class CorruptDataError(StoreError):
    code = "corrupt"
    exit_code = ExitCode.CORRUPT


class NoSpaceError(StoreError):
    code = "no_space"
    exit_code = ExitCode.NO_SPACE


class BadRequestError(StoreError):
    code = "bad_request"
    exit_code = ExitCode.USAGE


class UnauthorizedError(StoreError):
    code = "unauthorized"
    exit_code = ExitCode.USAGE


class InternalError(StoreError):
    code = "internal"
    exit_code = ExitCode.FAILURE


_BY_CODE = {cls.code: cls for cls in (NotFoundError, UnreachableError, CorruptDataError,
                                      NoSpaceError, BadRequestError, UnauthorizedError,
                                      InternalError)}


def from_wire(error: dict[str, Any]) -> StoreError:
    cls = _BY_CODE.get(str(error.get("code")), InternalError)
    key = error.get("key")
    return cls(str(error.get("message", "unknown error")),
               key=key if isinstance(key, str) else None)
