"""The pyfuse3 request handlers: FUSE and nothing else.

Each handler turns a kernel request into a question for the :class:`~kvstored.fuse.tree.
Tree` (names, listings) or an open file (:mod:`kvstored.fuse.files`), and the answer into
a FUSE reply. Every request that would change anything gets ``EROFS``; the mount is
``ro`` as well, so the kernel refuses most of them before they get here.

Caching, since objects are immutable but may be removed (and a removed key written
again): names and attributes are cached by the kernel for :data:`OBJECT_TIMEOUT`
seconds. By default object files are ``direct_io``: every ``read()`` is one request
(up to 1 MiB), served from the value fetched at the first read, and nothing stale can
outlive an open. With ``direct_io=False`` (``kvstore mount --page-cache``) pages stay
cached across opens (``keep_cache``) unless the object's size or checksum changed since
the file was last opened; mmap then works too. Statistics files are always
``direct_io``: rendered at open, never cached.

A failure inside a handler fails that request only: ``ENOENT`` for an object that is
gone, ``EIO`` for corrupt data, an unreachable cluster, or a bug (logged with its
traceback); the mount stays up.
"""

from __future__ import annotations

import errno
import functools
import itertools
import logging
import os
import stat
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import pyfuse3
import trio

from kvstored.errors import CorruptDataError, NotFoundError, StoreError
from kvstored.fuse.files import BufferPool, OpenDocument, OpenObject
from kvstored.fuse.inodes import Identity, InodeTable
from kvstored.fuse.listing import DirListing
from kvstored.fuse.sources import Entry
from kvstored.fuse.tree import Child, Tree, is_directory, is_object

log = logging.getLogger("kvstored.fuse")

#: Seconds the kernel may cache an object's name and attributes: how long a removed
#: key can still be stat'ed through a cached name.
OBJECT_TIMEOUT = 1.0
#: The same for the fixed directories, which never change.
FIXED_TIMEOUT = 60.0
#: The I/O size the mount suggests to readers (``st_blksize``): large reads are cheap.
BLOCK_SIZE = 1 << 20
#: The prefix of every extended attribute of an object file.
XATTR_PREFIX = b"user.kvstored."

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND
F = TypeVar("F", bound=Callable[..., Awaitable[Any]])


def _replies_errno(handler: F) -> F:
    """Turn what a handler raises into the errno the caller sees."""

    @functools.wraps(handler)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return await handler(*args, **kwargs)
        except pyfuse3.FUSEError:
            raise
        # The sources raise the core's errors only (kvstored.fuse.sources).
        except NotFoundError:
            raise pyfuse3.FUSEError(errno.ENOENT) from None
        except CorruptDataError as exc:
            log.warning("%s: %s; reads of it fail with EIO", handler.__name__, exc)
            raise pyfuse3.FUSEError(errno.EIO) from None
        except StoreError as exc:
            log.warning("%s: %s", handler.__name__, exc)
            raise pyfuse3.FUSEError(errno.EIO) from None
        except Exception:
            log.exception("%s failed; the request gets EIO", handler.__name__)
            raise pyfuse3.FUSEError(errno.EIO) from None

    return wrapper  # type: ignore[return-value]


async def _refuse(*_args: Any, **_kwargs: Any) -> Any:
    raise pyfuse3.FUSEError(errno.EROFS)


class KvstoreOperations(pyfuse3.Operations):
    """The read-only kvstored file system over ``tree``."""

    def __init__(self, tree: Tree, *, direct_io: bool = True) -> None:
        super().__init__()
        self.tree = tree
        self.direct_io = direct_io
        self._fixed = tree.fixed()
        self.inodes = InodeTable(self._fixed)
        self.pool = BufferPool()
        self._files: dict[int, OpenObject | OpenDocument] = {}
        self._dirs: dict[int, DirListing] = {}
        self._handles = itertools.count(1)
        self._started_ns = time.time_ns()
        self._uid, self._gid = os.getuid(), os.getgid()
        #: Set once the kernel's INIT request is answered (the mount is usable).
        self.initialized = trio.Event()

    def init(self) -> None:
        self.initialized.set()

    # -- attributes --------------------------------------------------------------------

    def _attributes(self, identity: Identity, entry: Entry | None) -> pyfuse3.EntryAttributes:
        attrs = pyfuse3.EntryAttributes()
        attrs.st_ino = self.inodes.inode_of(identity)
        fixed = identity in self._fixed
        attrs.entry_timeout = attrs.attr_timeout = FIXED_TIMEOUT if fixed else OBJECT_TIMEOUT
        if is_directory(identity):
            attrs.st_mode = stat.S_IFDIR | 0o555
            attrs.st_nlink = 2
        else:
            attrs.st_mode = stat.S_IFREG | 0o444
            attrs.st_nlink = 1
            # Statistics files say 0 bytes, as /proc does: they are direct_io and read to
            # their end whatever the size says.
            attrs.st_size = entry.size if entry is not None else 0
        attrs.st_blksize = BLOCK_SIZE
        attrs.st_blocks = (attrs.st_size + 511) // 512
        when = self._started_ns if entry is None or entry.mtime is None \
            else int(entry.mtime * 1e9)
        attrs.st_atime_ns = attrs.st_mtime_ns = attrs.st_ctime_ns = when
        attrs.st_uid, attrs.st_gid = self._uid, self._gid
        return attrs

    def _reply_entry(self, child: Child) -> pyfuse3.EntryAttributes:
        attrs = self._attributes(child.identity, child.entry)
        self.inodes.remember(attrs.st_ino)
        return attrs

    def _identity(self, inode: int) -> Identity:
        identity = self.inodes.identity(inode)
        if identity is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return identity

    @_replies_errno
    async def lookup(self, parent_inode: int, name: bytes,
                     ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        child = await self.tree.lookup(self._identity(parent_inode), name)
        if child is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self._reply_entry(child)

    @_replies_errno
    async def getattr(self, inode: int, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        identity = self._identity(inode)
        current = await self.tree.current(identity)
        if current is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self._attributes(identity, current if isinstance(current, Entry) else None)

    async def forget(self, inode_list: Sequence[tuple[int, int]]) -> None:
        for inode, nlookup in inode_list:
            self.inodes.forget(inode, nlookup)

    @_replies_errno
    async def statfs(self, ctx: pyfuse3.RequestContext) -> pyfuse3.StatvfsData:
        space = await self.tree.source.space()
        data = pyfuse3.StatvfsData()
        data.f_bsize = data.f_frsize = 4096
        # df shows the store's capacity, use and free room (not writable through here).
        data.f_blocks = space.capacity_bytes // 4096
        data.f_bfree = data.f_bavail = max(0, space.capacity_bytes - space.used_bytes) // 4096
        data.f_files = space.objects
        data.f_ffree = data.f_favail = 0
        data.f_namemax = 255
        return data

    # -- directories -------------------------------------------------------------------

    @_replies_errno
    async def opendir(self, inode: int, ctx: pyfuse3.RequestContext) -> int:
        identity = self._identity(inode)
        if not is_directory(identity):
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        fh = next(self._handles)
        self._dirs[fh] = DirListing(functools.partial(self.tree.children, identity),
                                    self.tree.resumable(identity))
        return fh

    @_replies_errno
    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        listing = self._dirs[fh]
        async with listing.lock:
            await listing.seek(start_id)
            while (child := await listing.next()) is not None:
                attrs = self._attributes(child.identity, child.entry)
                if not pyfuse3.readdir_reply(token, child.name, attrs, listing.position + 1):
                    listing.hold(child)
                    self.inodes.discard_unreferenced(attrs.st_ino)
                    return
                self.inodes.remember(attrs.st_ino)
                listing.accept(child)

    async def releasedir(self, fh: int) -> None:
        listing = self._dirs.pop(fh, None)
        if listing is not None:
            await listing.close()

    # -- files -------------------------------------------------------------------------

    @_replies_errno
    async def open(self, inode: int, flags: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileInfo:
        if flags & _WRITE_FLAGS:
            raise pyfuse3.FUSEError(errno.EROFS)
        identity = self._identity(inode)
        if is_directory(identity):
            raise pyfuse3.FUSEError(errno.EISDIR)
        fh = next(self._handles)
        if is_object(identity):
            entry = await self.tree.source.stat(identity[1])
            if entry is None:
                raise pyfuse3.FUSEError(errno.ENOENT)
            # Pages cached from an earlier open are this object's, unless the key was
            # removed and written again (a new size or checksum): then drop them.
            version = (entry.size, entry.checksum)
            previous = self.inodes.swap_version(inode, version)
            self._files[fh] = OpenObject(self.tree.source, self.pool, entry.key, entry.size)
            if self.direct_io:
                return pyfuse3.FileInfo(fh=fh, direct_io=True)
            return pyfuse3.FileInfo(fh=fh, keep_cache=previous in (None, version))
        document = await self.tree.document(identity)
        if document is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        self._files[fh] = OpenDocument(document)
        return pyfuse3.FileInfo(fh=fh, direct_io=True)

    @_replies_errno
    async def read(self, fh: int, off: int, size: int) -> Any:
        return await self._files[fh].read(off, size)

    async def release(self, fh: int) -> None:
        handle = self._files.pop(fh, None)
        if handle is not None:
            handle.release()

    async def flush(self, fh: int) -> None:
        pass

    async def fsync(self, fh: int, datasync: bool) -> None:
        pass

    # -- extended attributes -----------------------------------------------------------

    @_replies_errno
    async def listxattr(self, inode: int, ctx: pyfuse3.RequestContext) -> list[bytes]:
        if not is_object(self._identity(inode)):
            return []
        return [XATTR_PREFIX + n.encode() for n in self.tree.source.xattr_names()]

    @_replies_errno
    async def getxattr(self, inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> bytes:
        identity = self._identity(inode)
        if not is_object(identity) or not name.startswith(XATTR_PREFIX):
            raise pyfuse3.FUSEError(pyfuse3.ENOATTR)
        try:
            return await self.tree.source.xattr(identity[1],
                                                name[len(XATTR_PREFIX):].decode("utf-8"))
        except (KeyError, UnicodeDecodeError):
            raise pyfuse3.FUSEError(pyfuse3.ENOATTR) from None

    # -- everything that would change something ----------------------------------------

    setattr = mknod = mkdir = unlink = rmdir = symlink = rename = link = _refuse
    write = create = setxattr = removexattr = _refuse
