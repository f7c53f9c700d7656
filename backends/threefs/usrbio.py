"""3FS's native USRBIO API, detected explicitly, wrapped as an io engine.

3FS ships a Python module, ``hf3fs_fuse.io`` (a thin layer over the pybind11 module
``hf3fs_py_usrbio``), that lets a process hand reads and writes to the 3FS FUSE daemon
through shared memory instead of the kernel's FUSE path:

- an *iovec* is a shared-memory region registered with 3FS (``make_iovec(shm, mount)``);
  all data moves through it;
- an *ioring* is a submission/completion ring (``make_ioring(mount, entries, for_read)``),
  one direction per ring, not safe to share between threads;
- a file descriptor must be registered (``register_fd``) before its I/O goes through a
  ring, and deregistered (``deregister_fd``) before it is closed;
- ``ring.prepare(iov_slice, read, fd, offset, userdata)``, ``ring.submit()``,
  ``ring.wait(min_results=n)`` returns completions, each with ``.result`` (bytes or
  ``-errno``) and ``.userdata``, in completion order.

:func:`choose_usrbio` decides, and says why, whether the backend uses it:
``usrbio=off`` never; ``auto`` when the module imports, the path is on a 3FS mount
(``extract_mount_point``, which reads ``/proc/self/mountinfo`` for ``fuse.hf3fs``), and a
ring and an iovec can be created; ``on`` the same but failing loudly. Otherwise all I/O is
POSIX through the mount, by kvstored's own io engine.

:class:`UsrbioEngine` is an :class:`~kvstored.native.IoEngine`, so the backend uses it
exactly as it uses the uring and posix engines.
"""

from __future__ import annotations

import errno
import importlib
import logging
import os
import threading
import typing
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing import shared_memory
from types import ModuleType
from typing import Any

from kvstored.native import IoEngine, IoFile
from kvstored.native.direct import READ, WRITE, Op, Outcome
from kvstored.native.engine import FDATASYNC
from kvstored.sdk.errors import InvalidRequestError

log = logging.getLogger(__name__)

USRBIO_MODULE = "hf3fs_fuse.io"
MODES = ("auto", "on", "off")
_REQUIRED = ("make_iovec", "make_ioring", "register_fd", "deregister_fd",
             "extract_mount_point")
#: Requests one ring holds; also the engine's queue depth.
DEFAULT_ENTRIES = 64
#: Shared memory per thread that data is staged through (the caller and each I/O thread
#: has its own, with its rings).
DEFAULT_STAGING = 16 << 20


@dataclass(frozen=True)
class UsrbioChoice:
    """What :func:`choose_usrbio` decided: the engine to use (None: POSIX) and why."""

    engine: UsrbioEngine | None
    reason: str
    mount_point: str | None = None


def choose_usrbio(path: str, mode: str = "auto", *,
                  importer: Callable[[str], ModuleType] = importlib.import_module,
                  staging_bytes: int = DEFAULT_STAGING) -> UsrbioChoice:
    """Decide whether I/O under ``path`` goes through USRBIO; never guesses silently.

    Raises :class:`InvalidRequestError` for an unknown ``mode``, and, with ``mode="on"``,
    when USRBIO cannot be used (the message says which step failed).
    """
    if mode not in MODES:
        raise InvalidRequestError(f"usrbio must be one of {', '.join(MODES)}, not {mode!r}")
    if mode == "off":
        return UsrbioChoice(None, "usrbio=off: POSIX I/O through the mount")
    api, mount, reason = _probe(os.path.abspath(path), importer)
    engine = None
    if api is not None and mount is not None:  # _probe finds both or neither
        try:
            engine = engine_for(api, mount, staging_bytes=staging_bytes)
            engine.probe()
            reason = f"using USRBIO on the 3FS mount {mount}"
        except (OSError, RuntimeError, ValueError) as exc:
            engine = None
            reason = f"creating a USRBIO ring and iovec on {mount} failed ({exc})"
    if engine is None and mode == "on":
        raise InvalidRequestError(f"usrbio=on, but USRBIO cannot be used: {reason}. Use "
                                  "usrbio=auto to fall back to POSIX I/O", path=path)
    if engine is None:
        reason += "; falling back to POSIX I/O through the mount"
    return UsrbioChoice(engine, reason, mount)


def _probe(path: str, importer) -> tuple[Any, str | None, str]:
    try:
        api = importer(USRBIO_MODULE)
    except ImportError as exc:
        return None, None, (f"{USRBIO_MODULE} is not importable ({exc}); install 3FS's "
                            "Python package (hf3fs_fuse) to use USRBIO")
    missing = [name for name in _REQUIRED if not hasattr(api, name)]
    if missing:
        return None, None, (f"{USRBIO_MODULE} lacks {', '.join(missing)}: a 3FS version "
                            "this backend does not know")
    try:
        mount = api.extract_mount_point(path)
    except (OSError, RuntimeError, ValueError) as exc:
        return None, None, f"{USRBIO_MODULE}.extract_mount_point({path!r}) failed ({exc})"
    if not mount:
        return None, None, (f"{path} is not on a 3FS mount (no fuse.hf3fs mount above it "
                            "in /proc/self/mountinfo)")
    return api, str(mount), ""


_engines: dict[tuple[int, str, int], UsrbioEngine] = {}
_engines_lock = threading.Lock()


def engine_for(api: Any, mount: str, *, staging_bytes: int = DEFAULT_STAGING) -> UsrbioEngine:
    """The process-wide USRBIO engine for one mount (its rings are per thread)."""
    key = (id(api), mount, staging_bytes)
    with _engines_lock:
        engine = _engines.get(key)
        if engine is None:
            engine = _engines[key] = UsrbioEngine(api, mount, staging_bytes=staging_bytes)
        return engine


class RegisteredFile(IoFile):
    """An :class:`IoFile` whose descriptor is registered with USRBIO; closing it
    deregisters first, as 3FS requires."""

    __slots__ = ("_deregister",)

    def __init__(self, fd: int, path: str, deregister: Callable[[int], Any]) -> None:
        super().__init__(fd, path, False)
        self._deregister = deregister

    def close(self) -> None:
        if self.fd >= 0:
            try:
                self._deregister(self.fd)
            except (OSError, RuntimeError):
                pass  # the fd is closed regardless; 3FS forgets it with the descriptor
        super().close()


class _Lane:
    """One thread's shared memory and its two rings (a ring does one direction)."""

    def __init__(self, api: Any, mount: str, entries: int, staging: int) -> None:
        self.shm = shared_memory.SharedMemory(create=True, size=staging)
        try:
            self.iov = api.make_iovec(self.shm, mount)
        finally:
            self.shm.unlink()  # 3FS holds its own mapping; the name is not needed
        buf = self.shm.buf
        assert buf is not None  # a SharedMemory just created is mapped
        self.buf: memoryview = buf
        self.rings = {True: api.make_ioring(mount, entries, True, 0),
                      False: api.make_ioring(mount, entries, False, 0)}


class UsrbioEngine(IoEngine):
    """Batched I/O through 3FS USRBIO: each thread stages data through its own iovec
    and submits to its own rings, up to ``queue_depth`` requests per round."""

    name = "usrbio"
    #: Data moves through the lane's staging copy: vectored items are joined first.
    native_vectored = False

    def __init__(self, api: Any, mount: str, *, queue_depth: int = DEFAULT_ENTRIES,
                 staging_bytes: int = DEFAULT_STAGING) -> None:
        super().__init__(direct=False, queue_depth=queue_depth)
        self.api = api
        self.mount = mount
        self.staging_bytes = staging_bytes
        self._local = threading.local()

    def __repr__(self) -> str:
        return f"<UsrbioEngine on {self.mount} qd={self.queue_depth}>"

    def probe(self) -> None:
        """Create this thread's rings and iovec now, so that failure shows at open."""
        self._lane()

    def _lane(self) -> _Lane:
        lane = getattr(self._local, "lane", None)
        if lane is None:
            lane = self._local.lane = _Lane(self.api, self.mount, self.queue_depth,
                                            self.staging_bytes)
        return lane

    def open(self, path: str | os.PathLike[str], flags: int = os.O_RDONLY, mode: int = 0o644,
             *, direct: bool | None = None) -> IoFile:
        """Open and register ``path``. ``direct`` is ignored: data moves through shared
        memory, never through the page cache of this host."""
        path = os.fspath(path)
        fd = os.open(path, flags | os.O_CLOEXEC, mode)
        try:
            self.api.register_fd(fd)
        except BaseException:
            os.close(fd)
            raise
        return RegisteredFile(fd, path, self.api.deregister_fd)

    def _run(self, code: int, ops: Sequence[Op]) -> list[Outcome]:
        if code not in (READ, WRITE):
            return [_sync(code, op[0]) for op in ops]
        try:
            lane = self._lane()
        except (OSError, RuntimeError) as exc:
            failure = -(getattr(exc, "errno", None) or errno.EIO)
            return [(failure, 0)] * len(ops)
        try:
            return self._transfer_all(lane, code == READ, ops)
        except BaseException:
            self._local.lane = None  # its ring may hold requests we gave up on
            raise

    def _transfer_all(self, lane: _Lane, reading: bool, ops: Sequence[Op]) -> list[Outcome]:
        ring = lane.rings[reading]
        done = [0] * len(ops)
        outcomes: list[Outcome | None] = [None] * len(ops)
        todo: deque[int] = deque()
        for i, op in enumerate(ops):
            if op[2].nbytes == 0:
                outcomes[i] = (0, 0)
            else:
                todo.append(i)
        while todo:
            batch: list[tuple[int, int, int]] = []  # (op index, staging offset, length)
            pos = 0
            while todo and len(batch) < self.queue_depth and pos < self.staging_bytes:
                i = todo.popleft()
                fd, offset, view = ops[i][0], ops[i][1], ops[i][2]
                length = min(view.nbytes - done[i], self.staging_bytes - pos)
                if not reading:
                    lane.buf[pos:pos + length] = view[done[i]:done[i] + length]
                try:
                    ring.prepare(lane.iov[pos:pos + length], reading, fd, offset + done[i],
                                 len(batch))
                except OSError as exc:
                    outcomes[i] = (-(exc.errno or errno.EIO), done[i])
                    continue
                batch.append((i, pos, length))
                pos += length
            if not batch:
                continue
            try:
                completions = ring.submit().wait(min_results=len(batch))
            except OSError as exc:
                completions, lost = [], exc.errno or errno.EIO
            else:
                lost = errno.EIO
            finished = set()
            for completion in completions:
                i, pos, length = batch[completion.userdata]
                finished.add(completion.userdata)
                result = completion.result
                if result < 0:
                    outcomes[i] = (result, done[i])
                    continue
                target = typing.cast(memoryview, ops[i][2])
                if reading and result:
                    target[done[i]:done[i] + result] = lane.buf[pos:pos + result]
                done[i] += result
                if done[i] == target.nbytes:
                    outcomes[i] = (done[i], done[i])
                elif reading and result < length:
                    outcomes[i] = (done[i], done[i])  # end of file
                elif result == 0:
                    outcomes[i] = (-errno.EIO, done[i])  # a write that made no progress
                else:
                    todo.append(i)
            if len(finished) < len(batch):
                # Requests the ring never answered: fail them, and do not reuse a ring
                # that may still hold them.
                for n, (i, _, _) in enumerate(batch):
                    if n not in finished:
                        outcomes[i] = (-lost, done[i])
                self._local.lane = None
                if todo:
                    try:
                        lane = self._lane()
                    except (OSError, RuntimeError) as exc:
                        code = -(getattr(exc, "errno", None) or errno.EIO)
                        for i in todo:
                            outcomes[i] = (code, done[i])
                        break
                    ring = lane.rings[reading]
        return outcomes  # type: ignore[return-value]


def _sync(code: int, fd: int) -> Outcome:
    if fd < 0:
        return -errno.EBADF, 0
    try:
        (os.fdatasync if code == FDATASYNC else os.fsync)(fd)
    except OSError as exc:
        return -(exc.errno or errno.EIO), 0
    return 0, 0
