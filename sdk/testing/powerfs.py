"""A FUSE file system that can lose power: every write not made durable is lost at a cut.

The kit's power-loss checks (:mod:`kvstored.sdk.testing.checks.power`) run a backend on
this file system. It keeps every file and directory in memory twice: as the running
system sees it, and as a disk would hold it after a power cut. Only these make state
durable:

- ``fsync``/``fdatasync`` of a file: its data pages, size and mode (O_DIRECT writes are
  no different: a drive's volatile write cache loses them until a flush);
- every write through a descriptor opened ``O_SYNC``/``O_DSYNC``;
- ``fsync`` of a directory: its entries (creates, renames in and out, unlinks, mkdirs).

The metadata model is the strict one of a file system without journal ordering (ext2,
or ext4 promising no more than POSIX): a file's fsync does not make its name durable, a
rename is durable in each directory only when that directory is synced (so a rename
whose source directory alone was synced loses the file, and one whose target alone was
synced leaves it under both names), and a file or directory whose entry was lost is lost
with everything under it.

At a cut (:meth:`PowerFs.cut`), with ``survival`` 0 everything unsynced is lost. With a
``survival`` p > 0 the cut is crueller and more realistic: each unsynced 4 KiB page
reaches the "disk" with probability p (independently, so a record may tear), a file's
unsynced size likewise, and each directory keeps a random prefix of its unsynced entry
changes (each next one with probability p). The random choices come from a seed the
caller gives and logs.

Every file is opened ``direct_io`` towards the kernel, so no page cache sits between the
backend and this model, and O_DIRECT opens work at any alignment; ``fallocate`` is not
offered (pyfuse3 has no such operation), so ``posix_fallocate`` falls back to glibc's
emulation and ``fallocate(2)`` callers see EOPNOTSUPP.

Run as a process (what :class:`kvstored.sdk.testing.powerloss.PowerLossMount` does)::

    python -m kvstored.sdk.testing.powerfs MOUNTPOINT

It prints ``{"ready": MOUNTPOINT}`` once mounted, then obeys one command per line on
stdin, answering each with one line of JSON: ``cut SURVIVAL SEED`` (power off: the state
becomes what the disk holds and every operation fails with EIO), ``arm N SURVIVAL SEED``
(the same cut, in place of the N-th operation from now that would change something),
``on`` (power back), ``fail OPS ERRNO COUNT`` (fault injection: the next ``COUNT``
operations named in the comma-separated ``OPS``, or every one with ``COUNT`` 0, fail with
the error number ``ERRNO`` and change nothing; see :data:`FAULTABLE`), ``heal`` (they stop
failing), ``stats`` (the counters; ``cuts`` tells whether an armed cut happened,
``faults`` how many operations an injected fault failed). End of input unmounts and
exits. This module is the file system only; it knows nothing of backends.
"""

from __future__ import annotations

import errno
import json
import os
import random
import stat
import sys
import time
from dataclasses import asdict, dataclass, field

PAGE = 4096
ROOT_INODE = 1  # pyfuse3.ROOT_INODE, without importing pyfuse3 for the model alone
#: One shared all-zero page: glibc's posix_fallocate emulation writes a zero byte into
#: every block of a preallocated volume, and those pages need no memory of their own.
ZERO_PAGE = bytes(PAGE)
#: The operations a fault can be injected into, by their FUSE names: ``write``, ``fsync``
#: (a file's fsync and fdatasync alike), ``fdatasync`` (that alone), ``fsyncdir``, and the
#: namespace changes that allocate (``create`` also stands for ``mknod``: both make a file).
FAULTABLE = frozenset({"write", "fsync", "fdatasync", "fsyncdir", "create", "mkdir",
                       "rename", "setattr"})


@dataclass
class Counters:
    """What the backend did and what the cut lost; the kit prints these."""

    #: Operations that change something (writes, syncs, namespace changes, truncations).
    mutations: int = 0
    writes: int = 0
    fsyncs: int = 0
    dir_fsyncs: int = 0
    direct_opens: int = 0
    sync_opens: int = 0
    cuts: int = 0
    #: Operations an injected fault failed (``fail``), all kinds together.
    faults: int = 0
    lost_pages: int = 0
    lost_sizes: int = 0
    lost_entries: int = 0
    lost_inodes: int = 0


@dataclass
class Node:
    """One inode, as the running system sees it and as the disk holds it."""

    ino: int
    mode: int
    uid: int
    gid: int
    durable_mode: int
    # files
    pages: dict[int, bytes] = field(default_factory=dict)
    size: int = 0
    durable_pages: dict[int, bytes] = field(default_factory=dict)
    durable_size: int = 0
    dirty: set[int] = field(default_factory=set)
    # directories: name -> inode, and the unsynced changes in order (name, inode or None)
    entries: dict[bytes, int] = field(default_factory=dict)
    durable_entries: dict[bytes, int] = field(default_factory=dict)
    log: list[tuple[bytes, int | None]] = field(default_factory=list)
    nlink: int = 0
    mtime_ns: int = field(default_factory=time.time_ns)

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.mode)

    def blocks(self) -> int:
        last = -(-self.size // PAGE)
        return sum(1 for i in self.pages if i < last) * (PAGE // 512)

    # -- data ----------------------------------------------------------------------

    def read(self, offset: int, length: int) -> bytes:
        end = min(offset + length, self.size)
        if offset >= end:
            return b""
        out = bytearray(end - offset)
        first, last = offset // PAGE, (end - 1) // PAGE
        for index in range(first, last + 1):
            page = self.pages.get(index)
            if page is None:
                continue
            start = index * PAGE
            lo, hi = max(start, offset), min(start + PAGE, end)
            out[lo - offset:hi - offset] = page[lo - start:hi - start]
        return bytes(out)

    def write(self, offset: int, data: bytes) -> None:
        view = memoryview(data)
        position = offset
        while view:
            index, within = divmod(position, PAGE)
            take = min(PAGE - within, len(view))
            if within == 0 and take == PAGE:
                page = bytes(view[:PAGE])
            else:
                edited = bytearray(self.pages.get(index, ZERO_PAGE))
                edited[within:within + take] = view[:take]
                page = bytes(edited)
            self.pages[index] = ZERO_PAGE if page == ZERO_PAGE else page
            self.dirty.add(index)
            view = view[take:]
            position += take
        self.size = max(self.size, offset + len(data))
        self.mtime_ns = time.time_ns()

    def truncate(self, size: int) -> None:
        keep = -(-size // PAGE)
        for index in [i for i in self.pages if i >= keep]:
            del self.pages[index]
            self.dirty.add(index)
        if size % PAGE and (size // PAGE) in self.pages:
            index, within = divmod(size, PAGE)
            self.pages[index] = self.pages[index][:within] + bytes(PAGE - within)
            self.dirty.add(index)
        self.size = size
        self.mtime_ns = time.time_ns()

    def sync_data(self) -> None:
        for index in self.dirty:
            page = self.pages.get(index)
            if page is None:
                self.durable_pages.pop(index, None)
            else:
                self.durable_pages[index] = page
        self.dirty.clear()
        self.durable_size = self.size
        self.durable_mode = self.mode

    # -- directories ---------------------------------------------------------------

    def set_entry(self, name: bytes, ino: int | None) -> None:
        if ino is None:
            del self.entries[name]
        else:
            self.entries[name] = ino
        self.log.append((name, ino))
        self.mtime_ns = time.time_ns()

    def sync_entries(self) -> None:
        self.durable_entries = dict(self.entries)
        self.log.clear()
        self.durable_mode = self.mode

    # -- the cut -------------------------------------------------------------------

    def lose_power(self, survival: float, rng: random.Random, counters: Counters) -> None:
        """Become what the disk holds: unsynced changes survive with ``survival``."""
        for index in sorted(self.dirty):
            if survival and rng.random() < survival:
                page = self.pages.get(index)
                if page is None:
                    self.durable_pages.pop(index, None)
                else:
                    self.durable_pages[index] = page
            else:
                counters.lost_pages += 1
        if self.size != self.durable_size:
            if survival and rng.random() < survival:
                self.durable_size = self.size
            else:
                counters.lost_sizes += 1
        keep = 0
        while keep < len(self.log) and survival and rng.random() < survival:
            keep += 1
        for name, ino in self.log[:keep]:
            if ino is None:
                self.durable_entries.pop(name, None)
            else:
                self.durable_entries[name] = ino
        counters.lost_entries += len(self.log) - keep
        self.log.clear()
        last = -(-self.durable_size // PAGE)
        self.pages = {i: p for i, p in self.durable_pages.items() if i < last}
        index, within = divmod(self.durable_size, PAGE)
        if within and index in self.pages:  # bytes past the end read as zeros if it grows
            self.pages[index] = self.pages[index][:within] + bytes(PAGE - within)
        self.durable_pages = dict(self.pages)
        self.size = self.durable_size
        self.dirty.clear()
        self.entries = dict(self.durable_entries)
        self.mode = self.durable_mode


class Model:
    """The whole file system's state, with no FUSE in it (so it can be tested alone)."""

    def __init__(self) -> None:
        self.nodes: dict[int, Node] = {}
        self.next_ino = ROOT_INODE
        self.counters = Counters()
        root = self.new_node(stat.S_IFDIR | 0o755, 0, 0)
        root.nlink = 2

    def new_node(self, mode: int, uid: int, gid: int) -> Node:
        node = Node(self.next_ino, mode, uid, gid, durable_mode=mode)
        self.nodes[node.ino] = node
        self.next_ino += 1  # never reused: the kernel may still name a lost inode
        return node

    def node(self, ino: int) -> Node:
        node = self.nodes.get(ino)
        if node is None:
            raise OSError(errno.ENOENT, "no such inode (lost at a power cut?)")
        return node

    def cut(self, survival: float, seed: int) -> Counters:
        """The power goes: every node becomes what the disk holds, and nodes no durable
        entry reaches are gone."""
        rng = random.Random(seed)
        self.counters.cuts += 1
        for ino in sorted(self.nodes):
            self.nodes[ino].lose_power(survival, rng, self.counters)
        reachable, todo = {ROOT_INODE}, [ROOT_INODE]
        links: dict[int, int] = {}
        while todo:
            directory = self.nodes[todo.pop()]
            for ino in directory.entries.values():
                links[ino] = links.get(ino, 0) + 1
                if ino not in reachable and ino in self.nodes:
                    reachable.add(ino)
                    if self.nodes[ino].is_dir:
                        todo.append(ino)
        lost = set(self.nodes) - reachable
        self.counters.lost_inodes += len(lost)
        for ino in lost:
            del self.nodes[ino]
        for directory in [n for n in self.nodes.values() if n.is_dir]:
            # an entry whose inode's own entry elsewhere was lost cannot point anywhere
            directory.entries = {k: v for k, v in directory.entries.items()
                                 if v in self.nodes}
            directory.durable_entries = dict(directory.entries)
        for node in self.nodes.values():
            node.nlink = links.get(node.ino, 0) + (1 if node.is_dir else 0)
        self.nodes[ROOT_INODE].nlink = 2
        return self.counters


@dataclass
class Fault:
    """An injected fault: ``operations`` (names of :data:`FAULTABLE`) fail with ``code``,
    the next ``left`` of them, or every one until healed when ``left`` is None."""

    operations: frozenset[str]
    code: int
    left: int | None = None

    @classmethod
    def parse(cls, words: list[str]) -> Fault:
        """``OPS ERRNO COUNT`` as the ``fail`` command takes them; ValueError if wrong."""
        if len(words) != 3:
            raise ValueError("fail takes OPS ERRNO COUNT")
        operations = frozenset(words[0].split(","))
        unknown = operations - FAULTABLE
        if unknown:
            raise ValueError(f"cannot inject a fault into {sorted(unknown)}; "
                             f"one of {sorted(FAULTABLE)}")
        count = int(words[2])
        return cls(operations, int(words[1]), count if count > 0 else None)


def _serve(mountpoint: str) -> None:
    """Mount the power-loss file system on ``mountpoint`` and obey stdin until EOF."""
    import pyfuse3
    import trio

    model = Model()
    #: ``armed``: (mutations left, survival, seed) of a cut set to happen by itself;
    #: ``fault``: the injected fault, or None.
    state: dict = {"powered": True, "armed": None, "fault": None}

    def fail(code: int):
        return pyfuse3.FUSEError(code)

    def attributes(node: Node):
        entry = pyfuse3.EntryAttributes()
        entry.st_ino = node.ino
        entry.generation = 0
        entry.entry_timeout = 0
        entry.attr_timeout = 0
        entry.st_mode = node.mode
        entry.st_nlink = max(node.nlink, 2) if node.is_dir else node.nlink
        entry.st_uid = node.uid
        entry.st_gid = node.gid
        entry.st_rdev = 0
        entry.st_size = node.size if not node.is_dir else PAGE
        entry.st_blksize = PAGE
        entry.st_blocks = node.blocks() if not node.is_dir else 8
        entry.st_atime_ns = entry.st_mtime_ns = entry.st_ctime_ns = node.mtime_ns
        return entry

    class Handle:
        __slots__ = ("listing", "node", "sync")

        def __init__(self, node: Node, sync: bool = False):
            self.node, self.sync = node, sync
            #: A directory's entries as its first readdir saw them: later pages of one
            #: listing must not shift under the reader.
            self.listing: list[tuple[bytes, int]] | None = None

    handles: dict[int, Handle] = {}
    next_fh = [1]

    def new_handle(node: Node, sync: bool = False) -> int:
        fh = next_fh[0]
        next_fh[0] += 1
        handles[fh] = Handle(node, sync)
        return fh

    changing = {"setattr", "mkdir", "create", "mknod", "link", "unlink", "rmdir", "rename",
                "write", "fsync", "fsyncdir"}

    def powered(function):
        """Every operation fails with EIO while the power is off, and an OSError from
        the model becomes the FUSE error of its errno. An injected fault fails the
        operations it names before they change anything. An armed cut happens instead of
        the operation that changes something once its count runs out."""
        mutates = function.__name__ in changing
        kind = "create" if function.__name__ == "mknod" else function.__name__

        async def wrapper(self, *args, **kwargs):
            if not state["powered"]:
                raise fail(errno.EIO)
            fault: Fault | None = state["fault"]
            if fault is not None and (kind in fault.operations or (
                    kind == "fsync" and args[1] and "fdatasync" in fault.operations)):
                model.counters.faults += 1
                if fault.left is not None:
                    fault.left -= 1
                    if fault.left <= 0:
                        state["fault"] = None
                raise fail(fault.code)
            if mutates:
                model.counters.mutations += 1
                if state["armed"] is not None:
                    left, survival, seed = state["armed"]
                    state["armed"] = (left - 1, survival, seed) if left > 1 else None
                    if left <= 1:
                        state["powered"] = False
                        model.cut(survival, seed)
                        raise fail(errno.EIO)
            try:
                return await function(self, *args, **kwargs)
            except OSError as exc:
                raise fail(exc.errno or errno.EIO) from None
        wrapper.__name__ = function.__name__
        return wrapper

    class Operations(pyfuse3.Operations):
        supports_dot_lookup = False
        enable_writeback_cache = False

        @powered
        async def lookup(self, parent_inode, name, ctx=None):
            directory = model.node(parent_inode)
            if name == b".":
                return attributes(directory)
            ino = directory.entries.get(name)
            if ino is None or ino not in model.nodes:
                raise fail(errno.ENOENT)
            return attributes(model.nodes[ino])

        @powered
        async def getattr(self, inode, ctx=None):
            return attributes(model.node(inode))

        @powered
        async def setattr(self, inode, attr, fields, fh, ctx):
            node = model.node(inode)
            if fields.update_size:
                if node.is_dir:
                    raise fail(errno.EISDIR)
                node.truncate(attr.st_size)
            if fields.update_mode:
                node.mode = stat.S_IFMT(node.mode) | stat.S_IMODE(attr.st_mode)
            if fields.update_uid:
                node.uid = attr.st_uid
            if fields.update_gid:
                node.gid = attr.st_gid
            if fields.update_mtime:
                node.mtime_ns = attr.st_mtime_ns
            return attributes(node)

        async def forget(self, inode_list):
            return None

        @powered
        async def statfs(self, ctx):
            data = pyfuse3.StatvfsData()
            data.f_bsize = data.f_frsize = PAGE
            data.f_blocks = 1 << 24  # 64 GiB
            used = sum(n.blocks() for n in model.nodes.values()) // (PAGE // 512)
            data.f_bfree = data.f_bavail = max(data.f_blocks - used, 0)
            data.f_files, data.f_ffree, data.f_favail = 1 << 20, 1 << 20, 1 << 20
            data.f_namemax = 255
            return data

        # -- namespace -------------------------------------------------------------

        def _add(self, parent_inode, name, mode, ctx) -> Node:
            directory = model.node(parent_inode)
            if not directory.is_dir:
                raise fail(errno.ENOTDIR)
            if name in directory.entries:
                raise fail(errno.EEXIST)
            node = model.new_node(mode, ctx.uid, ctx.gid)
            node.nlink = 2 if node.is_dir else 1
            directory.set_entry(name, node.ino)
            if node.is_dir:
                directory.nlink += 1
            return node

        @powered
        async def mkdir(self, parent_inode, name, mode, ctx):
            return attributes(self._add(parent_inode, name, stat.S_IFDIR | stat.S_IMODE(mode),
                                        ctx))

        @powered
        async def create(self, parent_inode, name, mode, flags, ctx):
            node = self._add(parent_inode, name, stat.S_IFREG | stat.S_IMODE(mode), ctx)
            return pyfuse3.FileInfo(fh=self._opened(node, flags), direct_io=True), \
                attributes(node)

        @powered
        async def mknod(self, parent_inode, name, mode, rdev, ctx):
            if not stat.S_ISREG(mode):
                raise fail(errno.EPERM)
            return attributes(self._add(parent_inode, name, mode, ctx))

        @powered
        async def link(self, inode, new_parent_inode, new_name, ctx):
            node = model.node(inode)
            directory = model.node(new_parent_inode)
            if node.is_dir:
                raise fail(errno.EPERM)
            if new_name in directory.entries:
                raise fail(errno.EEXIST)
            directory.set_entry(new_name, node.ino)
            node.nlink += 1
            return attributes(node)

        def _remove(self, parent_inode, name, want_dir: bool) -> None:
            directory = model.node(parent_inode)
            ino = directory.entries.get(name)
            if ino is None:
                raise fail(errno.ENOENT)
            node = model.node(ino)
            if want_dir and not node.is_dir:
                raise fail(errno.ENOTDIR)
            if not want_dir and node.is_dir:
                raise fail(errno.EISDIR)
            if node.is_dir and node.entries:
                raise fail(errno.ENOTEMPTY)
            directory.set_entry(name, None)
            node.nlink -= 1
            if node.is_dir:
                directory.nlink -= 1

        @powered
        async def unlink(self, parent_inode, name, ctx):
            self._remove(parent_inode, name, want_dir=False)

        @powered
        async def rmdir(self, parent_inode, name, ctx):
            self._remove(parent_inode, name, want_dir=True)

        @powered
        async def rename(self, parent_inode_old, name_old, parent_inode_new, name_new,
                         flags, ctx):
            source = model.node(parent_inode_old)
            target = model.node(parent_inode_new)
            ino = source.entries.get(name_old)
            if ino is None:
                raise fail(errno.ENOENT)
            if flags & ~pyfuse3.RENAME_NOREPLACE:
                raise fail(errno.EINVAL)  # RENAME_EXCHANGE is not modelled
            replaced = target.entries.get(name_new)
            if replaced is not None:
                if flags & pyfuse3.RENAME_NOREPLACE:
                    raise fail(errno.EEXIST)
                if replaced == ino:
                    return
                old = model.node(replaced)
                if old.is_dir and old.entries:
                    raise fail(errno.ENOTEMPTY)
                old.nlink -= 1
            source.set_entry(name_old, None)
            target.set_entry(name_new, ino)

        # -- files -----------------------------------------------------------------

        def _opened(self, node: Node, flags: int) -> int:
            if flags & os.O_DIRECT:
                model.counters.direct_opens += 1
            sync = bool(flags & (os.O_SYNC | os.O_DSYNC))
            if sync:
                model.counters.sync_opens += 1
            return new_handle(node, sync)

        @powered
        async def open(self, inode, flags, ctx):
            node = model.node(inode)
            if node.is_dir:
                raise fail(errno.EISDIR)
            if flags & os.O_TRUNC:
                node.truncate(0)
            return pyfuse3.FileInfo(fh=self._opened(node, flags), direct_io=True)

        @powered
        async def read(self, fh, off, size):
            return handles[fh].node.read(off, size)

        @powered
        async def write(self, fh, off, buf):
            handle = handles[fh]
            handle.node.write(off, buf)
            model.counters.writes += 1
            if handle.sync:
                handle.node.sync_data()
            return len(buf)

        @powered
        async def fsync(self, fh, datasync):
            model.counters.fsyncs += 1
            handles[fh].node.sync_data()

        @powered
        async def flush(self, fh):
            return None  # close(2) makes nothing durable

        async def release(self, fh):
            handles.pop(fh, None)

        # -- directories -----------------------------------------------------------

        @powered
        async def opendir(self, inode, ctx):
            node = model.node(inode)
            if not node.is_dir:
                raise fail(errno.ENOTDIR)
            return new_handle(node)

        @powered
        async def readdir(self, fh, start_id, token):
            handle = handles[fh]
            listing = handle.listing
            if listing is None or start_id == 0:
                listing = handle.listing = sorted(handle.node.entries.items())
            for number, (name, ino) in enumerate(listing[start_id:], start_id + 1):
                node = model.nodes.get(ino)
                if node is None:
                    continue
                if not pyfuse3.readdir_reply(token, name, attributes(node), number):
                    break

        @powered
        async def fsyncdir(self, fh, datasync):
            model.counters.dir_fsyncs += 1
            handles[fh].node.sync_entries()

        async def releasedir(self, fh):
            handles.pop(fh, None)

    def answer(payload: dict) -> None:
        sys.stdout.write(json.dumps(payload) + "\n")
        sys.stdout.flush()

    async def obey() -> None:
        stream = trio.lowlevel.FdStream(os.dup(sys.stdin.fileno()))
        pending = b""
        while True:
            chunk = await stream.receive_some(4096)
            if not chunk:
                break
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                words = line.decode().split()
                if not words:
                    continue
                if words[0] == "cut":
                    state["powered"] = False
                    model.cut(float(words[1]), int(words[2]))
                    answer(asdict(model.counters))
                elif words[0] == "arm":
                    state["armed"] = (int(words[1]), float(words[2]), int(words[3]))
                    answer(asdict(model.counters))
                elif words[0] == "fail":
                    try:
                        state["fault"] = Fault.parse(words[1:])
                    except ValueError as exc:
                        answer({"error": str(exc)})
                        continue
                    answer(asdict(model.counters))
                elif words[0] == "heal":
                    state["fault"] = None
                    answer(asdict(model.counters))
                elif words[0] == "on":
                    state["powered"] = True
                    answer(asdict(model.counters))
                elif words[0] == "stats":
                    answer(asdict(model.counters))
                else:
                    answer({"error": f"unknown command {words[0]!r}"})
        pyfuse3.terminate()

    async def main() -> None:
        options = set(pyfuse3.default_options) | {"fsname=kvstored-powerfs",
                                                  "subtype=kvstored-powerfs"}
        pyfuse3.init(Operations(), mountpoint, options)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(obey)
                answer({"ready": mountpoint})
                await pyfuse3.main()
                nursery.cancel_scope.cancel()
        finally:
            pyfuse3.close(unmount=True)

    trio.run(main)


if __name__ == "__main__":
    _serve(sys.argv[1])
