"""The POSIX engine: ``os.preadv``/``os.pwritev``, for machines without io_uring.

A vectored item is one ``preadv``/``pwritev`` over its pieces (at most ``IOV_MAX`` per
call; more, or a short transfer, continue where the last call stopped).

One thread does one transfer at a time, so on its own it runs at queue depth 1. A batch of
more than one item is therefore spread over a small pool of threads (``threads``, at most
the queue depth): the honest way to keep a few requests in flight with blocking calls.
Each call releases the GIL while the kernel works. Needs nothing compiled.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from kvstored.native.direct import READ, VECTORED, Op, Outcome, Pieces
from kvstored.native.engine import FDATASYNC, FSYNC, IoEngine

#: Threads the POSIX engine uses at most by default: enough to overlap a few requests on
#: an SSD, few enough not to swamp a small machine with GIL hand-offs.
DEFAULT_THREADS = 4
#: Buffers one preadv/pwritev takes at most (the kernel says EINVAL beyond).
IOV_MAX = os.sysconf("SC_IOV_MAX") if "SC_IOV_MAX" in os.sysconf_names else 1024


def _transfer(code: int, op: Op) -> Outcome:
    fd, offset, view, pointer, align = op
    if pointer is VECTORED:
        return _transfer_pieces(code, fd, offset, view, align)
    length = view.nbytes
    if length == 0:
        return 0, 0
    done = 0
    call = os.preadv if code == READ else os.pwritev
    while done < length:
        try:
            moved = call(fd, [view[done:]], offset + done)
        except OSError as exc:
            return -(exc.errno or errno.EIO), done
        if moved == 0:  # end of file for a read; no progress for a write
            return (done, done) if code == READ else (-errno.EIO, done)
        done += moved
        if code == READ and align and (offset + done) % align:
            break  # O_DIRECT ends off a block only at end of file (io_uring_core.c)
    return done, done


def _transfer_pieces(code: int, fd: int, offset: int, pieces: Pieces, align: int) -> Outcome:
    """A vectored item: the same loop as :func:`_transfer`, the iovec advanced past what
    each call moved."""
    length = pieces.nbytes
    if length == 0:
        return 0, 0
    views = list(pieces.views)
    first = done = 0  # views[first] is the first piece not yet entirely moved
    call = os.preadv if code == READ else os.pwritev
    while done < length:
        try:
            moved = call(fd, views[first:first + IOV_MAX], offset + done)
        except OSError as exc:
            return -(exc.errno or errno.EIO), done
        if moved == 0:
            return (done, done) if code == READ else (-errno.EIO, done)
        done += moved
        while moved:
            size = views[first].nbytes
            if moved < size:
                views[first] = views[first][moved:]
                break
            moved -= size
            first += 1
        if code == READ and align and (offset + done) % align:
            break
    return done, done


def _sync(code: int, op: Op) -> Outcome:
    if op[0] < 0:  # a closed IoFile; os.fsync would raise ValueError rather than EBADF
        return -errno.EBADF, 0
    try:
        (os.fdatasync if code == FDATASYNC else os.fsync)(op[0])
    except OSError as exc:
        return -(exc.errno or errno.EIO), 0
    return 0, 0


def _run_serial(code: int, ops: Sequence[Op]) -> list[Outcome]:
    one = _sync if code in (FSYNC, FDATASYNC) else _transfer
    return [one(code, op) for op in ops]


class PosixEngine(IoEngine):
    """Blocking ``preadv``/``pwritev``/``fdatasync`` spread over a small thread pool.

    ``threads`` (default ``min(queue_depth, 4)``) is how many items are in flight at once;
    ``threads=1`` runs every batch in the caller's thread. No fixed buffers.
    """

    name = "posix"

    def __init__(self, *, direct: bool = False, queue_depth: int = 32,
                 threads: int | None = None):
        super().__init__(direct=direct, queue_depth=queue_depth)
        self.threads = max(1, threads if threads is not None
                           else min(queue_depth, DEFAULT_THREADS))
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()

    def _executor(self) -> ThreadPoolExecutor:
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.threads - 1,
                                                thread_name_prefix="kvstored-posix-io")
            return self._pool

    def _run(self, code: int, ops: Sequence[Op]) -> list[Outcome]:
        lanes = min(self.threads, len(ops))
        if lanes <= 1:
            return _run_serial(code, ops)
        # Lane k takes items k, k+lanes, ...; the caller's thread works lane 0 itself.
        pool = self._executor()
        futures = [pool.submit(_run_serial, code, ops[k::lanes]) for k in range(1, lanes)]
        outcomes: list[Outcome] = [(0, 0)] * len(ops)
        outcomes[0::lanes] = _run_serial(code, ops[0::lanes])
        for k, future in enumerate(futures, start=1):
            outcomes[k::lanes] = future.result()
        return outcomes
