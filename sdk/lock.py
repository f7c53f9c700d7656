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
holder, read from ``/proc/locks`` (its pid and command line) where it can be known. Only a
holder that is exiting (a restart: the old process on its way out) is waited for, on its
pidfd, for as long as the caller allows; a live holder is refused at once, since it may
keep the store for days, and so is one that cannot be seen (another pid namespace).

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
import select
import signal
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
        """Lock ``path`` (exclusively, or ``shared``).

        A lock held by a process whose exit has begun is waited for, ``wait`` seconds at
        the most, until that process is gone; one held by a live process (this one
        included) is refused at once, as waiting would not free it.
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
        try:
            return cls._take(path, fd, shared, what, wait)
        except BaseException:
            os.close(fd)
            raise

    @classmethod
    def _take(cls, path: Path, fd: int, shared: bool, what: str, wait: float) -> StoreLock:
        """``flock`` the open ``fd``; see :meth:`acquire`. Waits only for a holder whose
        exit has begun, on its pidfd (no polling); any other holder is refused at once."""
        deadline = time.monotonic() + wait
        looked_again = False
        waited_for: set[int] = set()
        while True:
            try:
                fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
                return cls(path, fd, shared)
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    raise from_oserror(exc, path=path, action=f"locking the {what}") from exc
            pid, holder = lock_holder(fd)
            if pid is None and not looked_again:
                looked_again = True  # released between the flock and /proc/locks?
                continue
            if pid in waited_for:
                # Its holder is gone and the lock is not: a child inherited the descriptor.
                raise _busy(what, path, "a process that inherited the lock's descriptor "
                            f"from pid {pid}, which has exited", None)
            remaining = deadline - time.monotonic()
            if pid is None or pid == os.getpid() or remaining <= 0 or not _exiting(pid):
                raise _busy(what, path, holder, pid)
            if not _await_exit(pid, remaining):
                raise _busy(what, path, f"{holder}, which is exiting but did not let go of it "
                            f"within {wait:g} s", pid)
            waited_for.add(pid)

    def release(self) -> None:
        """Drop the lock (idempotent)."""
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)


def _busy(what: str, path: Path, holder: str | None, pid: int | None) -> BackendBusyError:
    return BackendBusyError(
        f"the {what} is in use by {holder or 'another process'}; two processes must not "
        "share one store: stop it first (or, for a running node, use its live view: "
        "kvstore mount, kvstore recover --node)", path=path, holder=holder, pid=pid)


#: ``PF_EXITING`` in the flags of ``/proc/PID/stat``: the kernel has begun the exit.
_PF_EXITING = 0x4
#: SIGKILL's bit in the pending-signal masks of ``/proc/PID/status``.
_SIGKILL_BIT = 1 << (signal.SIGKILL - 1)


def _exiting(pid: int) -> bool:
    """Whether ``pid`` has exited or is on its way out (a zombie, its main thread in the
    kernel's exit, or a SIGKILL pending): its descriptors, and so its locks, are about to
    be closed. A live process that merely has the store open is not waited for: it may
    hold it for days."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        with open(f"/proc/{pid}/status", "rb") as f:
            status = f.read().splitlines()
    except FileNotFoundError:
        return True  # already reaped
    except OSError:
        return False  # not ours to look at: refuse rather than guess
    fields = stat[stat.rfind(b")") + 2:].split()  # after the command, which may hold spaces
    try:
        if fields[0] in (b"Z", b"X") or int(fields[6]) & _PF_EXITING:
            return True
        pending = [int(line.split()[1], 16) for line in status
                   if line.startswith((b"SigPnd:", b"ShdPnd:"))]
    except (IndexError, ValueError):
        return False
    return any(mask & _SIGKILL_BIT for mask in pending)


def _await_exit(pid: int, timeout: float) -> bool:
    """Wait up to ``timeout`` seconds for ``pid`` to be gone, on its pidfd (readable once
    every thread of it has exited, after its descriptors were closed). True when it is."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    except OSError:
        return False  # no pidfd (Linux < 5.3): nothing to wait on, so refuse
    try:
        readable, _, _ = select.select([pidfd], [], [], timeout)
        return bool(readable)
    finally:
        os.close(pidfd)


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
