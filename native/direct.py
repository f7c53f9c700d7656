"""O_DIRECT without alignment rules for the caller: bounce buffers and read-modify-write.

O_DIRECT needs the file offset, the length and the memory address of every transfer to
be multiples of the block size. Callers of the engine need not care: an unaligned item on
a direct file is widened to the aligned span around it and sent through a page-aligned
bounce buffer.

- A read reads the whole span and copies the asked-for bytes out.
- A write first reads the partial blocks at either edge of the span, lays the caller's
  bytes over them and writes the whole span. If that grew the file past its old end by
  rounding up to a block, the file is truncated back to the end the caller asked for.

Two unaligned writes of one batch that share an edge block would each read the block
before either writes it, and one would undo the other; such writes go in successive
rounds instead. Writes whose *bytes* overlap remain unordered, as for any batch. A
read-modify-write is not atomic against other threads writing the same block at the same
time, nor is the truncation against another thread extending the file.

A vectored item (:class:`Pieces`) goes straight to the file when its offset and every
piece's address and length are aligned. Otherwise it is joined into one buffer and takes
the path above as a single item: a write copies its pieces together first, a read lands
in one buffer and is copied out into the pieces after (:func:`join`, :func:`scatter`).

Both engines use this module; each passes its own ``run`` function.
"""

from __future__ import annotations

import logging
import os
import typing
from collections.abc import Callable

from kvstored.native.errors import log_once
from kvstored.native.scratch import ScratchMemory

#: The alignment used for O_DIRECT: 4 KiB satisfies 512-byte and 4 KiB devices alike.
ALIGN = 4096
_MASK = ALIGN - 1

#: ``(fd, offset, view or None, pointer or None, align)``: one request for an engine; a
#: vectored one is ``(fd, offset, Pieces, VECTORED, align)``.
Op = tuple
#: ``(result, done)``: bytes moved or -errno, and bytes moved also on error.
Outcome = tuple[int, int]
Run = Callable[[int, list[Op]], list[Outcome]]

READ, WRITE = 0, 1  # the KV_OP_* codes of io_uring_core.h

class Pieces:
    """The buffers of a vectored item, moved back to back from the item's offset as one
    request (preadv/pwritev, IORING_OP_READV/WRITEV).

    ``views`` is a list of flat byte memoryviews, none empty; ``nbytes`` is their total.
    ``pointers`` holds their cffi pointers when the engine already made them (checking
    O_DIRECT alignment), else None. Both engines and the bounce path read ``nbytes``
    the way they read a memoryview's.
    """

    __slots__ = ("nbytes", "pointers", "views")

    def __init__(self, views: list[memoryview], nbytes: int):
        self.views = views
        self.nbytes = nbytes
        self.pointers: list | None = None

    def __repr__(self) -> str:
        return f"Pieces({len(self.views)} buffers, {self.nbytes} bytes)"


#: The pointer slot of a vectored request: the engines test this one identity, so a
#: single-buffer request pays nothing for vectored ones (their pointers are in Pieces).
VECTORED = object()


def join(code: int, pieces: Pieces) -> memoryview:
    """One buffer standing for ``pieces`` on the bounce path: their bytes for a write,
    room for them for a read (:func:`scatter` copies it out after)."""
    if code == WRITE:
        return memoryview(b"".join(pieces.views))
    return memoryview(bytearray(pieces.nbytes))


def scatter(joined: memoryview, pieces: Pieces, length: int) -> None:
    """Copies the first ``length`` bytes read into ``joined`` out into ``pieces``."""
    at = 0
    for view in pieces.views:
        if at >= length:
            break
        take = min(view.nbytes, length - at)
        view[:take] = joined[at:at + take]
        at += take


def span_of(offset: int, length: int) -> tuple[int, int]:
    """The aligned ``[start, end)`` around ``[offset, offset + length)``."""
    return offset & ~_MASK, (offset + length + _MASK) & ~_MASK


#: The bounce buffers of each thread.
_arena = ScratchMemory()


def _clip(value: int, length: int) -> int:
    return min(max(value, 0), length)


def read_through_bounce(run: Run, ops: list[Op | None],
                        bounced: dict[int, tuple[int, int, memoryview]]) -> list[Outcome]:
    """Runs ``ops``, where ``ops[i] is None`` for each unaligned read ``bounced[i] =
    (fd, offset, destination)``; those go through the bounce buffer."""
    spans = {i: span_of(offset, len(dest)) for i, (_, offset, dest) in bounced.items()}
    arena = _arena.take(sum(end - start for start, end in spans.values()))
    views, position = {}, 0
    for i, (fd, _, _) in bounced.items():
        start, end = spans[i]
        views[i] = arena[position:position + end - start]
        position += end - start
        ops[i] = (fd, start, views[i], None, ALIGN)
    outcomes = run(READ, typing.cast("list[Op]", ops))  # every None is filled now
    for i, (_, offset, dest) in bounced.items():
        result, done = outcomes[i]
        head = offset - spans[i][0]
        useful = _clip(done - head, len(dest))
        dest[:useful] = views[i][head:head + useful]
        outcomes[i] = (useful if result >= 0 else result, useful)
    return outcomes


def _edge_blocks(offset: int, length: int) -> list[int]:
    """The block-aligned offsets of the partial blocks at the edges of a write."""
    start, end = span_of(offset, length)
    edges = []
    if offset & _MASK:
        edges.append(start)
    if (offset + length) & _MASK and end - ALIGN not in edges:
        edges.append(end - ALIGN)
    return edges


def _rounds(bounced: dict[int, tuple[int, int, memoryview]]) -> list[list[int]]:
    """Splits unaligned writes so that no two sharing an edge block run together, keeping
    the batch order between those that do."""
    last_round: dict[tuple[int, int], int] = {}
    rounds: list[list[int]] = []
    for i, (fd, offset, data) in bounced.items():
        blocks = [(fd, block) for block in _edge_blocks(offset, len(data))]
        number = max((last_round[b] + 1 for b in blocks if b in last_round), default=0)
        for b in blocks:
            last_round[b] = number
        while len(rounds) <= number:
            rounds.append([])
        rounds[number].append(i)
    return rounds


def write_through_bounce(run: Run, ops: list[Op | None],
                         bounced: dict[int, tuple[int, int, memoryview]]) -> list[Outcome]:
    """Runs ``ops``, where ``ops[i] is None`` for each unaligned write ``bounced[i] =
    (fd, offset, data)``; those are done as read-modify-write of whole blocks."""
    outcomes: list[Outcome | None] = [None] * len(ops)
    sizes_before = {}
    for fd, _, _ in bounced.values():
        if fd not in sizes_before:
            try:
                sizes_before[fd] = os.fstat(fd).st_size
            except OSError:
                sizes_before[fd] = None  # a bad fd: its items fail below, nothing to trim
    plain = [i for i, op in enumerate(ops) if op is not None]
    for number, members in enumerate(_rounds(bounced)):
        _write_round(run, ops, bounced, members, plain if number == 0 else [], outcomes)
    _trim_rounding(ops, bounced, outcomes, sizes_before)
    return outcomes  # type: ignore[return-value]


def _write_round(run: Run, ops: list[Op | None], bounced: dict, members: list[int],
                 plain: list[int], outcomes: list) -> None:
    spans = {i: span_of(bounced[i][1], len(bounced[i][2])) for i in members}
    arena = _arena.take(sum(end - start for start, end in spans.values()))
    views, position = {}, 0
    for i in members:
        start, end = spans[i]
        views[i] = arena[position:position + end - start]
        position += end - start
    # Read the partial edge blocks the write does not cover entirely.
    edge_ops, edge_owner = [], []
    for i in members:
        fd, offset, data = bounced[i]
        for block in _edge_blocks(offset, len(data)):
            at = block - spans[i][0]
            edge_ops.append((fd, block, views[i][at:at + ALIGN], None, ALIGN))
            edge_owner.append((i, at))
    failed = {}
    for (i, at), (result, _) in zip(edge_owner, run(READ, edge_ops) if edge_ops else []):
        if result < 0:
            failed.setdefault(i, result)
        else:  # beyond the end of the file the block reads as zeros
            views[i][at + result:at + ALIGN] = bytes(ALIGN - result)
    writes, owners = [], []
    for i in plain:
        writes.append(ops[i])
        owners.append(i)
    for i in members:
        if i in failed:
            outcomes[i] = (failed[i], 0)
            continue
        fd, offset, data = bounced[i]
        head = offset - spans[i][0]
        views[i][head:head + len(data)] = data
        writes.append((fd, spans[i][0], views[i], None, ALIGN))
        owners.append(i)
    for i, (result, done) in zip(owners, run(WRITE, writes) if writes else []):
        if i in bounced:
            length = len(bounced[i][2])
            head = bounced[i][1] - spans[i][0]
            outcomes[i] = (length, length) if result >= 0 else (result, _clip(done - head, length))
        else:
            outcomes[i] = (result, done)


def _trim_rounding(ops: list[Op | None], bounced: dict, outcomes: list,
                   sizes_before: dict[int, int | None]) -> None:
    """Cuts a file back to the end the caller wrote when rounding a write's tail up to a
    block grew it.

    Only a bounced write whose end is not block-aligned can grow a file past what the
    caller asked for, and the file is cut only while its size is still exactly the
    rounded end this batch produced: a file another writer has extended since is left
    alone (its bytes are not ours to cut). Unaligned O_DIRECT appends racing other
    appends to the same file remain unsafe, and are documented as such."""
    for fd, before in sizes_before.items():
        if before is None:
            continue
        ends, rounded = [before], []
        for i, outcome in enumerate(outcomes):
            if outcome is None or outcome[0] < 0:
                continue
            item_fd, offset, view = (bounced[i] if i in bounced
                                     else typing.cast("Op", ops[i]))[:3]
            if item_fd != fd:
                continue
            ends.append(offset + view.nbytes)  # a memoryview or Pieces
            if i in bounced and (offset + view.nbytes) & _MASK:
                rounded.append(span_of(offset, view.nbytes)[1])
        wanted = max(ends)
        grown_to = max(rounded, default=0)
        if grown_to <= wanted:
            continue  # nothing was rounded past the caller's end
        try:
            if os.fstat(fd).st_size == grown_to:
                os.ftruncate(fd, wanted)
        except OSError as exc:
            log_once(("trim", fd), logging.WARNING,
                     "could not cut fd %d back to %d bytes after an unaligned O_DIRECT "
                     "write rounded it up to a block: %s", fd, wanted, exc)
