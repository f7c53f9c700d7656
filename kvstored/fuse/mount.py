"""The life of a mount: mount ``ro``, serve in one trio nursery, unmount on the way out.

The mount ends when it is unmounted from outside (``fusermount3 -u MOUNTPOINT``), on
SIGINT or SIGTERM, or on an error; in every case the file system is unmounted and the
source (connection or backend) closed before :func:`mount` returns. Running it in the
background, and turning its errors into messages and exit codes, is the command line's
business (:mod:`kvstored.cli.mount_cmd`).
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable

import pyfuse3
import trio

from kvstored.fuse.errors import MountError
from kvstored.fuse.ops import KvstoreOperations
from kvstored.fuse.sources import Source
from kvstored.fuse.tree import Tree

log = logging.getLogger("kvstored.fuse")

#: The readahead a page-cache mount asks for (see _raise_readahead).
READAHEAD_KIB = 1024


def mount(open_source: Callable[[], Source], mountpoint: str, *, fsname: str,
          mounted: Callable[[str, str], None], direct_io: bool = True) -> None:
    """Mount what ``open_source()`` returns at ``mountpoint``, read-only, and serve it
    until it is unmounted or the process is signalled.

    ``mounted(mountpoint, fsname)`` is called once the mount is in place. Raises
    :class:`MountError` if the kernel refuses the mount; an error opening the source
    (the cluster unreachable, a backend directory that cannot be read) is raised as is.
    """
    source = open_source()
    trio.run(_serve, source, mountpoint, fsname, mounted, direct_io)


async def _serve(source: Source, mountpoint: str, fsname: str,
                 mounted: Callable[[str, str], None], direct_io: bool) -> None:
    try:
        operations = KvstoreOperations(Tree(source), direct_io=direct_io)
        # fuse option values are comma-separated: escape what a path may hold.
        escaped = fsname.replace("\\", "\\\\").replace(",", "\\,")
        options = set(pyfuse3.default_options) | {"ro", f"fsname={escaped}",
                                                  "subtype=kvstored"}
        try:
            pyfuse3.init(operations, mountpoint, options)
        except RuntimeError as exc:
            raise MountError(f"cannot mount on {mountpoint} ({exc}); is something already "
                             "mounted there, and does fusermount3 work?") from None
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_terminate_on_signal)
                if not direct_io:
                    nursery.start_soon(_raise_readahead, operations, mountpoint)
                mounted(mountpoint, fsname)
                await pyfuse3.main()
                nursery.cancel_scope.cancel()
        finally:
            # Unmount whatever happened above (a signal, an error, an outside unmount).
            pyfuse3.close(unmount=True)
            log.info("unmounted %s", mountpoint)
    finally:
        await source.aclose()


async def _raise_readahead(operations: KvstoreOperations, mountpoint: str) -> None:
    """Let page-cache reads reach the mount in 1 MiB requests instead of 128 KiB.

    The kernel caps a FUSE mount's readahead at 128 KiB and a daemon can only lower it
    in its INIT reply; the mount's own backing device in sysfs can raise it (root only;
    the setting goes away with the mount), once that reply has been processed. Cold
    reads of big objects run about twice as fast (docs/fuse.md). Where it is not
    allowed, reads work the same, only slower.
    """
    await operations.initialized.wait()
    device = _mount_device(mountpoint)
    if device is None or not device.startswith("0:"):
        return
    try:
        with open(f"/sys/class/bdi/{device}/read_ahead_kb", "w") as setting:
            setting.write(str(READAHEAD_KIB))
        log.debug("readahead of %s (bdi %s) raised to %d KiB", mountpoint, device,
                  READAHEAD_KIB)
    except OSError as exc:
        log.debug("readahead stays at the kernel's default (%s)", exc)


def _mount_device(mountpoint: str) -> str | None:
    """The device number ("0:42") of our mount on ``mountpoint``, from mountinfo (which,
    unlike stat, does not ask the file system we are about to serve)."""
    device = None
    with open("/proc/self/mountinfo") as mounts:
        for line in mounts:
            fields = line.split()
            fstype = fields[fields.index("-") + 1]
            # Mount points are octal-escaped there (a space is \040).
            point = fields[4].encode().decode("unicode_escape").encode("latin-1").decode()
            if fstype == "fuse.kvstored" and point == mountpoint:
                device = fields[2]  # the last match is the one on top
    return device


async def _terminate_on_signal() -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            log.info("received %s: unmounting", signal.Signals(signum).name)
            pyfuse3.terminate()
            return
