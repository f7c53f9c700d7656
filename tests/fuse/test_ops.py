"""The request handlers called directly, without the kernel: what the ``ro`` mount
option hides (the kernel refuses most writes before they reach the handlers), inode
bookkeeping, and readdir offsets."""

from __future__ import annotations

import errno
import os

import pytest
import trio

from kvstored.errors import StoreError
from kvstored.sdk.errors import BackendError
from kvstored.sdk.registry import open_backend
from tests.conftest import require

try:
    import pyfuse3

    from kvstored.fuse.inodes import InodeTable
    from kvstored.fuse.listing import REMEMBERED_OFFSETS, DirListing
    from kvstored.fuse.offline import OfflineSource
    from kvstored.fuse.ops import KvstoreOperations
    from kvstored.fuse.tree import KEYS, Child, Tree
except ImportError as exc:  # the fixture below skips, or fails where FUSE is required
    MISSING: ImportError | None = exc
else:
    MISSING = None


@pytest.fixture(autouse=True)
def _pyfuse3():
    require("fuse", MISSING is None, f"pyfuse3 does not import ({MISSING})")


@pytest.fixture
def ops(tmp_path):
    backend = open_backend("bucket", tmp_path / "ssd")
    backend.batch_write([("k", b"value"), ("other", b"x" * 100)])
    operations = KvstoreOperations(Tree(OfflineSource(backend)))
    yield operations
    backend.close()


def _errno_of(coroutine_function, *args) -> int:
    async def call():
        await coroutine_function(*args)

    with pytest.raises(pyfuse3.FUSEError) as refused:
        trio.run(call)
    return refused.value.errno


def test_every_mutating_handler_refuses_with_erofs(ops):
    ctx = None
    keys = ops.inodes.inode_of(KEYS)
    inode = trio.run(ops.lookup, keys, b"k", ctx).st_ino
    calls = {
        "setattr": (ops.setattr, inode, None, None, None, ctx),
        "mknod": (ops.mknod, keys, b"n", 0o644, 0, ctx),
        "mkdir": (ops.mkdir, keys, b"d", 0o755, ctx),
        "unlink": (ops.unlink, keys, b"k", ctx),
        "rmdir": (ops.rmdir, pyfuse3.ROOT_INODE, b"keys", ctx),
        "symlink": (ops.symlink, keys, b"l", b"k", ctx),
        "rename": (ops.rename, keys, b"k", keys, b"j", 0, ctx),
        "link": (ops.link, inode, keys, b"h", ctx),
        "write": (ops.write, 1, 0, b"x"),
        "create": (ops.create, keys, b"c", 0o644, os.O_WRONLY, ctx),
        "setxattr": (ops.setxattr, inode, b"user.kvstored.tier", b"ssd", ctx),
        "removexattr": (ops.removexattr, inode, b"user.kvstored.tier", ctx),
    }
    for name, (handler, *args) in calls.items():
        assert _errno_of(handler, *args) == errno.EROFS, name
    for flags in (os.O_WRONLY, os.O_RDWR, os.O_RDONLY | os.O_TRUNC, os.O_WRONLY | os.O_APPEND):
        assert _errno_of(ops.open, inode, flags, ctx) == errno.EROFS


def test_lookups_reads_and_forget(ops):
    keys = ops.inodes.inode_of(KEYS)

    async def scenario():
        attrs = await ops.lookup(keys, b"k", None)
        again = await ops.lookup(keys, b"k", None)
        assert again.st_ino == attrs.st_ino and attrs.st_size == 5
        info = await ops.open(attrs.st_ino, os.O_RDONLY, None)
        assert bytes(await ops.read(info.fh, 1, 3)) == b"alu"
        assert bytes(await ops.read(info.fh, 4, 100)) == b"e"
        await ops.release(info.fh)
        await ops.forget([(attrs.st_ino, 2)])
        assert ops.inodes.identity(attrs.st_ino) is None  # the kernel let go of it
        # Looked up again, it has the same number.
        assert (await ops.lookup(keys, b"k", None)).st_ino == attrs.st_ino
        with pytest.raises(pyfuse3.FUSEError) as gone:
            await ops.lookup(keys, b"nope", None)
        assert gone.value.errno == errno.ENOENT
        with pytest.raises(pyfuse3.FUSEError) as bad:
            await ops.lookup(keys, b"%zz", None)
        assert bad.value.errno == errno.ENOENT

    trio.run(scenario)


def test_inode_numbers_are_stable_distinct_and_fixed_ones_stay():
    table = InodeTable({("root",): pyfuse3.ROOT_INODE})
    a, b = table.inode_of(("object", "a")), table.inode_of(("object", "b"))
    assert a != b and a > 2**62 and b > 2**62
    table.remember(a)
    table.forget(a, 1)
    assert table.identity(a) is None
    assert InodeTable({("root",): 1}).inode_of(("object", "a")) == a  # across mounts too
    table.forget(pyfuse3.ROOT_INODE, 10)
    assert table.identity(pyfuse3.ROOT_INODE) == ("root",)


def test_inode_collisions_are_probed_not_aliased(monkeypatch):
    from kvstored.fuse import inodes

    monkeypatch.setattr(inodes, "_hashed", lambda identity: 2**62 + 5)
    table = InodeTable({("root",): 1})
    first, second = table.inode_of(("object", "a")), table.inode_of(("object", "b"))
    assert first != second
    assert table.identity(first) == ("object", "a") and table.identity(second) == ("object", "b")


def _sorted_stream(keys: list[str]):
    def open_stream(after: str | None):
        async def stream():
            for key in keys:
                if after is None or key > after:
                    yield Child(key.encode(), ("object", key), cursor=key)
        return stream()
    return open_stream


async def _kernel_reads(listing: DirListing, start: int, room: int) -> list[str]:
    """One readdir call: entries from ``start`` until ``room`` of them filled the buffer."""
    got = []
    async with listing.lock:
        await listing.seek(start)
        while (child := await listing.next()) is not None:
            if len(got) == room:
                listing.hold(child)
                break
            got.append(child.name.decode())
            listing.accept(child)
    return got


@pytest.mark.parametrize("resumable", [True, False])
def test_readdir_offsets_resume_anywhere(resumable):
    keys = [f"k{i:05d}" for i in range(REMEMBERED_OFFSETS + 500)]

    async def scenario():
        listing = DirListing(_sorted_stream(keys), resumable)
        got, offset = [], 0
        while batch := await _kernel_reads(listing, offset, 97):
            got += batch
            offset += len(batch)
        assert got == keys
        assert await _kernel_reads(listing, len(keys) - 3, 10) == keys[-3:]  # by cursor
        assert await _kernel_reads(listing, 5, 4) == keys[5:9]  # forgotten: listed again
        assert await _kernel_reads(listing, 9, 2) == keys[9:11]  # and on from there
        assert await _kernel_reads(listing, 0, 3) == keys[:3]  # rewinddir
        await listing.close()

    trio.run(scenario)


def test_a_source_raises_the_cores_errors_only_and_the_handlers_answer_eio(tmp_path, caplog):
    """The seam maps a backend's errors once (kvstored.fuse.sources): a closed backend's
    BackendClosedError comes out as a StoreError, and a lookup gets EIO with a warning,
    not a traceback."""
    backend = open_backend("bucket", tmp_path / "ssd")
    backend.batch_write([("k", b"value")])
    source = OfflineSource(backend)
    operations = KvstoreOperations(Tree(source))
    keys = operations.inodes.inode_of(KEYS)
    backend.close()

    async def stat() -> None:
        await source.stat("k")

    with pytest.raises(StoreError) as caught:
        trio.run(stat)
    assert not isinstance(caught.value, BackendError), type(caught.value)
    assert _errno_of(operations.lookup, keys, b"k", None) == errno.EIO
    logged = [r for r in caplog.records if r.name == "kvstored.fuse"]
    assert logged and not any(r.exc_info for r in logged)  # a warning, not a bug
