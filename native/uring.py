"""The io_uring engine: each thread submits through rings of its own.

The C side (io_uring_core.c) runs a whole batch per call: it keeps up to ``queue_depth``
requests in flight, completes short transfers, and blocks with the GIL released until the
batch is done. A thread's ring is created on its first batch and destroyed with the thread;
a forked child makes its own.

Batches started to stay in flight across calls (``start_read``: read streams) go to a
second ring of the thread, served by a worker thread in C that refills the queue as each
request completes. A ring the caller runs itself is refilled only during the caller's
calls, so while a stream hands out one group's results the disk's queue drained: 4 KiB
objects streamed from bucket kept about 19 reads in the device instead of fio's 22-23.
One batch waited for at once stays on the thread's own ring, as handing it to a worker
and back costs 70-80 us on this VM (its other vCPU has to wake), against 4 us from the
page cache (docs/benchmarks.md, "A worker thread for read streams"); so does a started
batch that fits the queue while both rings are idle (:meth:`UringEngine._start_ring`).

Vectored items go as READV/WRITEV: their pieces reach C as two flat arrays (addresses,
lengths) for the whole batch, in batch order.

A plain read or write batch (every item one contiguous buffer, aligned where the file is
O_DIRECT) is built, run and answered by one call into ``_batch`` (native/batch.c), which
turns the items into requests in C: about 0.1 us an item where doing it here cost 2 to 7.
Any other batch, or every batch where ``_batch`` was not built, takes the general path of
engine.py, with the same results; started, it is pushed all the same (``_PushedBatch``).

Fixed buffers are registered per ring: :meth:`UringEngine.register_buffer` registers on
the calling thread's ring at once (so it can say whether that worked), and every other
thread's ring picks the set up before its next batch. Each ring pins the memory again, so a
process without CAP_IPC_LOCK pays RLIMIT_MEMLOCK once per ring using the buffer.
"""

from __future__ import annotations

import importlib
import logging
import os
import resource
import threading
import typing
from collections.abc import Sequence
from typing import Any

from kvstored.native._io import ffi, lib
from kvstored.native.direct import ALIGN, READ, VECTORED, Op, Outcome
from kvstored.native.engine import IoEngine, IoFile, PendingBatch, Prepared, _error, _nbytes
from kvstored.native.errors import IoError, log, log_once
from kvstored.sdk.units import format_size

try:  # by name: the module exists only once built
    _batch = importlib.import_module("kvstored.native._batch")
except ImportError:  # an optional extension (setup.py): the general path does it all
    _batch = None

_PENDING = -(2**63)  # kv_req.result of a request the ring never finished


def _address(name: str) -> int:
    return int(ffi.cast("uintptr_t", ffi.addressof(lib, name)))


#: The ring functions' addresses, for _batch to call the one copy of the ring code.
_RUN_ADDRESS = _address("kv_ring_run")
_PUSH_ADDRESS = _address("kv_ring_push")
_WAIT_ADDRESS = _address("kv_ring_wait")

#: The deepest queue a ring is made with; deeper asks are refused, not silently cut.
MAX_QUEUE_DEPTH = 4096


class _Ring:
    """One of a thread's rings (``served``: by a worker thread of its own); freed
    (io_uring_queue_exit, the worker joined) when the last reference goes."""

    __slots__ = ("address", "generation", "handle", "pid", "served")

    def __init__(self, depth: int, served: bool = False):
        out = ffi.new("struct kv_ring **")
        rc = (lib.kv_ring_create_served if served else lib.kv_ring_create)(depth, out)
        if rc < 0:
            raise OSError(-rc, f"cannot create an io_uring of depth {depth} for thread "
                               f"{threading.current_thread().name}: {os.strerror(-rc)}")
        self.handle = ffi.gc(out[0], lib.kv_ring_destroy)
        self.address = int(ffi.cast("uintptr_t", self.handle))  # for _batch
        self.pid = os.getpid()
        self.served = served
        self.generation = 0  # which set of fixed buffers it has registered


def _memlock_limit() -> str:
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return "unlimited" if soft == resource.RLIM_INFINITY else format_size(soft)


class UringEngine(IoEngine):
    """io_uring through liburing: one ring per thread, ``queue_depth`` requests in flight
    per ring, fixed buffers where registered. Construct through
    :func:`kvstored.native.get_engine`, which checks first that io_uring works here.

    Besides the :class:`IoEngine` contract: a thread's first batch creates its ring and
    raises ``OSError`` if the kernel refuses (ENOMEM). Should the ring itself fail mid-batch
    (never seen in practice), the unfinished items fail with that errno and the thread gets
    a fresh ring next time.
    """

    name = "uring"

    def __init__(self, *, direct: bool = False, queue_depth: int = 32):
        if queue_depth > MAX_QUEUE_DEPTH:
            raise ValueError(f"queue_depth {queue_depth} is deeper than {MAX_QUEUE_DEPTH}")
        super().__init__(direct=direct, queue_depth=queue_depth)
        self._local = threading.local()
        self._fixed: tuple[tuple[memoryview, Any], ...] = ()  # (view, pointer), published whole
        self._generation = 0
        self._register_lock = threading.Lock()

    # -- rings -------------------------------------------------------------------------

    def _ring(self, served: bool = False) -> _Ring:
        """The calling thread's ring: the one it runs itself, or (``served``) the one a
        worker serves."""
        name = "served" if served else "ring"
        ring = getattr(self._local, name, None)
        if ring is None or ring.pid != os.getpid():
            ring = _Ring(self.queue_depth, served)
            setattr(self._local, name, ring)
        if ring.generation != self._generation:
            generation, fixed = self._generation, self._fixed
            rc = self._register(ring, fixed)
            if rc < 0:
                self._log_register_failure(rc, fixed)
            ring.generation = generation
        return ring

    @staticmethod
    def _register(ring: _Ring, fixed: tuple[tuple[memoryview, Any], ...]) -> int:
        spans = ffi.new("struct kv_span[]", max(len(fixed), 1))
        for i, (view, pointer) in enumerate(fixed):
            spans[i].base = pointer
            spans[i].len = view.nbytes
        return lib.kv_ring_register_buffers(ring.handle, spans, len(fixed))

    @staticmethod
    def _log_register_failure(rc: int, fixed: tuple) -> None:
        total = format_size(sum(view.nbytes for view, _ in fixed))
        log_once(("uring-register-failed", -rc), logging.WARNING,
                 "io_uring could not register %s of fixed buffers (%s; RLIMIT_MEMLOCK is "
                 "%s): I/O continues without fixed buffers", total, os.strerror(-rc),
                 _memlock_limit())

    def register_buffer(self, buffer: Any) -> bool:
        view = memoryview(buffer)
        if view.readonly:
            raise TypeError(f"a fixed buffer must be writable, got a read-only "
                            f"{type(buffer).__name__}")
        if not view.c_contiguous or not view.nbytes:
            raise ValueError("a fixed buffer must be contiguous and not empty")
        view = view.cast("B") if view.format != "B" or view.ndim != 1 else view
        pointer = ffi.from_buffer(view, require_writable=True)
        start = int(ffi.cast("uintptr_t", pointer))
        with self._register_lock:
            for known, known_pointer in self._fixed:
                if (int(ffi.cast("uintptr_t", known_pointer)) == start
                        and known.nbytes == view.nbytes):
                    return True
            if len(self._fixed) >= lib.KV_MAX_FIXED_BUFFERS:
                log_once("uring-too-many-fixed", logging.WARNING,
                         "io_uring: at most %d fixed buffers; this one stays unregistered",
                         lib.KV_MAX_FIXED_BUFFERS)
                return False
            candidate = (*self._fixed, (view, pointer))
            ring = self._ring()
            rc = self._register(ring, candidate)
            if rc < 0:
                self._log_register_failure(rc, candidate)
                return False
            self._fixed = candidate
            self._generation += 1
            ring.generation = self._generation
            return True

    def ring_stats(self) -> dict[str, int]:
        """Counters of the calling thread's rings, summed (its own ring created if
        needed): ``sqes`` queued, ``fixed_sqes`` and ``vec_sqes`` (READV/WRITEV) among
        them, ``fences`` (NOPs linked after syncs, see io_uring_core.c), ``resubmits``
        of short transfers, ``submits`` (entries into the kernel that started requests:
        one per request, see io_uring_core.c)."""
        stats = ffi.new("struct kv_stats *")
        names = ("sqes", "fixed_sqes", "resubmits", "vec_sqes", "fences", "submits")
        totals: dict[str, int] = dict.fromkeys(names, 0)
        served = self._served_if_any()
        for ring in [self._ring()] + ([served] if served is not None else []):
            lib.kv_ring_stats(ring.handle, stats)
            for name in names:
                totals[name] += getattr(stats, name)
        return totals

    # -- batches -----------------------------------------------------------------------

    def _transfer(self, code: int, items: list) -> list[int | IoError]:
        if _batch is None or not items:
            return super()._transfer(code, items)
        ring = self._ring()
        ran = _batch.transfer(code, items, IoFile, ring.address, _RUN_ADDRESS, ALIGN)
        if ran is None:  # not a plain batch: engine.py bounces, joins or explains
            return super()._transfer(code, items)
        return self._answer(ring, code, items, ran)

    def _start_ring(self, count: int) -> _Ring:
        """The ring a batch of ``count`` requests started now goes to. The served one,
        unless both rings are idle and the batch fits the queue: then all of it goes to
        the kernel at once, nothing will need refilling, and the thread's own ring
        spares it the two handovers (a single SSD get's read, or a stream's first
        group)."""
        own, served = self._ring(), self._served_if_any()
        if count > self.queue_depth or lib.kv_ring_pending(own.handle) or (
                served is not None and lib.kv_ring_pending(served.handle)):
            return self._ring(served=True)
        return own

    def _served_if_any(self) -> _Ring | None:
        """The calling thread's served ring, if it has made one in this process."""
        served = getattr(self._local, "served", None)
        return served if served is not None and served.pid == os.getpid() else None

    def _start(self, code: int, items: list) -> PendingBatch:
        if _batch is None or not items:
            return super()._start(code, items)
        ring = self._start_ring(len(items))
        pending = _batch.submit(code, items, IoFile, ring, ring.address, _PUSH_ADDRESS,
                                _WAIT_ADDRESS, ALIGN)
        if pending is not None:
            return _Started(self, ring, code, items, pending)
        # Not a plain batch (vectored items, say): its requests are built here and pushed
        # all the same, unless some item goes through the bounce buffer (then the batch
        # runs to the end now, as the bounce path reads and copies in one go).
        prepared = self._prepare(code, items)
        if prepared[1]:
            return super()._start(code, items)
        return _PushedBatch(self, ring, code, items, prepared)

    def _answer(self, ring: _Ring, code: int, items: list,
                ran: tuple[int, list, int]) -> list[int | IoError]:
        """The results of a batch _batch ran: IoErrors for the items that failed."""
        rc, results, failed = ran
        if rc < 0:
            self._ring_failed(ring, rc)
        if failed:
            op = "read" if code == READ else "write"
            for index, result in enumerate(results):
                if type(result) is tuple:
                    number, done = result
                    file, offset, buffer = items[index]
                    results[index] = _error(-(rc if number == _PENDING else number), file,
                                            offset, op, _nbytes(buffer), done)
        return results

    def _ring_failed(self, ring: _Ring, rc: int) -> None:
        name = next((name for name in ("ring", "served")
                     if getattr(self._local, name, None) is ring), None)
        if name is None:
            return  # replaced already (another batch of that ring saw it first)
        setattr(self._local, name, None)
        log.error("io_uring ring of thread %s failed (%s); it is replaced",
                  threading.current_thread().name, os.strerror(-rc))

    def _run(self, code: int, ops: Sequence[Op]) -> list[Outcome]:
        ring = self._ring()
        reqs, _keep, vec_base, vec_len = _requests(code, ops)  # _keep: alive for the call
        rc = lib.kv_ring_run(ring.handle, reqs, len(ops), vec_base, vec_len)
        if rc < 0:
            self._ring_failed(ring, rc)
        return _outcomes(reqs, rc)


def _requests(code: int, ops: Sequence[Op]) -> tuple[Any, list, Any, Any]:
    """The ring's requests for ``ops``, what must stay alive while they run (the
    buffers' cdata), and the vectored requests' pieces as the ring takes them."""
    count = len(ops)
    reqs = ffi.new("struct kv_req[]", count)
    pointers = []  # cdata that must outlive the call
    bases: list = []  # the vectored requests' pieces, in batch order
    lengths: list[int] = []
    from_buffer = ffi.from_buffer
    for req, (fd, offset, view, pointer, align) in zip(reqs, ops):
        req.fd = fd
        req.op = code
        req.offset = offset
        req.align = align
        if view is not None:
            if pointer is None:
                pointer = from_buffer(view)
                pointers.append(pointer)
            elif pointer is VECTORED:
                req.nvec = len(view.views)
                bases += view.pointers or [from_buffer(piece) for piece in view.views]
                lengths += [piece.nbytes for piece in view.views]
                continue
            req.buf = pointer
            req.len = view.nbytes
    if bases:
        # Two flat arrays: far cheaper to fill from Python than an array of structs.
        vec_base, vec_len = ffi.new("char *[]", bases), ffi.new("uint64_t[]", lengths)
    else:
        vec_base = vec_len = ffi.NULL
    return reqs, [pointers, bases], vec_base, vec_len


def _outcomes(reqs: Any, rc: int) -> list[Outcome]:
    """``(bytes or -errno, bytes done)`` of each request the ring ran (``rc``: what the
    ring returned, the errno of those it never finished when it failed)."""
    return [(rc if req.result == _PENDING else req.result, req.done) for req in reqs]


#: Batches dropped, unwaited, on a thread that could not wait for them (see _PushedBatch).
_abandoned: list[_PushedBatch] = []


class _PushedBatch:
    """A batch the general path pushed into one of the thread's rings (a
    :class:`~kvstored.native.engine.PendingBatch`), waited for once: by ``wait``, or when
    it is dropped, so that neither its requests nor its buffers are freed while the
    kernel may still fill them. A batch of the thread's own ring can only be waited for
    by that thread (as batch.c's Pending): dropped on another, it is kept for good."""

    __slots__ = ("batch", "code", "engine", "items", "keep", "pid", "prepared", "reqs",
                 "results", "ring", "thread")

    def __init__(self, engine: UringEngine, ring: _Ring, code: int, items: list,
                 prepared: Prepared):
        self.engine, self.ring, self.code, self.items = engine, ring, code, items
        self.prepared = prepared
        # No item is bounced (the caller checked), so every request is there.
        ops = typing.cast("list[Op]", prepared[0])
        self.reqs, self.keep, vec_base, vec_len = _requests(code, ops)
        self.batch = ffi.new("struct kv_batch *")
        self.batch.reqs, self.batch.n = self.reqs, len(self.reqs)
        self.pid = os.getpid()
        self.thread = threading.get_ident()
        self.results: list[int | IoError] | None = None
        # The ring copies the pieces' addresses, so the two arrays may go after this.
        rc = lib.kv_ring_push(ring.handle, self.batch, vec_base, vec_len)
        if rc < 0:
            engine._ring_failed(ring, rc)

    def wait(self) -> list[int | IoError]:
        if self.results is None:
            if os.getpid() != self.pid:
                raise RuntimeError("a batch started before fork() is the parent's to wait "
                                   "for")
            if not self.ring.served and threading.get_ident() != self.thread:
                raise RuntimeError("a pending batch is waited for by the thread that "
                                   "started it (its ring is that thread's)")
            rc = lib.kv_ring_wait(self.ring.handle, self.batch)  # the GIL released
            if rc < 0:
                self.engine._ring_failed(self.ring, rc)
            self.results = self.engine._conclude(self.code, self.items, self.prepared,
                                                 _outcomes(self.reqs, rc))
            self.items, self.keep = [], []  # its buffers are the caller's again
        return self.results

    def __del__(self) -> None:
        if self.results is not None or os.getpid() != self.pid:
            return
        if self.ring.served or threading.get_ident() == self.thread:
            self.wait()
        else:
            _abandoned.append(self)  # its memory stays, whatever the kernel still does


class _Started:
    """A batch pushed into a thread's ring (``_batch.Pending``), waited for once."""

    __slots__ = ("code", "engine", "items", "pending", "pid", "results", "ring")

    def __init__(self, engine: UringEngine, ring: _Ring, code: int, items: list,
                 pending: Any):
        self.engine, self.ring, self.code, self.items = engine, ring, code, items
        self.pending = pending
        self.pid = os.getpid()
        self.results: list[int | IoError] | None = None

    def wait(self) -> list[int | IoError]:
        if self.results is None:
            if os.getpid() != self.pid:
                raise RuntimeError("a batch started before fork() is the parent's to wait "
                                   "for")
            ran = self.pending.wait()  # RuntimeError from another thread
            self.results = self.engine._answer(self.ring, self.code, self.items, ran)
            self.items = []  # its buffers are the caller's again
        return self.results
