"""Objects given as pieces of the caller's memory (scatter/gather), without I/O.

A put may hand its object over as a list of buffers, concatenated in order, and a get
may land one in such a list (``put_parts``, ``get_into_parts``): an engine's page is
several spans of its own KV pool (K and V, or one span per layer), and a joined copy of
them would cost as much as the transfer. This module checks the pieces a caller hands in
and turns them into a :class:`~kvstored.wire.Parts`, and moves bytes between such a
target and one flat buffer (a mapped segment) piece by piece. The object's CRC-32C is
chained over the pieces, so it is the checksum of the concatenation, as for one buffer.

Pieces are buffers (``bytearray``, ``mmap``, numpy arrays, ``memoryview`` s; a CPU torch
tensor through ``tensor.numpy()``), never raw addresses: a pointer cannot be checked
against the memory it claims.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from kvstored.checksum import copy_crc32c, crc32c
from kvstored.errors import BadRequestError
from kvstored.wire import Into, Parts


def parts_of(pieces: Iterable[Any], *, key: str, writable: bool) -> Parts:
    """The pieces of ``key``'s object as flat byte views; BadRequestError (naming the
    key and the piece) for something that is not a buffer, a strided buffer, or a
    read-only one where a get must write (``writable``)."""
    if isinstance(pieces, bytes | bytearray | memoryview | str):
        raise BadRequestError("the pieces of an object are a list of buffers, not one "
                              "buffer: pass [buffer], or use put/get_into", key=key)
    views = []
    for n, piece in enumerate(pieces):
        try:
            view = memoryview(piece)
        except TypeError:
            raise BadRequestError(f"piece {n} is a {type(piece).__name__}, not a buffer "
                                  "(a torch tensor: pass tensor.numpy())", key=key) from None
        if writable and view.readonly:
            raise BadRequestError(f"piece {n} is read-only, and a get writes into its "
                                  "pieces", key=key)
        if not view.c_contiguous:
            raise BadRequestError(f"piece {n} is not contiguous; pass each contiguous span "
                                  "as a piece of its own", key=key)
        views.append(view if view.format == "B" and view.ndim == 1 else view.cast("B"))
    return Parts(views)


def views_of(value: Into) -> list[memoryview]:
    """The buffers a value is sent from, in order (no copy joins them)."""
    return value.views if isinstance(value, Parts) else [value]


def checksum(value: Into, size: int | None = None) -> int:
    """The CRC-32C of the first ``size`` bytes of ``value`` (all of it by default),
    chained over its pieces."""
    if not isinstance(value, Parts):
        return crc32c(value if size is None else value[:size])
    crc = 0
    for view in value.head(value.nbytes if size is None else size):
        crc = crc32c(view, crc)
    return crc


def scatter(source: memoryview, target: Into) -> None:
    """Copy ``source`` into the start of ``target``, piece by piece (one copy per byte:
    no staging between them)."""
    if not isinstance(target, Parts):
        target[:source.nbytes] = source
        return
    at = 0
    for view in target.head(source.nbytes):
        view[:] = source[at:at + view.nbytes]
        at += view.nbytes


def scatter_checked(source: memoryview, target: Into) -> int:
    """:func:`scatter`, returning the CRC-32C of the bytes copied (chained over the
    pieces), taken as they are stored (kvstored.checksum): one pass over the
    bytes, where a copy and then a check read every byte twice."""
    if not isinstance(target, Parts):
        return copy_crc32c(target, source)
    crc, at = 0, 0
    for view in target.head(source.nbytes):
        crc = copy_crc32c(view, source[at:at + view.nbytes], crc)
        at += view.nbytes
    return crc


def gather(value: Into, target: memoryview) -> None:
    """Copy all of ``value`` into ``target`` (exactly its size), piece by piece."""
    if not isinstance(value, Parts):
        target[:] = value
        return
    at = 0
    for view in value.views:
        target[at:at + view.nbytes] = view
        at += view.nbytes
