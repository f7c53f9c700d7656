"""The errors of the io engine, and the log-once helper its warnings go through."""

from __future__ import annotations

import errno as errno_names
import logging
import os
import threading

log = logging.getLogger("kvstored.native")

_logged: set[object] = set()
_logged_lock = threading.Lock()


def log_once(key: object, level: int, message: str, *args: object) -> None:
    """Log ``message`` the first time ``key`` is seen in this process, never again."""
    with _logged_lock:
        if key in _logged:
            return
        _logged.add(key)
    log.log(level, message, *args)


class EngineUnavailableError(RuntimeError):
    """The io engine asked for cannot work on this machine.

    ``reason`` says why, in words an operator can act on (the sysctl, seccomp, the kernel,
    or a build without liburing). Raised by :func:`kvstored.native.get_engine` when
    ``uring`` is asked for explicitly; ``auto`` falls back to ``posix`` instead.
    """

    def __init__(self, engine: str, reason: str):
        self.engine = engine
        self.reason = reason
        super().__init__(f"io engine {engine!r} is unavailable: {reason}. "
                         f"Use io.engine=auto or posix (KVSTORED_IO_ENGINE), or fix the cause.")


class IoError(OSError):
    """One item of a batch failed. Returned in the item's place, never raised by the engine.

    ``errno`` is the error number, ``path`` the file, ``offset`` where the item started
    (``None`` for fsync), ``done`` how many of its bytes were transferred before the error
    (a write that hit ENOSPC may have written some). ``op`` is ``read``, ``write``,
    ``fsync`` or ``fdatasync``. Callers that prefer exceptions can ``raise`` it.
    """

    def __init__(self, errno: int, path: str, offset: int | None, *, op: str,
                 length: int = 0, done: int = 0, detail: str = ""):
        strerror = os.strerror(errno)
        super().__init__(errno, strerror)
        self.path = path
        self.filename = path
        self.offset = offset
        self.op = op
        self.length = length
        self.done = done
        self.detail = detail
        name = errno_names.errorcode.get(errno, str(errno))
        where = (f"{op} of {length} bytes at offset {offset}" if offset is not None else op)
        self.message = (f"{where} in {path} failed: {strerror} ({name})"
                        + (f" after {done} bytes" if done else "")
                        + (f"; {detail}" if detail else ""))

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        name = errno_names.errorcode.get(self.errno or 0, str(self.errno))
        return (f"IoError({name}, {self.op} {self.path!r}, offset={self.offset}, "
                f"done={self.done})")

    def __reduce__(self):  # keep the attributes across pickling (process pools, logs)
        return (_rebuild_io_error, (self.errno, self.path, self.offset, self.op,
                                    self.length, self.done, self.detail))


def _rebuild_io_error(errno: int, path: str, offset: int | None, op: str, length: int,
                      done: int, detail: str) -> IoError:
    return IoError(errno, path, offset, op=op, length=length, done=done, detail=detail)
