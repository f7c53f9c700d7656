"""The engine API both io engines share: files, batches, per-item results.

An :class:`IoEngine` turns a batch of ``(file, offset, buffer)`` items into requests,
sends unaligned items on O_DIRECT files through bounce buffers (:mod:`.direct`), and hands
the rest to its ``_run``. Subclasses supply ``_run`` (and may supply fixed buffers).
"""

from __future__ import annotations

import abc
import collections
import errno
import logging
import operator
import os
import threading
import typing
import warnings
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Protocol, TypeVar

import cffi

from kvstored.native import direct
from kvstored.native.direct import ALIGN, READ, VECTORED, WRITE, Op, Outcome, Pieces
from kvstored.native.errors import IoError, log_once
from kvstored.native.scratch import ScratchLoan, ScratchPool

try:  # the compiled module's ffi, so pointers made here can go straight into requests
    from kvstored.native._io import ffi as _ffi
except ImportError:  # not built: the POSIX engine needs addresses only
    _ffi = cffi.FFI()

FSYNC, FDATASYNC = 2, 3  # the KV_OP_* codes of io_uring_core.h
_ALIGN_MASK = ALIGN - 1
_MAX_END = 2**63 - 1  # off_t

#: ``(file, offset, buffer)``: one item of a read or write batch. ``buffer`` may also be
#: a list or tuple of buffers (a vectored item).
Item = tuple["IoFile", int, Any]
#: What a write batch's item ended with, before it is synced (a byte count, or None).
R = TypeVar("R")
#: A batch made ready for ``_run`` (:meth:`IoEngine._prepare`): its requests (None where
#: an item goes through the bounce buffer), those bounced items ``{index: (fd, offset,
#: buffer)}``, and the vectored items joined into one buffer ``{index: (buffer, pieces)}``.
Prepared = tuple[list["Op | None"], dict[int, tuple[int, int, memoryview]],
                 dict[int, tuple[memoryview, Pieces]]]
#: Most buffers in one vectored item: ample for header + value + padding, and it keeps a
#: careless caller from building a kernel-sized iovec by accident.
MAX_PIECES = 65536


class PendingBatch(Protocol):
    """A batch started by :meth:`IoEngine.start_read` or :meth:`IoEngine.start_write`."""

    def wait(self) -> list[int | IoError]:
        """Blocks (GIL released) until every item is done; the results, as ``read`` or
        ``write`` returns them. A second call returns the same list."""
        ...


class FinishedBatch:
    """A batch that was run to the end when it was started (the posix engine, any batch
    the general path takes, and a caller that ran ``read`` and wants a
    :class:`PendingBatch` of its results)."""

    __slots__ = ("results",)

    def __init__(self, results: list[int | IoError]):
        self.results = results

    def wait(self) -> list[int | IoError]:
        return self.results


class LentBatch:
    """A read batch whose requests fill scratch memory lent by a :class:`ScratchPool`.

    With a ``loan``, the batch is started (:meth:`IoEngine.start_read`) and stays in
    flight until :meth:`wait`; without one, it is read to the end here (``engine.read``,
    into the caller's own scratch, nothing left in flight). :meth:`close` waits for the
    batch if nobody did, then gives the loan back: the pool never lends memory that the
    kernel may still fill. Closed on another thread than the one that started it (which
    cannot wait for it: the batch is in that thread's ring), it drops the loan instead
    of giving it back, and the batch holds its memory for as long as it needs."""

    __slots__ = ("loan", "pending", "pool", "thread")

    def __init__(self, engine: IoEngine, items: list[Item], pool: ScratchPool | None = None,
                 loan: ScratchLoan | None = None) -> None:
        self.pool, self.loan = pool, loan
        self.thread = threading.get_ident()
        self.pending: PendingBatch = (engine.start_read(items) if loan is not None
                                      else FinishedBatch(engine.read(items)))

    def wait(self) -> list[int | IoError]:
        return self.pending.wait()

    def close(self) -> None:
        loan, self.loan = self.loan, None
        if loan is None or threading.get_ident() != self.thread:
            return
        self.pending.wait()
        assert self.pool is not None, "a loan comes with its pool"
        self.pool.give_back(loan)


class IoFile:
    """A file opened by :meth:`IoEngine.open` (or wrapping a descriptor you own).

    ``direct`` tells whether the descriptor really has O_DIRECT: it is ``False`` when the
    file system refused O_DIRECT and the engine fell back to buffered I/O. ``close()`` is
    idempotent; items naming a closed file fail with EBADF, each on its own.
    """

    __slots__ = ("direct", "fd", "path")

    def __init__(self, fd: int, path: str, direct: bool = False):
        self.fd = fd
        self.path = path
        self.direct = direct

    @property
    def closed(self) -> bool:
        return self.fd < 0

    def fileno(self) -> int:
        return self.fd

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)

    def __enter__(self) -> IoFile:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "fd", -1) >= 0:
            warnings.warn(f"unclosed IoFile {self.path}", ResourceWarning, stacklevel=2)
            try:
                self.close()
            except OSError:
                pass  # a wrapped descriptor that was never valid

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"fd={self.fd}"
        return f"IoFile({self.path!r}, {state}, direct={self.direct})"


def _as_offset(offset: Any, index: int) -> int:
    try:
        return operator.index(offset)  # numpy integers are welcome
    except TypeError:
        raise ValueError(f"item {index}: the offset must be an int >= 0, got {offset!r}") from None


def _byte_view(buffer: Any, index: int | str, writable: bool) -> memoryview:
    try:
        view = memoryview(buffer)
    except TypeError:
        raise TypeError(f"item {index}: a {type(buffer).__name__} is not a buffer; pass a "
                        f"bytearray, memoryview, mmap or numpy array") from None
    if writable and view.readonly:
        raise TypeError(f"item {index}: a read needs a writable buffer, got a read-only "
                        f"{type(buffer).__name__}")
    if not view.c_contiguous:
        raise ValueError(f"item {index}: the buffer is not contiguous; copy it first")
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view


def _pieces(buffers: list | tuple, index: int, writable: bool) -> Pieces:
    """The validated pieces of a vectored item; empty pieces are dropped."""
    if len(buffers) > MAX_PIECES:
        raise ValueError(f"item {index}: {len(buffers)} buffers in one item; at most "
                         f"{MAX_PIECES}")
    views = []
    nbytes = 0
    for number, buffer in enumerate(buffers):
        view = buffer
        if (type(view) is not memoryview or view.format != "B" or view.ndim != 1
                or not view.c_contiguous or (writable and view.readonly)):
            if type(buffer) is list or type(buffer) is tuple:
                raise TypeError(f"item {index}: piece {number} is a {type(buffer).__name__}; "
                                f"the pieces of a vectored item must be buffers, not nested")
            view = _byte_view(buffer, f"{index}, piece {number}", writable)
        if view.nbytes:
            views.append(view)
            nbytes += view.nbytes
    return Pieces(views, nbytes)


def _pieces_aligned(pieces: Pieces, offset: int) -> bool:
    """Whether O_DIRECT takes ``pieces`` as they are; keeps their pointers when it does."""
    if offset & _ALIGN_MASK:
        return False
    from_buffer, cast = _ffi.from_buffer, _ffi.cast
    pointers = []
    for view in pieces.views:
        pointer = from_buffer(view)
        if (view.nbytes | int(cast("uintptr_t", pointer))) & _ALIGN_MASK:
            return False
        pointers.append(pointer)
    pieces.pointers = pointers
    return True


def _offset_message(index: int, offset: int, nbytes: int) -> str:
    return (f"item {index}: the offset must be >= 0 and the item end before 2**63, got "
            f"offset {offset} for {nbytes} bytes")


def _vectored_op(code: int, index: int, file: IoFile, offset: int, buffers: list | tuple,
                 bounced: dict, joined: dict, native: bool) -> Op | None:
    """The request for a vectored item.

    It is joined into one buffer (an entry in ``joined``, scattered back after a read)
    when the engine has no vectored requests (``native`` False) or O_DIRECT cannot take
    its pieces as they are; a joined item on an O_DIRECT file is bounced (an entry in
    ``bounced``, and None returned)."""
    pieces = _pieces(buffers, index, code == READ)
    if offset < 0 or offset + pieces.nbytes > _MAX_END:
        raise ValueError(_offset_message(index, offset, pieces.nbytes))
    if native and not (file.direct and pieces.nbytes and not _pieces_aligned(pieces, offset)):
        return (file.fd, offset, pieces, VECTORED, ALIGN if file.direct else 0)
    view = direct.join(code, pieces)
    joined[index] = (view, pieces)
    if file.direct and view.nbytes:
        bounced[index] = (file.fd, offset, view)
        return None
    return (file.fd, offset, view, None, 0)


def _nbytes(buffer: Any) -> int:
    if type(buffer) is list or type(buffer) is tuple:
        return sum(memoryview(piece).nbytes for piece in buffer)
    return memoryview(buffer).nbytes


class IoEngine(abc.ABC):
    """Batched file I/O with a result per item. Both engines honour this contract:

    - ``read``/``write``/``fsync`` **block** the calling thread until every item of the
      batch is finished, and no longer hold the GIL while they wait, so other threads run.
    - All items of a batch are started together; up to the engine's queue depth are in
      flight at once. Their order of completion is unspecified: items that write
      overlapping bytes leave either version in the overlap.
    - Each item gets its own result, in the batch's order: the number of bytes moved, or an
      :class:`IoError` (errno, path, offset, bytes done) which is *returned*, not raised.
      A bad descriptor, EIO or ENOSPC fails that item alone.
    - Reads and writes are complete: a short transfer is continued until done. A read comes
      back short only at end of file; an item of zero bytes returns 0 without touching the
      file.
    - Malformed batches (not ``(IoFile, offset >= 0, buffer)``, or a read into read-only
      memory) raise ``TypeError``/``ValueError`` before any I/O starts.
    - On O_DIRECT files, items need not be aligned (see :mod:`kvstored.native.direct`);
      aligned ones go straight to the file.
    - **Vectored items**: the buffer may be a list or tuple of buffers. They are moved back
      to back from the item's offset as one request (``preadv``/``pwritev``;
      ``IORING_OP_READV``/``WRITEV``), so a record's header and its value in the caller's
      memory need neither two requests nor a copy. The item's result is the same as for
      one buffer of their total length: the bytes moved (a read fills the pieces in order
      and is short only at end of file) or an IoError. Empty pieces are skipped; at most
      :data:`MAX_PIECES` per item; pieces may not be nested. On an O_DIRECT file the item
      goes straight to the file when its offset and every piece's address and length are
      4 KiB multiples; otherwise it is joined into one buffer and bounced (a copy).
      Vectored items never use fixed buffers. The engine holds the pieces until the batch
      returns; do not resize or free them meanwhile.
    - An engine may be shared by any number of threads.
    - **Batches in flight across calls**: :meth:`start_read`/:meth:`start_write` start a
      batch and return a :class:`PendingBatch` at once; its ``wait()`` returns what
      ``read``/``write`` would have. :meth:`read_stream`/:meth:`write_stream` use them to
      keep the queue full from one batch to the next. Items of batches in flight together
      may complete in any order, across batches too. Every buffer of a started batch stays
      the engine's until its ``wait()`` returns; a batch is waited for by the thread that
      started it (``RuntimeError`` otherwise). Engines without a queue that outlives a
      call (posix) run the batch to the end inside ``start_*``: same results, no overlap.
    """

    #: ``"uring"`` or ``"posix"``.
    name: str = ""
    #: Whether ``_run`` takes vectored requests. An engine that does not gets each
    #: vectored item joined into one buffer by this class (a copy), so the contract
    #: holds for it all the same.
    native_vectored: bool = True

    def __init__(self, *, direct: bool = False, queue_depth: int = 32):
        if queue_depth < 1:
            raise ValueError(f"queue_depth must be >= 1, got {queue_depth}")
        #: Whether :meth:`open` asks for O_DIRECT when its caller does not say.
        self.direct = direct
        self.queue_depth = queue_depth

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} qd={self.queue_depth} direct={self.direct}>"

    # -- files -------------------------------------------------------------------------

    def open(self, path: str | os.PathLike[str], flags: int = os.O_RDONLY, mode: int = 0o644,
             *, direct: bool | None = None) -> IoFile:
        """Opens ``path`` with ``os.open`` flags; ``direct=None`` follows the engine default.

        When the file system refuses O_DIRECT (EINVAL), the file is opened buffered, its
        ``direct`` is False, and one line per file system is logged. Raises ``OSError``
        (with the path) when the file cannot be opened at all.
        """
        path = os.fspath(path)
        want_direct = self.direct if direct is None else direct
        flags |= os.O_CLOEXEC
        if not want_direct:
            return IoFile(os.open(path, flags, mode), path, False)
        try:
            return IoFile(os.open(path, flags | os.O_DIRECT, mode), path, True)
        except OSError as exc:
            if exc.errno != 22:  # EINVAL: this file system has no O_DIRECT
                raise
        # Linux creates the file before it checks O_DIRECT, so O_EXCL must go now.
        fd = os.open(path, flags & ~os.O_EXCL, mode)
        log_once(("no-odirect", os.fstat(fd).st_dev), logging.WARNING,
                 "the file system of %s refuses O_DIRECT; files there use buffered I/O", path)
        return IoFile(fd, path, False)

    # -- batches -----------------------------------------------------------------------

    def read(self, items: Iterable[Item]) -> list[int | IoError]:
        """Reads each ``(file, offset, buffer)`` into its buffer (``len(buffer)`` bytes, or
        into each buffer in turn of a vectored item).

        Returns per item the bytes read (fewer only at end of file) or an IoError.
        """
        return self._transfer(READ, list(items))

    def write(self, items: Iterable[Item]) -> list[int | IoError]:
        """Writes each ``(file, offset, buffer)``. Returns per item ``len(buffer)`` or an
        IoError (``done`` tells how much was written before, e.g., ENOSPC)."""
        return self._transfer(WRITE, list(items))

    def start_read(self, items: Iterable[Item]) -> PendingBatch:
        """Starts ``read(items)`` and returns without waiting for it; ``wait()`` on the
        result gives what ``read`` returns. A malformed batch raises here, before any
        I/O. The buffers are the engine's until ``wait()`` returns."""
        return self._start(READ, list(items))

    def start_write(self, items: Iterable[Item]) -> PendingBatch:
        """Starts ``write(items)``; as :meth:`start_read`."""
        return self._start(WRITE, list(items))

    def read_stream(self, batches: Iterable[Iterable[Item]], *, ahead: int = 1
                    ) -> Iterator[list[int | IoError]]:
        """Reads batch after batch, yielding each batch's results (as ``read``) in order,
        with up to ``ahead`` later batches already in flight: the queue stays full while
        the caller looks at one batch's results and ``batches`` makes the next (it is
        consumed lazily, one batch ahead of what was yielded). A buffer may be reused
        once its batch's results were yielded. Closing the iterator early waits for the
        batches in flight."""
        return self._stream(READ, batches, ahead)

    def write_stream(self, batches: Iterable[Iterable[Item]], *, ahead: int = 1
                     ) -> Iterator[list[int | IoError]]:
        """Writes batch after batch; as :meth:`read_stream`."""
        return self._stream(WRITE, batches, ahead)

    def _stream(self, code: int, batches: Iterable[Iterable[Item]], ahead: int
                ) -> Iterator[list[int | IoError]]:
        if ahead < 0:
            raise ValueError(f"ahead must be >= 0, got {ahead}")
        return self._streaming(code, batches, ahead)

    def _streaming(self, code: int, batches: Iterable[Iterable[Item]], ahead: int
                   ) -> Iterator[list[int | IoError]]:
        in_flight: collections.deque[PendingBatch] = collections.deque()
        try:
            for batch in batches:
                in_flight.append(self._start(code, list(batch)))
                if len(in_flight) > ahead:
                    yield in_flight.popleft().wait()
            while in_flight:
                yield in_flight.popleft().wait()
        finally:
            while in_flight:  # closed early: never hand back buffers the kernel still fills
                in_flight.popleft().wait()

    def _start(self, code: int, items: list) -> PendingBatch:
        """Starts a batch; engines with a queue that outlives a call override this."""
        return FinishedBatch(self._transfer(code, items))

    def fsync(self, files: Iterable[IoFile], datasync: bool = True) -> list[int | IoError]:
        """``fdatasync`` (or ``fsync`` with ``datasync=False``) each file, together.
        Returns per file 0 or an IoError."""
        files = list(files)
        for index, file in enumerate(files):
            if not isinstance(file, IoFile):
                raise TypeError(f"file {index}: expected an IoFile, got {type(file).__name__}")
        code = FDATASYNC if datasync else FSYNC
        outcomes = self._run(code, [(f.fd, 0, None, None, 0) for f in files]) if files else []
        op = "fdatasync" if datasync else "fsync"
        return [result if result >= 0 else _error(-result, f, None, op, 0, 0)
                for f, (result, _) in zip(files, outcomes)]

    def register_buffer(self, buffer: Any) -> bool:
        """Registers ``buffer`` (writable, kept referenced for the engine's life) as a
        fixed buffer: items whose memory lies inside it then skip the kernel's per-I/O page
        pinning. Returns False when the engine has no fixed buffers or registration failed
        (too low RLIMIT_MEMLOCK, too many buffers); I/O works the same either way."""
        return False

    def _transfer(self, code: int, items: list) -> list[int | IoError]:
        if not items:
            return []
        prepared = self._prepare(code, items)
        ops, bounced, _ = prepared
        if not bounced:
            outcomes = self._run(code, typing.cast("list[Op]", ops))  # None marks a bounce
        elif code == READ:
            outcomes = direct.read_through_bounce(self._run, ops, bounced)
        else:
            outcomes = direct.write_through_bounce(self._run, ops, bounced)
        return self._conclude(code, items, prepared, outcomes)

    def _prepare(self, code: int, items: list) -> Prepared:
        """The requests of ``items`` (checked), with the items that go through the bounce
        buffer (unaligned for O_DIRECT) and the vectored ones joined into one buffer."""
        writable = code == READ
        ops: list[Op | None] = []
        bounced: dict[int, tuple[int, int, memoryview]] = {}
        joined: dict[int, tuple[memoryview, Pieces]] = {}  # vectored items, joined
        append, from_buffer, cast = ops.append, _ffi.from_buffer, _ffi.cast
        # This loop is the per-item cost of every batch: keep it lean.
        for index, item in enumerate(items):
            try:
                file, offset, buffer = item
            except (TypeError, ValueError):
                raise TypeError(f"item {index}: expected (IoFile, offset, buffer), "
                                f"got {item!r:.80}") from None
            if not isinstance(file, IoFile):
                raise TypeError(f"item {index}: expected an IoFile, got {type(file).__name__}")
            if type(offset) is not int:
                offset = _as_offset(offset, index)
            view = buffer
            if (type(view) is not memoryview or view.format != "B" or view.ndim != 1
                    or not view.c_contiguous or (writable and view.readonly)):
                if type(buffer) is list or type(buffer) is tuple:
                    append(_vectored_op(code, index, file, offset, buffer, bounced, joined,
                                        self.native_vectored))
                    continue
                view = _byte_view(buffer, index, writable)
            if offset < 0 or offset + view.nbytes > _MAX_END:
                raise ValueError(_offset_message(index, offset, view.nbytes))
            if file.direct and view.nbytes:
                pointer = from_buffer(view)
                if (offset | view.nbytes | int(cast("uintptr_t", pointer))) & _ALIGN_MASK:
                    bounced[index] = (file.fd, offset, view)
                    append(None)
                    continue
                append((file.fd, offset, view, pointer, ALIGN))
            else:
                append((file.fd, offset, view, None, 0))
        return ops, bounced, joined

    @staticmethod
    def _conclude(code: int, items: list, prepared: Prepared, outcomes: Sequence[Outcome]
                  ) -> list[int | IoError]:
        """The results of ``items``, run as ``prepared`` with ``outcomes``."""
        _, bounced, joined = prepared
        if joined and code == READ:
            for index, (view, pieces) in joined.items():
                result, done = outcomes[index]
                direct.scatter(view, pieces, result if result >= 0 else done)
        op = "read" if code == READ else "write"
        results: list[int | IoError] = []
        for index, (item, (result, done)) in enumerate(zip(items, outcomes)):
            if result >= 0:
                results.append(result)
                continue
            file, offset, buffer = item
            error = _error(-result, file, offset, op, _nbytes(buffer), done)
            if index in bounced and code == WRITE and error.errno == errno.EBADF \
                    and not file.closed:
                error = _error(-result, file, offset, op, _nbytes(buffer), done,
                               "an unaligned write to an O_DIRECT file reads its edge "
                               "blocks first: open the file O_RDWR, not O_WRONLY")
            results.append(error)
        return results

    @abc.abstractmethod
    def _run(self, code: int, ops: Sequence[Op]) -> list[Outcome]:
        """Runs requests ``(fd, offset, view, pointer or None, align)`` and returns
        ``(bytes or -errno, bytes done)`` for each, completing short transfers. A vectored
        request is ``(fd, offset, Pieces, VECTORED, align)``."""


def _error(number: int, file: IoFile, offset: int | None, op: str, length: int,
           done: int, detail: str = "") -> IoError:
    if file.closed:
        detail = "the IoFile was closed"
    return IoError(number, file.path, offset, op=op, length=length, done=done, detail=detail)


# The write-then-fsync of every backend. Functions, not methods, so that they call the
# ``write`` and ``fsync`` of whatever engine they are given: a wrapper that overrides one
# of those (a fault injector, a test double) is honoured.

def write_synced(engine: IoEngine, items: Iterable[Item], *, datasync: bool = True
                 ) -> list[int | IoError]:
    """``engine.write`` the batch, then :func:`sync_written`. Returns per item
    ``len(buffer)`` once it is durable, or the IoError of its write or of its file's
    sync."""
    items = list(items)
    return sync_written(engine, [item[0] for item in items], engine.write(items),
                        datasync=datasync)


def sync_written(engine: IoEngine, files: Sequence[IoFile], results: Sequence[R], *,
                 datasync: bool = True) -> list[R | IoError]:
    """Make a batch that was written durable: ``files[i]`` is the file item ``i`` wrote
    and ``results[i]`` how its write ended (an ``OSError`` when it failed). Each file
    that one item reached without error is fdatasync'd (``fsync`` with
    ``datasync=False``) once, all together; returns ``results`` with every item that had
    not failed but whose file did not sync given that sync's IoError."""
    if len(files) != len(results):
        raise ValueError(f"{len(files)} files but {len(results)} results")
    written: dict[int, IoFile] = {}  # by id: an IoFile is not hashable by value
    for file, result in zip(files, results):
        if not isinstance(result, OSError):
            written.setdefault(id(file), file)
    synced = dict(zip(written, engine.fsync(list(written.values()), datasync=datasync)))
    failed = {ident: outcome for ident, outcome in synced.items()
              if isinstance(outcome, IoError)}
    return [failed.get(id(file), result) if not isinstance(result, OSError) else result
            for file, result in zip(files, results)]
