"""The life of a mount: mount ``ro``, serve in one trio nursery, unmount on the way out.

The mount ends when it is unmounted from outside (``fusermount3 -u MOUNTPOINT``), on
SIGINT or SIGTERM, or on an error; in every case the file system is unmounted and the
source (connection or backend) closed before the process exits. In the background the
process forks first (before any thread or connection exists), and the parent returns
only once the child has mounted, or reports the child's error.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import sys
from collections.abc import Callable

import pyfuse3
import trio

from kvstored.cli.exitcodes import ExitCode
from kvstored.errors import StoreError
from kvstored.fuse.ops import KvstoreOperations
from kvstored.fuse.sources import Source
from kvstored.fuse.tree import Tree
from kvstored.sdk.errors import BackendError, InvalidRequestError

log = logging.getLogger("kvstored.fuse")

#: The readahead a page-cache mount asks for (see _raise_readahead).
READAHEAD_KIB = 1024


class MountError(Exception):
    """The mount could not start; ``code`` is the exit code to end with."""

    def __init__(self, message: str, code: int = ExitCode.FAILURE) -> None:
        super().__init__(message)
        self.code = int(code)


def mount(open_source: Callable[[], Source], mountpoint: str, *, fsname: str,
          foreground: bool = True, direct_io: bool = True) -> None:
    """Mount what ``open_source()`` returns at ``mountpoint``, read-only.

    In the foreground, serve until unmounted or signalled. In the background, return
    once a child process has mounted. Raises :class:`MountError` if it cannot start.
    """
    serve = functools.partial(_serve_opened, open_source, mountpoint, fsname,
                              direct_io=direct_io)
    if foreground:
        serve(_announce)
    else:
        _mount_in_background(serve)


def _announce(mountpoint: str, fsname: str) -> None:
    print(f"kvstore mount: {fsname} mounted read-only on {mountpoint}; unmount with "
          f"`fusermount3 -u {mountpoint}` or Ctrl-C", file=sys.stderr, flush=True)


def _serve_opened(open_source: Callable[[], Source], mountpoint: str, fsname: str,
                  mounted: Callable[[str, str], None], *, direct_io: bool) -> None:
    try:
        source = open_source()
    except StoreError as exc:
        raise MountError(str(exc), exc.exit_code) from None
    except InvalidRequestError as exc:
        raise MountError(str(exc), ExitCode.USAGE) from None
    except BackendError as exc:
        raise MountError(str(exc)) from None
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


def _mount_in_background(serve: Callable[[Callable[[str, str], None]], None]) -> None:
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid:
        os.close(write_end)
        with os.fdopen(read_end, "rb") as status:
            report = status.read().decode("utf-8", "replace")
        code, _, message = report.partition("\t")
        if not code:
            raise MountError(f"the background mount process ({pid}) died before mounting")
        if int(code) != ExitCode.OK:
            raise MountError(message, int(code))
        print(message, file=sys.stderr, flush=True)
        return
    # The child: its own session, so the terminal's hangup does not unmount it.
    os.close(read_end)
    os.setsid()

    status_fd: list[int] = [write_end]  # emptied once the parent has its answer

    def mounted(mountpoint: str, fsname: str) -> None:
        _report(status_fd, f"0\t{fsname} mounted read-only on {mountpoint} by process "
                           f"{os.getpid()}; unmount with `fusermount3 -u {mountpoint}`")
        _detach_stdio()

    code = ExitCode.OK
    try:
        serve(mounted)
    except MountError as exc:
        code = exc.code
        _report(status_fd, f"{exc.code}\t{exc}")
    except BaseException as exc:
        code = ExitCode.FAILURE
        _report(status_fd, f"{ExitCode.FAILURE}\t{type(exc).__name__}: {exc}")
        log.exception("the mount failed")
    finally:
        os._exit(code)


def _report(status_fd: list[int], message: str) -> None:
    """Tell the waiting parent how the mount went (once; later news goes to the log)."""
    if status_fd:
        fd = status_fd.pop()
        os.write(fd, message.encode())
        os.close(fd)


def _detach_stdio() -> None:
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
