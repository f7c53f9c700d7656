"""Registered host memory, the client's side, without I/O: which of the caller's buffers
are shared-memory files the local nodes may read and write themselves, and where a
value's pieces lie in them.

An engine's host KV pool that is a ``/dev/shm`` file or a memfd is registered once
(``Client.register_memory(buffer, fd)``: ``buffer`` is this process's mapping of the file
from its start). A put or get of pieces inside it, with a node on this host, then asks
the node to move the bytes itself (``copy_in``/``copy_out``, one ``preadv``/``pwritev``
between the file and its DRAM segment: see kvstored.node.regions) instead of the client
copying through its own mapping of the segment. Each node is asked to register the file
on first use; a node that refuses (another host, another user, an older node, a file
not on tmpfs) is remembered with its reason, logged once, and the client keeps to its
own copies: :class:`MemoryStats` counts both ways.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvstored.errors import BadRequestError
from kvstored.wire import Into, Parts

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Registered:
    """A caller's buffer over a shared-memory file: where it is in this process."""

    base: int
    size: int
    fd: int
    device: int
    inode: int
    #: The caller's buffer, kept so that the mapping outlives the registration.
    buffer: Any = field(repr=False, compare=False)


@dataclass(slots=True)
class MemoryStats:
    """``Client.memory.stats``: objects the nodes moved themselves, and objects in
    registered memory the client had to copy (a node that refused the region)."""

    moved_objects: int = 0
    moved_bytes: int = 0
    fallback_objects: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def count(self, *, moved: int = 0, moved_bytes: int = 0, fallback: int = 0) -> None:
        with self._lock:
            self.moved_objects += moved
            self.moved_bytes += moved_bytes
            self.fallback_objects += fallback


def address_of(view: memoryview) -> int:
    """Where ``view``'s first byte is in this process (read-only views too)."""
    return int(np.frombuffer(view, dtype=np.uint8).ctypes.data)


class HostMemory:
    """The buffers this client registered, and each node's region for them (or its
    reason for refusing)."""

    def __init__(self) -> None:
        self.buffers: list[Registered] = []
        #: (node, buffer index) -> (region, token), or the node's refusal.
        self.regions: dict[tuple[str, int], tuple[int, str] | str] = {}
        self.stats = MemoryStats()

    def add(self, buffer: Any, fd: int) -> Registered:
        """Register ``buffer``, this process's mapping of the file open as ``fd`` from
        its start. BadRequestError for what cannot be one (no buffer, a read-only one, a
        descriptor that is not a regular file, or one shorter than the buffer)."""
        try:
            view = memoryview(buffer)
        except TypeError:
            raise BadRequestError(f"register_memory needs a buffer (an mmap of the file), "
                                  f"not a {type(buffer).__name__}") from None
        if view.readonly or not view.c_contiguous or not view.nbytes:
            raise BadRequestError("register_memory needs a writable, contiguous, non-empty "
                                  "mapping of the file")
        try:
            info = os.fstat(fd)
        except (OSError, TypeError) as exc:
            raise BadRequestError(f"register_memory: {fd!r} is not an open descriptor "
                                  f"({exc})") from None
        if not stat.S_ISREG(info.st_mode) or info.st_size < view.nbytes:
            raise BadRequestError(f"register_memory: descriptor {fd} is not a file of at "
                                  f"least {view.nbytes} bytes")
        flat = view.cast("B") if view.format != "B" or view.ndim != 1 else view
        registered = Registered(address_of(flat), flat.nbytes, fd, info.st_dev,
                                info.st_ino, buffer)
        self.buffers.append(registered)
        return registered

    def locate(self, value: Into, size: int) -> tuple[int, list[int]] | None:
        """The registered buffer holding the first ``size`` bytes of ``value`` (all
        pieces in one buffer) and their extents ``[offset, length, ...]`` in its file;
        None if they are not all in one."""
        if not self.buffers or size <= 0:
            return None
        views = value.head(size) if isinstance(value, Parts) else [value[:size]]
        found: int | None = None
        extents: list[int] = []
        for view in views:
            start = address_of(view)
            n = self._holding(start, view.nbytes)
            if n is None or (found is not None and n != found):
                return None
            found = n
            offset = start - self.buffers[n].base
            if extents and extents[-2] + extents[-1] == offset:
                extents[-1] += view.nbytes  # adjacent pieces: one extent
            else:
                extents += [offset, view.nbytes]
        return None if found is None else (found, extents)

    def _holding(self, start: int, nbytes: int) -> int | None:
        for n, buf in enumerate(self.buffers):
            if buf.base <= start and start + nbytes <= buf.base + buf.size:
                return n
        return None

    def refused(self, node: str, index: int, reason: str) -> None:
        log.info("node %s does not take registered memory (%s); the client copies",
                 node, reason)
        self.regions[(node, index)] = reason

    def forget(self, node: str) -> None:
        """``node``'s regions are gone (it restarted, or answered that it has none)."""
        for key in [k for k in self.regions if k[0] == node]:
            del self.regions[key]
