"""Registered host memory: a same-host client's shared-memory KV pool, opened by the node.

An engine's host KV pool is often a shared-memory file (a ``/dev/shm`` file or a memfd:
SGLang's and vLLM's CPU tiers). A client registers it (``register_memory``) and the node
opens the file itself, through ``/proc/PID/fd/FD``, so that a same-host put or get moves
the bytes between the pool and the DRAM segment with one ``preadv``/``pwritev`` of the
node, instead of a memcpy by the client into its mapping of the segment.

What is checked before a file is accepted (:meth:`Regions.register`), each failure a
clear BadRequestError (the client then keeps to its own copies):

- the client is on this host (its host id), and ``pid`` holds this very connection: its
  socket, found in ``/proc/net/tcp*`` by the connection's two addresses, is among the
  descriptors of ``pid`` (so a client cannot name another process's file);
- the descriptor opens (the node's user may read the client's ``/proc/PID/fd``), and is
  the file the client described (``st_dev``/``st_ino``), on tmpfs or hugetlbfs (a
  memory file: never a disk file or a device), at least ``size`` bytes long.

A region lives as long as the process that registered it (checked through a pidfd on
every use and every registration) and is named by a number and a random token, which
every copy must give. Not a general file server: extents are bounded by the size
registered, and the node only reads and writes whole objects it holds.
"""

from __future__ import annotations

import ctypes
import hmac
import logging
import os
import secrets
import select
import socket
import stat
import struct
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from kvstored.errors import BadRequestError
from kvstored.hostid import host_id
from kvstored.protocol.node_api import RegisterMemoryRequest

log = logging.getLogger(__name__)

#: statfs(2) f_type of the memory filesystems a region may live on.
TMPFS_MAGIC = 0x01021994
HUGETLBFS_MAGIC = 0x958458F6
MEMORY_FILESYSTEMS = {TMPFS_MAGIC: "tmpfs", HUGETLBFS_MAGIC: "hugetlbfs"}
#: Regions a node keeps at once (each holds a descriptor and a pidfd).
MAX_REGIONS = 256

_libc = ctypes.CDLL(None, use_errno=True)


def filesystem_type(fd: int) -> int:
    """``fstatfs(fd).f_type`` (Python's os has no fstatfs)."""
    buf = ctypes.create_string_buffer(256)  # struct statfs is 120 bytes on Linux x86-64
    if _libc.fstatfs(fd, buf) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return struct.unpack_from("l", buf)[0] & 0xFFFFFFFF


def _hex_address(host: str) -> str:
    """An address as /proc/net/tcp spells it: 32-bit words in host (little) order."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    raw = socket.inet_pton(family, host)
    return "".join(f"{int.from_bytes(raw[i:i + 4], 'little'):08X}"
                   for i in range(0, len(raw), 4))


def socket_inode(local: tuple[str, int], remote: tuple[str, int]) -> int | None:
    """The inode of the socket on this host whose own address is ``local`` and whose
    peer is ``remote`` (the client's end of a connection), or None: not on this host."""
    want = (f"{_hex_address(local[0])}:{local[1]:04X}",
            f"{_hex_address(remote[0])}:{remote[1]:04X}")
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and (fields[1], fields[2]) == want:
                return int(fields[9])
    return None


def holds_socket(pid: int, inode: int) -> bool:
    """Whether process ``pid`` has socket ``inode`` among its descriptors."""
    target = f"socket:[{inode}]"
    try:
        entries = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for entry in entries:
        try:
            if os.readlink(f"/proc/{pid}/fd/{entry}") == target:
                return True
        except OSError:
            continue
    return False


@dataclass(slots=True)
class Region:
    number: int
    token: str
    fd: int
    pidfd: int
    pid: int
    size: int
    #: Copies running on it now (in a worker thread), and whether it was dropped: its
    #: descriptors close when the last copy ends, never under one.
    busy: int = 0
    dropped: bool = False

    @property
    def alive(self) -> bool:
        """Whether the registering process still runs (its pidfd is not readable)."""
        ready, _, _ = select.select([self.pidfd], [], [], 0)
        return not ready

    def close(self) -> None:
        os.close(self.fd)
        os.close(self.pidfd)


class Regions:
    """The regions of one node, by number."""

    def __init__(self) -> None:
        self._regions: dict[int, Region] = {}
        self._next = 1

    def __len__(self) -> int:
        return len(self._regions)

    def register(self, request: RegisterMemoryRequest, *, local: tuple[str, int] | None,
                 peer: tuple[str, int] | None) -> Region:
        """Open and check the client's file (see the module docstring); ``local`` and
        ``peer`` are this connection's addresses on the node's side."""
        self.sweep()
        if request.host_id != host_id():
            raise BadRequestError("register_memory: the client is on another host; "
                                  "registered memory is for same-host clients")
        inode = None if local is None or peer is None else socket_inode(peer, local)
        if inode is None or not holds_socket(request.pid, inode):
            raise BadRequestError(f"register_memory: process {request.pid} does not hold "
                                  "this connection (on this host); it cannot register "
                                  "memory in its name")
        if len(self._regions) >= MAX_REGIONS:
            raise BadRequestError(f"register_memory: this node holds {MAX_REGIONS} "
                                  "regions already")
        path = f"/proc/{request.pid}/fd/{request.fd}"
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except OSError as exc:
            raise BadRequestError(f"register_memory: cannot open {path} ({exc.strerror}); "
                                  "the node must run as the client's user") from None
        try:
            info = os.fstat(fd)
            kind = MEMORY_FILESYSTEMS.get(filesystem_type(fd))
            if (info.st_dev, info.st_ino) != (request.device, request.inode):
                raise BadRequestError(f"register_memory: {path} is not the file described "
                                      "(device and inode differ)")
            if not stat.S_ISREG(info.st_mode) or kind is None:
                raise BadRequestError(f"register_memory: {path} is not a shared-memory "
                                      "file (tmpfs or hugetlbfs); only those can be "
                                      "registered")
            if info.st_size < request.size:
                raise BadRequestError(f"register_memory: {path} holds {info.st_size} bytes, "
                                      f"not {request.size}")
            pidfd = os.pidfd_open(request.pid)
        except BaseException:
            os.close(fd)
            raise
        region = Region(self._next, secrets.token_hex(16), fd, pidfd, request.pid,
                        request.size)
        self._next += 1
        self._regions[region.number] = region
        log.info("registered %s bytes of %s memory of process %d as region %d",
                 request.size, kind, request.pid, region.number)
        return region

    @contextmanager
    def using(self, number: int, token: str) -> Iterator[Region]:
        """The region (as :meth:`get`), kept open while the caller copies."""
        region = self.get(number, token)
        region.busy += 1
        try:
            yield region
        finally:
            region.busy -= 1
            if region.dropped and not region.busy:
                region.close()

    def get(self, number: int, token: str) -> Region:
        """The live region ``number`` if ``token`` is its; BadRequestError otherwise."""
        region = self._regions.get(number)
        if region is not None and not region.alive:
            self._drop(region)
            region = None
        if region is None or not hmac.compare_digest(region.token, token):
            raise BadRequestError(f"no registered memory region {number} with that token "
                                  "(its process ended, or it was never registered here)")
        return region

    def sweep(self) -> None:
        """Drop the regions of processes that ended."""
        for region in list(self._regions.values()):
            if not region.alive:
                self._drop(region)

    def _drop(self, region: Region) -> None:
        self._regions.pop(region.number, None)
        region.dropped = True
        if not region.busy:
            region.close()
        log.info("dropped memory region %d (process %d ended)", region.number, region.pid)

    def close(self) -> None:
        for region in list(self._regions.values()):
            self._regions.pop(region.number)
            region.dropped = True
            if not region.busy:
                region.close()


def extents_of(extents: list[int], size: int, region: Region) -> list[tuple[int, int]]:
    """``[offset, length, ...]`` as pairs that lie in ``region`` and add up to
    ``size``; BadRequestError otherwise."""
    if len(extents) % 2:
        raise BadRequestError("extents come in pairs: offset, length")
    pairs = list(zip(extents[::2], extents[1::2]))
    if sum(n for _, n in pairs) != size:
        raise BadRequestError(f"extents of {sum(n for _, n in pairs)} bytes for an object "
                              f"of {size}")
    for offset, length in pairs:
        if offset + length > region.size:
            raise BadRequestError(f"extent {offset}+{length} lies outside the region's "
                                  f"{region.size} bytes")
    return pairs


def read_in(region: Region, pairs: list[tuple[int, int]], target: memoryview) -> None:
    """Read the extents, in order, into ``target`` (the object's room in the segment)."""
    _each(pairs, target, lambda view, where: os.preadv(region.fd, [view], where))


def write_out(region: Region, pairs: list[tuple[int, int]], source: memoryview) -> None:
    """Write ``source`` (an object in the segment) to the extents, in order."""
    _each(pairs, source, lambda view, where: os.pwritev(region.fd, [view], where))


def _each(pairs: list[tuple[int, int]], buffer: memoryview,
          move: Callable[[memoryview, int], int]) -> None:
    at = 0
    for offset, length in pairs:
        _whole(move, buffer[at:at + length], offset)
        at += length


def _whole(move: Callable[[memoryview, int], int], view: memoryview, offset: int) -> None:
    """Call ``move(view, offset)`` until all of ``view`` moved (a memory file moves it
    in one call; a short count past its end is an error, never a silent hole)."""
    while view.nbytes:
        n = move(view, offset)
        if n <= 0:
            raise BadRequestError(f"the registered file ended at {offset}")
        view, offset = view[n:], offset + n
