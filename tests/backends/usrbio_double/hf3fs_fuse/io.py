"""Test double of ``hf3fs_fuse.io`` (USRBIO), following the documented API; see README.md."""

from __future__ import annotations

import errno
import os
import random
import threading

#: Test hooks: raise this from make_ioring / make_iovec, count live registrations.
fail_ring: OSError | None = None
registered: set[int] = set()
_registered_lock = threading.Lock()
rings_made = 0


def _mounts() -> list[str]:
    raw = os.environ.get("HF3FS_DOUBLE_MOUNTS", "")
    return [os.path.abspath(p) for p in raw.split(":") if p]


def extract_mount_point(path: str) -> str | None:
    path = os.path.abspath(path)
    best = None
    for mount in _mounts():
        if (path == mount or path.startswith(mount + os.sep)) and (
                best is None or len(mount) > len(best)):
            best = mount
    return best


def register_fd(fd: int, flags: int = 0) -> None:
    with _registered_lock:
        if fd in registered:
            raise OSError(errno.EEXIST, "fd registered twice")
        os.fstat(fd)  # EBADF for a closed fd, as the real call fails
        registered.add(fd)


def deregister_fd(fd: int) -> None:
    with _registered_lock:
        registered.discard(fd)


class _Slice:
    def __init__(self, iov: _Iovec, start: int, stop: int) -> None:
        self.iov, self.start, self.stop = iov, start, stop
        self.result = 0
        self.userdata = None


class _Iovec:
    def __init__(self, buf: memoryview, mount: str) -> None:
        self.buf, self.mount = buf, mount

    def __getitem__(self, item: slice) -> _Slice:
        start, stop, step = item.indices(len(self.buf))
        if step != 1:
            raise ValueError("step not 1 when slicing iovec")
        return _Slice(self, start, stop)


def make_iovec(shm, hf3fs_mount_point: str, block_size: int = 0, numa: int = -1) -> _Iovec:
    if extract_mount_point(hf3fs_mount_point) != os.path.abspath(hf3fs_mount_point):
        raise OSError(errno.EINVAL, f"{hf3fs_mount_point} is not a 3FS mount")
    return _Iovec(shm.buf, hf3fs_mount_point)


class _Ring:
    def __init__(self, entries: int, for_read: bool) -> None:
        self.entries, self.for_read = entries, for_read
        self.owner = threading.get_ident()
        self.queued: list[tuple[_Slice, int, int]] = []
        self.random = random.Random(entries)

    def _same_thread(self) -> None:
        if threading.get_ident() != self.owner:
            raise RuntimeError("an ioring is not thread-safe: used from a second thread")

    def prepare(self, iov: _Slice, read: bool, fd: int, off: int, userdata=None) -> _Ring:
        self._same_thread()
        if read != self.for_read:
            raise OSError(errno.EINVAL, "the direction does not match the ring")
        if fd not in registered:
            raise OSError(errno.EBADF, "fd is not registered")
        if len(self.queued) >= self.entries:
            raise OSError(errno.EAGAIN, "the ring is full")
        done = _Slice(iov.iov, iov.start, iov.stop)
        done.userdata = userdata
        self.queued.append((done, fd, off))
        return self

    def submit(self) -> _Ring:
        self._same_thread()
        return self

    def wait(self, *, max_results: int = 0, min_results: int = 0, timeout=None) -> list:
        self._same_thread()
        batch, self.queued = self.queued, []
        self.random.shuffle(batch)  # completions come in any order
        for item, fd, off in batch:
            view = item.iov.buf[item.start:item.stop]
            try:
                if self.for_read:
                    data = os.pread(fd, len(view), off)
                    view[:len(data)] = data
                    item.result = len(data)
                else:
                    item.result = os.pwrite(fd, view, off)
            except OSError as exc:
                item.result = -exc.errno
        return [item for item, _, _ in batch]


def make_ioring(hf3fs_mount_point: str, entries: int, for_read: bool = True, io_depth: int = 0,
                priority=None, timeout=None, numa: int = -1, flags: int = 0) -> _Ring:
    global rings_made
    if fail_ring is not None:
        raise fail_ring
    rings_made += 1
    return _Ring(entries, for_read)
