"""Files a backend keeps on disk: private, and durable in the order a crash needs.

Stored objects are users' data (KV blocks of their prompts), so everything a backend
creates is private to the daemon's user: directories 0700, files 0600, whatever the
umask. These helpers are what the built-in backends use; a third-party backend should
too.

- :func:`make_private_dirs` creates a directory and every missing parent 0700
  (``os.makedirs`` applies its mode to the last level only);
- :func:`write_all` writes a whole buffer to a descriptor, resuming short writes;
- :func:`write_new_file` creates a private file and fsyncs it (the write-then-fsync of
  a backend that stages each object in a file of its own);
- :func:`write_atomically` replaces a small file so that a crash leaves the old content
  or the new, never a mix: temporary file, write, fsync, rename, directory fsync;
- :func:`fsync_dir` makes a directory's entries (a create, a rename, an unlink) durable;
- :func:`allocated_bytes` is the disk a store's files take (their blocks, not sizes).

This module does no locking and knows nothing of any layout.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

#: Modes of everything a backend creates.
PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600


def make_private_dirs(path: str | os.PathLike) -> bool:
    """Create ``path`` and any missing parent, each 0700 (with its parent fsync'd, so
    the new directory survives a crash). Returns True if ``path`` had to be created.

    Existing directories are left as they are; :func:`make_private` tightens one.
    """
    path = Path(path)
    missing: list[Path] = []
    probe = path
    while not probe.is_dir():
        missing.append(probe)
        if probe.parent == probe:
            break
        probe = probe.parent
    for folder in reversed(missing):
        try:
            os.mkdir(folder, PRIVATE_DIR)
        except FileExistsError:
            if not folder.is_dir():
                raise
            continue
        os.chmod(folder, PRIVATE_DIR)  # the umask may have taken bits off; never adds any
        fsync_dir(folder.parent)
    return bool(missing)


def make_private(path: str | os.PathLike) -> bool:
    """Take group and other permissions off an existing directory or file that this
    user owns (a store created before stores were private). Returns True if it changed."""
    st = os.stat(path)
    if st.st_uid != os.geteuid() or not st.st_mode & 0o077:
        return False
    os.chmod(path, st.st_mode & 0o700)
    return True


def is_temporary(name: str, of: str) -> bool:
    """Whether ``name`` is a temporary file :func:`write_atomically` makes for ``of``."""
    return name.startswith(f".{of}.") and name.endswith(".tmp")


def fsync_dir(path: str | os.PathLike) -> None:
    """Make the entries of directory ``path`` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_all(fd: int, data, offset: int | None = None) -> None:
    """Write all of ``data`` to ``fd`` (at ``offset``, or at the file position)."""
    view = memoryview(data).cast("B")
    while view:
        written = os.write(fd, view) if offset is None else os.pwrite(fd, view, offset)
        view = view[written:]
        if offset is not None:
            offset += written


def write_new_file(path: str | os.PathLike, data) -> os.stat_result:
    """Create ``path``, which must not exist, as a private file holding ``data`` (a
    buffer, or an iterable of buffers written in turn), fsync'd before this returns; on
    any failure the file is removed. Returns its ``os.stat`` (size, blocks). The caller
    renames it into place and fsyncs the directory (:func:`fsync_dir`)."""
    chunks = [data] if isinstance(data, bytes | bytearray | memoryview) else data
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, PRIVATE_FILE)
    try:
        at = 0
        for chunk in chunks:
            write_all(fd, chunk, at)
            at += memoryview(chunk).nbytes
        os.fsync(fd)
        return os.fstat(fd)
    except BaseException:
        try:
            os.unlink(path)
        except OSError:
            pass
        raise
    finally:
        os.close(fd)


def write_atomically(path: str | os.PathLike, data, *, sync_dir: bool = True,
                     tmp: str | os.PathLike | None = None) -> int:
    """Replace ``path`` by ``data`` (a buffer, or an iterable of buffers written in turn)
    as a private file, so that a crash leaves the old file or the new one: temporary
    file, fsync, rename, directory fsync (unless ``sync_dir`` is False, for a caller that
    fsyncs the directory once for several files). Returns the bytes written.

    The temporary file is ``tmp``, or by default ``.<name>.<pid>-<random>.tmp``, unique,
    so that two processes replacing one file at once never write into each other's
    temporary file (:func:`is_temporary` recognises the name).
    """
    path = Path(path)
    tmp = Path(tmp) if tmp is not None else path.with_name(
        f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    chunks = [data] if isinstance(data, bytes | bytearray | memoryview) else data
    total = 0
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, PRIVATE_FILE)
    try:
        os.fchmod(fd, PRIVATE_FILE)  # a leftover temporary file keeps its old mode
        for chunk in chunks:
            write_all(fd, chunk)
            total += memoryview(chunk).nbytes
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    os.close(fd)
    os.replace(tmp, path)
    if sync_dir:
        fsync_dir(path.parent)
    return total


def allocated_bytes(root: str | os.PathLike) -> int:
    """Bytes of disk the regular files under ``root`` occupy (their blocks, not their
    sizes: a sparse or preallocated file counts what it holds), or ``root`` itself when
    it is one file. A file removed while the tree is walked (a bucket evicted meanwhile)
    counts nothing."""
    if os.path.isfile(root):
        return os.stat(root).st_blocks * 512
    total = 0
    for folder, _, files in os.walk(root):
        for name in files:
            try:
                total += os.lstat(os.path.join(folder, name)).st_blocks * 512
            except FileNotFoundError:
                continue
    return total
