"""A node's DRAM segment: one POSIX shared-memory file that same-host clients map.

The node creates ``/dev/shm/<name>`` (:meth:`DramSegment.create`); a client on the same
host maps it (:meth:`SegmentMapping.attach`) and copies object bytes in and out directly,
with no socket in the data path. Both import this module, which imports neither.
Offsets into the data region come from the node's
:class:`~kvstored.allocator.OffsetAllocator`; this module only owns the memory.

Layout: a 4096-byte header page, then the data region (4096-aligned, ``data_size`` bytes).
The header, little-endian:

====== ====== ===============================================================
offset bytes  field
====== ====== ===============================================================
0      8      magic ``b"KVSTDRAM"``
8      4      format version (:data:`FORMAT_VERSION`)
12     4      offset of the data region (4096)
16     8      data_size in bytes
24     8      creator pid
32     8      creator start time (clock ticks after boot, /proc/<pid>/stat field
              22; 0 when unknown): tells a live creator from a reused pid
40     16     token: 16 random bytes, new for every segment
====== ====== ===============================================================

A client learns the name and the token from the node over its control connection; a
token mismatch means the node restarted (a new segment under the same name) and the
client must not trust its old offsets.

Performance facts (measured on the 2-vCPU dev machine; re-measure with
``python -m tests.test_shm``):

- Fresh memory is slow. The first write to a never-touched tmpfs page runs at about
  0.5 GB/s; the same copy into pre-faulted pages runs at 10-12 GB/s. So ``create``
  pre-faults by default: ``posix_fallocate`` (which also turns a too-small /dev/shm into a
  clean ENOSPC instead of a later SIGBUS) and ``MAP_POPULATE``; together about 0.6 s per
  GiB, once. The memory is never handed back to the OS while the segment is open.
- A client's own page tables start empty: its first touch of each page costs a minor
  fault (about 3 GB/s on first copy). ``attach(populate=True)`` maps them all up front for
  about 0.06-0.1 s per GiB.
- Copy with :func:`copy_into`: slice assignment into a memoryview and ``numpy.copyto``
  both run at memcpy speed (into a pre-faulted segment, best of 5: about 11.5 against
  9-10 GB/s at 64 KiB, 18-19 GB/s both at 1 MiB, 10.5-11.5 GB/s both at 64 MiB), so
  ``copy_into`` uses slice assignment for small copies and ``numpy.copyto``, which drops
  the GIL, for large ones. ``bytes(memoryview)`` (about 2 GB/s at 64 MiB) and
  ``bytearray[:] = memoryview`` (about 1.2 GB/s; it copies the source into a temporary
  first) allocate fresh memory for every copy: write ``memoryview(buf)[:n] = view`` or
  ``copy_into`` instead.

Stale segments: the creator holds an exclusive ``flock`` on the file for the segment's
life, and records its pid and start time in the header. ``create`` replaces a segment
only when the lock is free and that process is gone.

Neither class is thread-safe for ``close``; ``view`` may be called from any thread while
the object is open, and the views it returns are plain memoryviews that any thread may
read or write (coordinating who writes where is the allocator owner's job).
"""

from __future__ import annotations

import errno
import fcntl
import hmac
import logging
import mmap
import operator
import os
import re
import secrets
import struct
import time
from typing import Any

import numpy as np

from kvstored.sdk.units import format_size

log = logging.getLogger(__name__)

#: Where POSIX shared memory lives on Linux (what shm_open(3) uses).
SHM_DIR = "/dev/shm"
MAGIC = b"KVSTDRAM"
FORMAT_VERSION = 1
PAGE = 4096
#: The header occupies the first page; the data region starts here.
DATA_OFFSET = PAGE
TOKEN_BYTES = 16
_HEADER = struct.Struct("<8sIIQQQ16s")

#: Copies at least this long go through numpy.copyto, which releases the GIL (so the trio
#: loop and other threads keep running); shorter ones use slice assignment, which has less
#: per-call overhead (about 0.3 us against 1.5 us) at the same memcpy speed.
GIL_RELEASE_THRESHOLD = 256 * 1024

#: How long ``create`` waits for a dead creator's lock to be released (see _lock_stale).
STALE_LOCK_WAIT = 2.0

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")


class SegmentUnavailable(Exception):
    """The segment cannot be mapped; ``reason`` says why. Clients fall back to TCP."""

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(f"DRAM segment {name!r} unavailable: {reason}")
        self.name = name
        self.reason = reason


class SegmentExistsError(FileExistsError):
    """``create`` found the name taken by a live node, or by a file that is not a
    kvstored segment; the message says which and what to do. ``holder`` is the pid of
    the live node, when known."""

    def __init__(self, message: str, *, holder: int | None = None) -> None:
        super().__init__(message)
        self.holder = holder


def _validate_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(f"{name!r} is not a valid segment name: use 1-200 letters, digits, "
                         "'.', '_' or '-', starting with a letter or digit")
    return name


def _path(name: str) -> str:
    return os.path.join(SHM_DIR, name)


def _start_ticks(pid: int) -> int | None:
    """When ``pid`` started (clock ticks after boot); None if it does not exist or is a
    zombie (a zombie holds no memory or locks: for us it is dead)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name, field 2, is in parentheses and may hold spaces: split after it.
    fields = stat[stat.rindex(b")") + 2:].split()
    if fields[0] in (b"Z", b"X"):
        return None
    return int(fields[19])


def _process_alive(pid: int, start_ticks: int) -> bool:
    """Whether the process that created a segment still runs (not a reused pid)."""
    if pid <= 0:
        return False
    if os.path.isdir("/proc/self"):
        ticks = _start_ticks(pid)
        return ticks is not None and (start_ticks == 0 or ticks == start_ticks)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _read_header(fd: int) -> dict[str, Any] | None:
    """The parsed header, or None when the file is not a kvstored segment."""
    raw = os.pread(fd, _HEADER.size, 0)
    if len(raw) < _HEADER.size:
        return None
    magic, version, data_offset, data_size, pid, ticks, token = _HEADER.unpack(raw)
    if magic != MAGIC:
        return None
    return {"version": version, "data_offset": data_offset, "data_size": data_size,
            "pid": pid, "start_ticks": ticks, "token": token}


class _Mapped:
    """A mapping of a segment file: bounds-checked views of its data region."""

    def __init__(self, name: str, fd: int, mapping: mmap.mmap, data_size: int,
                 token: bytes) -> None:
        self._name = name
        self._fd = fd
        self._mmap: mmap.mmap | None = mapping
        self._data: memoryview | None = memoryview(mapping)[DATA_OFFSET:DATA_OFFSET
                                                            + data_size]
        self._data_size = data_size
        self._token = token

    @property
    def name(self) -> str:
        """The segment's name: the file ``/dev/shm/<name>``."""
        return self._name

    @property
    def path(self) -> str:
        return _path(self._name)

    @property
    def token(self) -> bytes:
        """The segment's 16 random bytes, new for every created segment."""
        return self._token

    @property
    def data_size(self) -> int:
        """Bytes in the data region; valid offsets are ``[0, data_size)``."""
        return self._data_size

    @property
    def closed(self) -> bool:
        return self._data is None

    def view(self, offset: int, nbytes: int) -> memoryview:
        """A writable memoryview (format ``B``) of ``nbytes`` at ``offset`` in the data
        region. Never blocks; no copy.

        Raises ValueError naming the range when it leaves ``[0, data_size)`` (memoryview
        slicing would silently clamp) or when the segment is closed; TypeError for
        non-integers. A view stays valid after ``close``: the memory is unmapped only
        when the last view is released.
        """
        data = self._data
        if data is None:
            raise ValueError(f"DRAM segment {self._name!r} is closed")
        if type(offset) is not int or type(nbytes) is not int:
            offset, nbytes = operator.index(offset), operator.index(nbytes)
        end = offset + nbytes
        if offset < 0 or nbytes < 0 or end > self._data_size:
            raise ValueError(f"view({offset}, {nbytes}) of segment {self._name!r}: "
                             f"[{offset}, {end}) is outside its data region "
                             f"[0, {self._data_size})")
        return data[offset:end]

    def _close_mapping(self) -> None:
        """Release our references; unmap now, or when the last exported view goes."""
        if self._data is None:
            return
        self._data.release()
        self._data = None
        mapping, self._mmap = self._mmap, None
        try:
            if mapping is not None:
                mapping.close()
        except BufferError:
            # Views handed out are still alive; the mapping is unmapped when the last of
            # them is released or collected. Never unmap memory under a live view.
            log.debug("segment %s: views still alive, unmapping when they go", self._name)
        os.close(self._fd)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def __repr__(self) -> str:
        state = "closed" if self.closed else format_size(self._data_size)
        return f"{type(self).__name__}({self._name!r}, {state})"


class DramSegment(_Mapped):
    """The node's segment: created, pre-faulted, owned, and unlinked by the node.

    Not thread-safe for ``create``/``close``; ``view`` is safe from any thread while open.
    """

    @classmethod
    def create(cls, name: str, size: int, *, populate: bool = True) -> DramSegment:
        """Create ``/dev/shm/<name>`` with a ``size``-byte data region, mode 0600.

        Blocks while it pre-faults the memory when ``populate`` is true (about 0.6 s per
        GiB here): call it from a worker thread in async code. With ``populate`` false
        pages are allocated on first touch, slowly, and a full /dev/shm then kills the
        process with SIGBUS; use that only for tests and small segments.

        If the name exists and was left by a process that is gone (a crashed node), the
        stale segment is replaced, with a warning in the log.

        Raises SegmentExistsError when a live process owns the name, or the file there is
        not a kvstored segment (or belongs to another user); OSError(ENOSPC) when
        /dev/shm has no room for ``size``; ValueError for a bad name or size. On any error
        nothing is left behind.
        """
        _validate_name(name)
        if type(size) is not int or size <= 0:
            raise ValueError(f"DRAM segment size must be a positive int, got {size!r}")
        path = _path(name)
        file_size = DATA_OFFSET + -(-size // PAGE) * PAGE
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        for _ in range(3):
            try:
                fd = os.open(path, flags, 0o600)
                break
            except FileExistsError:
                _remove_stale(name)
            except FileNotFoundError:
                raise OSError(errno.ENOENT, f"{SHM_DIR} does not exist: POSIX shared "
                                            "memory is not available on this host") from None
        else:
            raise SegmentExistsError(f"{path} keeps reappearing; another process is "
                                     f"creating segment {name!r}")
        try:
            # An exclusive lock held for the segment's life: a second node that finds the
            # name can tell in-use from stale even before our header is written.
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.fchmod(fd, 0o600)        # the mode given to open() is filtered by umask
            room = os.statvfs(SHM_DIR)
            available = room.f_bavail * room.f_frsize
            if available < file_size:
                raise OSError(errno.ENOSPC, f"{SHM_DIR} has {format_size(available)} free, "
                              f"segment {name!r} needs {format_size(file_size)}: shrink the "
                              f"DRAM tier or enlarge {SHM_DIR}")
            os.ftruncate(fd, file_size)
            token = secrets.token_bytes(TOKEN_BYTES)
            pid = os.getpid()
            header = _HEADER.pack(MAGIC, FORMAT_VERSION, DATA_OFFSET, size, pid,
                                  _start_ticks(pid) or 0, token)
            os.pwrite(fd, header, 0)
            map_flags = mmap.MAP_SHARED
            if populate:
                # Reserve every page now: ENOSPC here rather than SIGBUS on first touch.
                os.posix_fallocate(fd, 0, file_size)
                map_flags |= getattr(mmap, "MAP_POPULATE", 0)
            mapping = mmap.mmap(fd, file_size, flags=map_flags,
                                prot=mmap.PROT_READ | mmap.PROT_WRITE)
            if populate and not hasattr(mmap, "MAP_POPULATE"):
                _touch_pages(mapping)
        except BaseException:
            os.unlink(path)
            os.close(fd)
            raise
        segment = cls(name, fd, mapping, size, token)
        log.info("created DRAM segment %s: %s, %s", path, format_size(size),
                 "pre-faulted" if populate else "faulted on first touch")
        return segment

    def close(self, unlink: bool = True) -> None:
        """Unmap the segment and, when ``unlink``, remove its name so the memory goes back
        to the OS once every client has unmapped it. Idempotent; never raises for a second
        call. Views still alive keep the memory mapped until they are released.
        """
        if self.closed:
            return
        if unlink:
            try:
                same = os.path.samestat(os.fstat(self._fd), os.stat(self.path))
            except FileNotFoundError:
                same = False
            if same:
                os.unlink(self.path)
        self._close_mapping()


def _touch_pages(mapping: mmap.mmap) -> None:
    """Write one byte per page: the pre-fault for Pythons without MAP_POPULATE."""
    pages = np.frombuffer(mapping, dtype=np.uint8)
    pages[::PAGE] = 0
    del pages


def _remove_stale(name: str) -> None:
    """Unlink ``/dev/shm/<name>`` if it is a segment whose creator is gone; otherwise raise
    SegmentExistsError saying who holds it. Returns quietly if the file vanished."""
    path = _path(name)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    except PermissionError:
        raise SegmentExistsError(f"{path} exists and belongs to another user; choose another "
                                 "segment name or have its owner remove it") from None
    except OSError as exc:
        raise SegmentExistsError(f"{path} exists and cannot be opened ({exc.strerror}); "
                                 "remove it or choose another segment name") from None
    try:
        _lock_stale(fd, path)
        header = _read_header(fd)
        if header is None:
            raise SegmentExistsError(f"{path} exists but is not a kvstored DRAM segment; "
                                     "remove it or choose another segment name")
        if _process_alive(header["pid"], header["start_ticks"]):
            raise SegmentExistsError(f"DRAM segment {path} belongs to process "
                                     f"{header['pid']}, which is still running; stop it "
                                     "or choose another segment name", holder=header["pid"])
        # Holding the lock, and the path still names the file we inspected: unlink it.
        try:
            if not os.path.samestat(os.fstat(fd), os.stat(path)):
                return
            os.unlink(path)
        except FileNotFoundError:
            return
        log.warning("replaced stale DRAM segment %s (%s) left by process %d, which is gone",
                    path, format_size(header["data_size"]), header["pid"])
    finally:
        os.close(fd)


def sweep_stale(prefix: str = "kvstored-") -> list[str]:
    """Unlink every segment named ``prefix*`` whose creator is gone (a node killed with
    SIGKILL leaves its segment behind, holding memory, until a node with the same data
    directory starts again). Segments in use, or not ours, are left alone. Returns the
    names removed."""
    removed = []
    try:
        names = [n for n in os.listdir(SHM_DIR) if n.startswith(prefix)]
    except OSError:
        return removed
    for name in names:
        try:
            _validate_name(name)
            existed = os.path.exists(_path(name))
            _remove_stale(name)
        except (SegmentExistsError, ValueError, OSError):
            continue
        if existed and not os.path.exists(_path(name)):
            removed.append(name)
    return removed


def _lock_stale(fd: int, path: str) -> None:
    """Take the creator's lock on a segment we found, or raise SegmentExistsError.

    The creator holds the lock for the segment's life. When its header names a creator
    that is gone yet the lock is still held, the creator is probably still being torn
    down (a killed multi-threaded process shows as a zombie before its last thread has
    closed its files): wait up to :data:`STALE_LOCK_WAIT` seconds for the lock.
    """
    deadline = None
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        header = _read_header(fd)
        if header is None or _process_alive(header["pid"], header["start_ticks"]):
            holder = header["pid"] if header else None
            raise SegmentExistsError(
                f"DRAM segment {path} is in use by a running node"
                + (f" (process {holder})" if holder else "")
                + "; stop it or choose another segment name", holder=holder)
        now = time.monotonic()
        deadline = deadline or now + STALE_LOCK_WAIT
        if now >= deadline:
            raise SegmentExistsError(
                f"DRAM segment {path} was created by process {header['pid']}, which is gone, "
                "but another process still holds it open (one it forked?); stop that "
                f"process (see: fuser -v {path}) or choose another segment name")
        time.sleep(0.01)


class SegmentMapping(_Mapped):
    """A same-host client's mapping of a node's segment. Never unlinks it.

    Not thread-safe for ``attach``/``close``; ``view`` is safe from any thread while open.
    """

    @classmethod
    def attach(cls, name: str, token: bytes, *, populate: bool = False) -> SegmentMapping:
        """Map ``/dev/shm/<name>`` read-write after checking its header and ``token``.

        ``populate`` maps every page now (about 0.06-0.1 s per GiB here) instead of taking
        a minor fault on the first touch of each page; it blocks for that long.

        Raises SegmentUnavailable, with a ``reason``, when the segment is absent, not
        readable by this user, not a kvstored segment, of another format version, left by
        a process that is gone, or its token differs (the node restarted). The caller
        then falls back to TCP. ValueError for a malformed name.
        """
        _validate_name(name)
        path = _path(name)
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            raise SegmentUnavailable(name, f"{path} does not exist (the node is on another "
                                           "host, or has stopped)") from None
        except PermissionError:
            raise SegmentUnavailable(name, f"permission denied on {path}: it is readable "
                                           "only by the node's user") from None
        except OSError as exc:
            raise SegmentUnavailable(name, f"cannot open {path}: {exc.strerror}") from None
        try:
            file_size = os.fstat(fd).st_size
            header = _read_header(fd)
            if header is None:
                raise SegmentUnavailable(name, f"{path} is not a kvstored DRAM segment")
            if header["version"] != FORMAT_VERSION or header["data_offset"] != DATA_OFFSET:
                raise SegmentUnavailable(name, f"{path} has format version "
                                               f"{header['version']}; this client reads "
                                               f"version {FORMAT_VERSION}")
            if not (isinstance(token, bytes | bytearray)
                    and hmac.compare_digest(header["token"], bytes(token))):
                raise SegmentUnavailable(name, "token mismatch: the segment now belongs to "
                                               "another node instance (it restarted)")
            if not _process_alive(header["pid"], header["start_ticks"]):
                raise SegmentUnavailable(name, f"its node (process {header['pid']}) is gone")
            needed = DATA_OFFSET + header["data_size"]
            if file_size < needed:
                raise SegmentUnavailable(name, f"{path} holds {file_size} bytes, its header "
                                               f"says {needed}")
            flags = mmap.MAP_SHARED
            if populate:
                flags |= getattr(mmap, "MAP_POPULATE", 0)
            mapping = mmap.mmap(fd, needed, flags=flags, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            raise
        return cls(name, fd, mapping, header["data_size"], header["token"])

    def close(self) -> None:
        """Unmap (once the last view is released). Idempotent."""
        self._close_mapping()


def same_host_probe(name: str, token: bytes) -> tuple[bool, str]:
    """Whether this process can map segment ``name`` with ``token``, and why (not).

    Attaches and detaches at once; never raises for an unavailable segment.
    """
    try:
        with SegmentMapping.attach(name, token) as mapping:
            return True, (f"{mapping.path} mapped: {format_size(mapping.data_size)} of "
                          "shared memory on this host")
    except SegmentUnavailable as exc:
        return False, exc.reason
    except ValueError as exc:
        return False, str(exc)


def copy_into(dst: memoryview, src: Any) -> None:
    """Copy every byte of ``src`` into ``dst``, which must have the same length.

    ``src`` is any buffer (bytes, bytearray, memoryview, mmap, numpy array of any dtype)
    that is C-contiguous or a one-dimensional byte view (strided slices are fine). The
    copy runs at memcpy speed: slice assignment below :data:`GIL_RELEASE_THRESHOLD` bytes,
    ``numpy.copyto`` (GIL released, so other threads and the event loop keep running) at
    or above it. Never allocates a copy of the data.

    Raises ValueError naming both lengths when they differ; TypeError when ``dst`` is
    read-only, or a buffer must be reinterpreted as bytes and is not C-contiguous.
    """
    source = src if type(src) is memoryview else memoryview(src)
    if source.ndim != 1 or source.format != "B":
        source = source.cast("B")
    if dst.ndim != 1 or dst.format != "B":
        dst = dst.cast("B")
    if dst.readonly:
        raise TypeError("copy_into: the destination is read-only")
    nbytes = source.nbytes
    if nbytes != dst.nbytes:
        raise ValueError(f"copy_into: the destination holds {dst.nbytes} bytes, the source "
                         f"{nbytes}; they must be equal")
    if nbytes >= GIL_RELEASE_THRESHOLD:
        np.copyto(np.asarray(dst), np.asarray(source))
    else:
        dst[:] = source
