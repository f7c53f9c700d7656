"""The backend error taxonomy: a few classes, organised by who is at fault.

::

    BackendError                      every error a backend raises or reports
    ├── InvalidRequestError           the caller's fault: fix the call, retrying won't help
    │   ├── InvalidKeyError           empty, not UTF-8, or longer than MAX_KEY_BYTES
    │   ├── ValueTooLargeError        larger than the backend's max_value_size
    │   ├── BackendClosedError        the backend was used after close()
    │   └── ReadOnlyError             a change asked of a backend opened read-only, or a
    │                                 read-only open of a backend that cannot do one
    ├── CapacityError                 no room: the capacity cap or the file system is full
    ├── CorruptionError               stored bytes failed their checksum or are malformed
    ├── BackendIOError                the operating system refused (carries errno)
    ├── BackendBusyError              another process holds the store (names the holder)
    ├── MissingStoreError             a read-only open found no store at the path
    └── UnknownBackendError           no backend is registered under that name

Every instance carries the object it concerns (``key``, possibly ``None``) and the file or
device (``path``, possibly ``None``), so that a message can name both. A message says what
to do, not only what went wrong.
"""

from __future__ import annotations

import errno as _errno
import os


class BackendError(Exception):
    """Base class. ``key`` and ``path`` name the object and file concerned, when known."""

    def __init__(self, message: str, *, key: str | None = None,
                 path: str | os.PathLike | None = None):
        self.key = key
        self.path = os.fspath(path) if path is not None else None
        self.message = message
        super().__init__(self._render())

    def _render(self) -> str:
        where = []
        if self.key is not None:
            where.append(f"key {self.key!r}")
        if self.path is not None:
            where.append(f"at {self.path}")
        return f"{self.message} ({', '.join(where)})" if where else self.message


class InvalidRequestError(BackendError, ValueError):
    """The request itself is wrong. Retrying the same request will fail the same way."""


class InvalidKeyError(InvalidRequestError):
    """A key is empty, is not encodable as UTF-8, or is longer than ``MAX_KEY_BYTES``."""


class ValueTooLargeError(InvalidRequestError):
    """A value is larger than the backend's ``max_value_size``."""


class BackendClosedError(InvalidRequestError):
    """The backend was used after :meth:`StorageBackend.close`."""


class ReadOnlyError(InvalidRequestError):
    """The backend was opened read-only and was asked to change something, or a read-only
    open was asked of a backend that cannot open without writing."""


class CapacityError(BackendError):
    """No room for the object: the configured capacity, or the file system, is full.

    Nothing of the object is visible. Retrying after an eviction may succeed.
    """


class CorruptionError(BackendError):
    """Stored bytes failed their checksum, or a record is malformed.

    Reads never return such bytes: they report the item as corrupt instead.
    """


class BackendIOError(BackendError, OSError):
    """The operating system refused an operation. ``errno`` holds its code."""

    def __init__(self, message: str, *, errno: int, key: str | None = None,
                 path: str | os.PathLike | None = None):
        name = _errno.errorcode.get(errno, errno)
        BackendError.__init__(self, f"{message}: {os.strerror(errno)} [{name}]",
                              key=key, path=path)
        self.errno = errno  # after: OSError.__init__ (reached through super()) resets it

    def __str__(self) -> str:  # OSError would render its own (errno, strerror) form
        return self._render()


class BackendBusyError(BackendError):
    """Another process holds the store (a running node, or a tool). ``holder`` says who
    (``pid N (command line)``) and ``pid`` is its process id, when that can be told."""

    def __init__(self, message: str, *, path: str | os.PathLike | None = None,
                 holder: str | None = None, pid: int | None = None):
        self.holder = holder
        self.pid = pid
        super().__init__(message, path=path)


class MissingStoreError(BackendError, LookupError):
    """A read-only open found no store where it looked; ``path`` is what it looked for
    (a stamp file, a volume). Read-only opens never create one."""


class UnknownBackendError(BackendError, LookupError):
    """No backend is registered under the name asked for. ``known`` lists those that are."""

    def __init__(self, name: str, known: list[str]):
        self.name = name
        self.known = sorted(known)
        super().__init__(
            f"unknown storage backend {name!r}; known backends: {', '.join(self.known)}. "
            "A third-party backend registers under the entry-point group 'kvstored.backends'"
        )


def from_oserror(exc: OSError, *, key: str | None = None, path: str | os.PathLike | None = None,
                 action: str = "I/O failed") -> BackendError:
    """Translate an :class:`OSError` into the taxonomy: ENOSPC and EDQUOT become
    :class:`CapacityError`, everything else :class:`BackendIOError`."""
    path = path if path is not None else exc.filename
    code = exc.errno or _errno.EIO
    if code in (_errno.ENOSPC, _errno.EDQUOT):
        return CapacityError(f"{action}: the file system is full; free space or lower the capacity",
                             key=key, path=path)
    return BackendIOError(action, errno=code, key=key, path=path)
