"""The lock that keeps two processes out of one store.

Two processes writing one backend directory corrupt it, and a tool reading a directory
that a live node writes sees it change underneath. So a backend takes a :class:`StoreLock`
when it opens:

- opened read-write, an *exclusive* ``flock`` (created if need be): nobody else may open
  the store at all;
- opened read-only, a *shared* ``flock`` on the lock file if it exists (a read-only open
  never creates anything): other readers may share it, a writer may not start meanwhile.

Either way the lock is held until :meth:`StoreLock.release`, and the kernel drops it when
the process dies. A lock that is taken is reported as :class:`BackendBusyError` naming the
holder, read from ``/proc/locks`` (its pid and command line) where it can be known.

The lock lives on its own descriptor, which is never handed to the io engine: an io_uring
request may keep a reference to the file it used for a moment after it completed, and a
lock on that file would outlive ``close()`` by as long (issue 24). A lock file of its own
is released by the ``close`` of its descriptor, at once.

This module knows nothing of any layout: the caller says which file to lock.
"""

from __future__ import annotations

import errno
import fcntl
import os
import time
from pathlib import Path

from kvstored.sdk.errors import BackendBusyError, from_oserror
from kvstored.sdk.files import PRIVATE_FILE

#: The lock file's name, for backends that keep one in their directory.
LOCK_NAME = "KVSTORED-LOCK"


class StoreLock:
    """An exclusive or shared ``flock`` on ``path``, held until :meth:`release`.

    Use :meth:`acquire`; ``held`` is False for a read-only open of a store that has no
    lock file (nobody wrote it with a version that locks, so nobody holds it).
    """

    def __init__(self, path: Path, fd: int, shared: bool) -> None:
        self.path = path
        self._fd = fd
        self.shared = shared

    @property
    def held(self) -> bool:
        return self._fd >= 0

    @classmethod
    def acquire(cls, path: str | os.PathLike, *, shared: bool = False, what: str = "store",
                wait: float = 0.0, create: bool | None = None,
                flags: int = 0) -> StoreLock:
        """Lock ``path`` (exclusively, or ``shared``), retrying for ``wait`` seconds.

        ``create`` (default: not ``shared``) creates the lock file 0600 when it is
        missing; without it a missing file gives a lock that holds nothing. ``flags`` are
        added to ``os.open`` (``O_EXCL`` for a block device). Raises
        :class:`BackendBusyError` naming the holder when the lock stays taken, and the
        translated OSError when the file cannot be opened.
        """
        path = Path(path)
        create = not shared if create is None else create
        open_flags = (os.O_RDONLY if shared else os.O_RDWR) | os.O_CLOEXEC | flags
        if create:
            open_flags |= os.O_CREAT
        try:
            fd = os.open(path, open_flags, PRIVATE_FILE)
        except FileNotFoundError:
            if create:
                raise
            return cls(path, -1, shared)
        except OSError as exc:
            raise from_oserror(exc, path=path, action=f"opening the lock of the {what}") \
                from exc
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
                return cls(path, fd, shared)
            except OSError as exc:
                busy = exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN)
                if busy and time.monotonic() < deadline:
                    time.sleep(0.02)  # a holder that is exiting; polled with a deadline
                    continue
                pid, holder = lock_holder(fd) if busy else (None, None)
                os.close(fd)
                if not busy:
                    raise from_oserror(exc, path=path, action=f"locking the {what}") from exc
                raise BackendBusyError(
                    f"the {what} is in use by {holder or 'another process'}; two processes "
                    "must not share one store: stop it first (or, for a running node, use "
                    "its live view: kvstore mount, kvstore recover --node)", path=path,
                    holder=holder, pid=pid) from None

    def release(self) -> None:
        """Drop the lock (idempotent)."""
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)


def lock_holder(fd: int) -> tuple[int | None, str | None]:
    """Who holds a lock on the file open as ``fd``: its pid and ``pid N (command line)``,
    from ``/proc/locks``; ``(None, None)`` when it cannot be told (no /proc, another pid
    namespace)."""
    st = os.fstat(fd)
    target = (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
    try:
        with open("/proc/locks", encoding="ascii", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None, None
    for line in lines:
        fields = line.split()
        if "->" in fields or len(fields) < 6 or fields[1] != "FLOCK":
            continue  # a waiter, or a lock of another kind
        try:
            pid = int(fields[4])
            major, minor, inode = fields[5].split(":")
            where = (int(major, 16), int(minor, 16), int(inode))
        except ValueError:
            continue
        if where != target or pid <= 0:
            continue
        if pid == os.getpid():
            return pid, f"this process (pid {pid}: another open of the same store)"
        return pid, f"pid {pid} ({_command_line(pid)})"
    return None, None


def openers_of(path: str | os.PathLike) -> str | None:
    """Which other process has ``path`` open (``pid N (command line)``), found by reading
    ``/proc/*/fd``; None when none can be seen. For a block device claimed with
    ``O_EXCL``, which leaves no trace in ``/proc/locks``. Slow: for error messages only."""
    try:
        target = os.stat(path)
    except OSError:
        return None
    me = os.getpid()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            for fd in os.scandir(f"/proc/{entry.name}/fd"):
                try:
                    st = os.stat(fd.path)
                except OSError:
                    continue
                if (st.st_rdev, st.st_ino, st.st_dev) == (
                        target.st_rdev, target.st_ino, target.st_dev):
                    pid = int(entry.name)
                    if pid == me:
                        return f"this process (pid {pid}: another open of the same store)"
                    return f"pid {pid} ({_command_line(pid)})"
        except OSError:
            continue  # gone, or not ours to look at
    return None


def _command_line(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        return "exited"
    words = [w.decode("utf-8", "replace") for w in raw.split(b"\0") if w]
    text = " ".join(words) or "?"
    return text if len(text) <= 160 else text[:157] + "..."
