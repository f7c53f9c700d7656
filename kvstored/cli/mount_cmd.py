"""``kvstore mount``: the read-only FUSE view of a cluster or of a backend directory."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import click

from kvstored.cli.exitcodes import ExitCode
from kvstored.cli.store_cmds import master_options, offline_error_code


def _fail(message: str, code: int) -> None:
    click.echo(f"kvstore mount: {message}", err=True)
    sys.exit(code)


@click.command()
@click.argument("mountpoint", type=click.Path(file_okay=False))
@click.option("--offline", "offline_dir", type=click.Path(file_okay=False),
              help="Show this backend directory (a stopped node's <data>/ssd), without a "
                   "daemon; it is opened read-only and nothing in it is changed.")
@click.option("--backend", default=None,
              help="With --offline: the directory's backend (default: read from its stamp).")
@click.option("--foreground/--background", default=True, show_default=True,
              help="Serve in this process until unmounted, or fork and return once mounted.")
@click.option("--direct-io/--page-cache", default=True, show_default=True,
              help="Serve object reads uncached, each read() one request (fastest for big "
                   "reads), or through the page cache (for mmap and many small reads).")
@click.option("-v", "--verbose", is_flag=True, help="Log debugging detail too.")
@master_options
def mount(mountpoint: str, offline_dir: str | None, backend: str | None, foreground: bool,
          direct_io: bool, verbose: bool, master: str, token_file: str | None) -> None:
    """Mount a read-only view of the store on MOUNTPOINT (an empty directory).

    \b
    Live (the cluster at --master):
      MOUNTPOINT/keys/<name>                     every object; reading gives its bytes
      MOUNTPOINT/nodes/<node>/<dram|ssd>/<name>  objects by node and tier
      MOUNTPOINT/stats/cluster.json, stats/nodes/<node>.json
    Offline (--offline DIR, a stopped node's <data>/ssd, opened read-only):
      MOUNTPOINT/keys/<name>, MOUNTPOINT/stats/backend.json
    \b
    Names encode keys reversibly (docs/fuse.md); `getfattr -d` shows an object's key,
    tier, size, checksum, replicas and location. Unmount with `fusermount3 -u MOUNTPOINT`
    (or Ctrl-C in the foreground). Every write gets EROFS.
    """
    from kvstored.capabilities import probe_fuse

    available, reason = probe_fuse()
    if not available:
        _fail(f"FUSE is unavailable: {reason}", ExitCode.UNAVAILABLE)
    if backend and not offline_dir:
        raise click.UsageError("--backend only applies with --offline DIR")
    target = Path(mountpoint)
    if not target.is_dir():
        _fail(f"{mountpoint} is not a directory; create it first (mkdir -p {mountpoint})",
              ExitCode.USAGE)
    if os.path.ismount(target):
        _fail(f"something is already mounted on {mountpoint}; unmount it first "
              f"(fusermount3 -u {mountpoint})", ExitCode.USAGE)
    logging.basicConfig(format="kvstore mount: %(levelname)s: %(message)s",
                        level=logging.DEBUG if verbose else logging.INFO, stream=sys.stderr)
    logging.getLogger("kvstored").setLevel(logging.DEBUG if verbose else logging.INFO)

    from kvstored.fuse.mount import MountError
    from kvstored.fuse.mount import mount as run_mount

    if offline_dir:
        from kvstored.backends.offline import identify
        from kvstored.fuse.offline import OfflineSource
        from kvstored.sdk import BackendError

        directory = os.path.abspath(offline_dir)
        try:
            name = identify(directory, backend)  # fail before mounting, with its exit code
        except BackendError as exc:
            _fail(str(exc), offline_error_code(exc))

        def open_source():
            try:
                return OfflineSource.open(directory, name)
            except BackendError as exc:
                raise MountError(str(exc), offline_error_code(exc)) from None

        fsname = f"kvstored-offline:{directory}"
    else:
        from kvstored.fuse.live import LiveSource

        token = Path(token_file).read_text().strip() if token_file else None

        def open_source():
            return LiveSource.connect(master, token=token)

        fsname = f"kvstored:{master}"
    try:
        run_mount(open_source, os.path.abspath(mountpoint), fsname=fsname,
                  foreground=foreground, direct_io=direct_io)
    except MountError as exc:
        _fail(str(exc), exc.code)
